#include "common/shm_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <utility>

#include "common/clock.h"
#include "common/errors.h"

namespace vipc::common {

namespace {
constexpr int kOpenAttempts = 100;
}

void check_basename(const std::string& basename, size_t capacity) {
  if (basename.empty() || basename.size() >= capacity || basename.find('/') != std::string::npos || basename == "." ||
      basename == ".." || basename.find('\0') != std::string::npos) {
    fail(ErrorKind::kInvalidArgument, "invalid segment name '" + basename + "'");
  }
}

ShmFile ShmFile::open_locked(const std::string& dir, const std::string& basename, mode_t mode,
                             const std::vector<uid_t>& trusted_uids) {
  const std::string path = dir + "/" + basename;
  for (int attempt = 0; attempt < kOpenAttempts; attempt++) {
    ShmFile f;
    f.path_ = path;
    f.fd_.reset(open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, mode));
    if (!f.fd_) {
      if (errno == ELOOP) fail(ErrorKind::kPermission, path + " is a symbolic link: refusing it");
      struct stat other{};
      if (errno == EACCES && lstat(path.c_str(), &other) == 0) {
        char mode_text[8];
        std::snprintf(mode_text, sizeof(mode_text), "%03o", static_cast<unsigned>(other.st_mode & 0777));
        fail(ErrorKind::kPermission,
             path + " belongs to uid " + std::to_string(other.st_uid) + " with mode " + mode_text +
                 ", and this process (uid " + std::to_string(geteuid()) +
                 ") may not open it. To share topics "
                 "between users, run them with MSGQ_SHM_MODE=660 and MSGQ_SHM_DIR set to a setgid directory of a "
                 "common group, and MSGQ_TRUSTED_UIDS listing each other's uids");
      }
      fail_errno("cannot open shared-memory segment " + path);
    }
    ofd_lock_bounded(f.fd(), kLockInit, true, "attaching " + path);
    f.participant_ = true;
    struct stat st{};
    if (fstat(f.fd(), &st) != 0) fail_errno("fstat " + path);
    f.dev_ = st.st_dev;
    f.ino_ = st.st_ino;
    if (!f.still_linked()) {  // unlinked by a detaching peer after we opened it: try again
      f.fd_.reset();
      continue;
    }
    if (!S_ISREG(st.st_mode)) {
      f.fd_.reset();
      fail(ErrorKind::kPermission, path + " is not a regular file: refusing it");
    }
    const bool trusted = std::find(trusted_uids.begin(), trusted_uids.end(), st.st_uid) != trusted_uids.end();
    if (st.st_uid != geteuid() && !trusted) {
      f.fd_.reset();
      fail(ErrorKind::kPermission, path + " belongs to uid " + std::to_string(st.st_uid) + ", not to us (uid " +
                                       std::to_string(geteuid()) +
                                       "): another user owns this name, or is squatting it (list the uid in "
                                       "MSGQ_TRUSTED_UIDS if you share topics with that user on purpose)");
    }
    if (st.st_mode & S_IWOTH) {
      f.fd_.reset();
      fail(ErrorKind::kPermission, path + " is world-writable: refusing it");
    }
    f.size_at_open_ = static_cast<size_t>(st.st_size);
    f.alone_ = ofd_try_lock(f.fd(), kLockPresence, true);
    if (f.alone_) ofd_unlock(f.fd(), kLockPresence);
    return f;
  }
  fail(ErrorKind::kIpc, "could not attach " + path + ": it kept being replaced while we opened it");
}

ShmFile ShmFile::adopt(int fd, const std::string& path) {
  ShmFile f;
  f.path_ = path;
  f.fd_.reset(fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!f.fd_) fail_errno("dup of the descriptor passed for " + path);
  ofd_lock_bounded(f.fd(), kLockInit, true, "attaching " + path);
  f.participant_ = true;
  struct stat st{};
  if (fstat(f.fd(), &st) != 0) fail_errno("fstat " + path);
  if (!S_ISREG(st.st_mode)) fail(ErrorKind::kPermission, path + ": the descriptor passed is not a regular file");
  f.dev_ = st.st_dev;
  f.ino_ = st.st_ino;
  f.size_at_open_ = static_cast<size_t>(st.st_size);
  f.ours_ = st.st_uid == geteuid() && f.still_linked();
  return f;
}

ShmFile::ShmFile(ShmFile&& o) noexcept { *this = std::move(o); }

ShmFile& ShmFile::operator=(ShmFile&& o) noexcept {
  if (this != &o) {
    detach();
    fd_ = std::move(o.fd_);
    path_ = std::move(o.path_);
    dev_ = o.dev_;
    ino_ = o.ino_;
    size_at_open_ = o.size_at_open_;
    alone_ = o.alone_;
    data_ = std::exchange(o.data_, nullptr);
    mapped_ = std::exchange(o.mapped_, 0);
    ours_ = o.ours_;
    participant_ = std::exchange(o.participant_, false);
  }
  return *this;
}

ShmFile::~ShmFile() { detach(); }

void ShmFile::detach() {
  unmap();
  if (!fd_) return;
  if (!ours_ || !participant_) {  // adopted from another user: closing drops our locks, the owner unlinks;
                                  // or never locked (a failed attach): nothing of ours to undo
    fd_.reset();
    return;
  }
  const int fd = fd_.get();
  try {
    // Not interruptible (a destructor must not throw); a peer that keeps the
    // lock past the patience only costs us the unlink.
    if (ofd_lock_until(fd, kLockInit, true, monotonic_ns() + lock_patience_ns(), false)) {
      ofd_unlock(fd, kLockPresence);
      if (ofd_try_lock(fd, kLockPresence, true) && still_linked()) unlink(path_.c_str());
    }
  } catch (const Error&) {
    // Detaching must not throw; the file is left for remove_stale_files().
  }
  fd_.reset();  // closing the description drops every lock we held on it
}

void ShmFile::unmap() {
  if (data_ != nullptr) munmap(data_, mapped_);
  data_ = nullptr;
  mapped_ = 0;
}

void ShmFile::forget() {
  unmap();
  participant_ = false;
  fd_.reset();  // the parent's descriptor keeps the shared open file (and its locks) alive
}

bool ShmFile::still_linked() const {
  struct stat st{};
  if (stat(path_.c_str(), &st) != 0) return false;
  return st.st_dev == dev_ && st.st_ino == ino_;
}

void ShmFile::rename_to(const std::string& path) {
  if (rename(path_.c_str(), path.c_str()) != 0) fail_errno("rename " + path_ + " to " + path);
  path_ = path;
}

void ShmFile::unlink_name() {
  if (still_linked()) unlink(path_.c_str());
}

void ShmFile::map(size_t size) {
  unmap();
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
  if (p == MAP_FAILED) {
    if (errno == ENOMEM) {  // address space or memory, not shm space: say so
      fail(ErrorKind::kNoSpace, "cannot map " + std::to_string(size) + " bytes of " + path_ +
                                    ": out of memory or address space (this process's limit, ulimit -v / "
                                    "RLIMIT_AS, or the system's memory): raise the limit or use a smaller size");
    }
    fail_errno("mmap " + path_);
  }
  data_ = static_cast<uint8_t*>(p);
  mapped_ = size;
}

void ShmFile::allocate(size_t size, mode_t mode, const char* size_name) {
  const int fd = fd_.get();
  unmap();
  if (ftruncate(fd, 0) != 0) fail_errno("ftruncate " + path_);
  if (fchmod(fd, mode) != 0) fail_errno("fchmod " + path_);
  if (const int err = posix_fallocate(fd, 0, static_cast<off_t>(size)); err != 0) {
    if (ftruncate(fd, 0) != 0) {
      // best effort: the file stays empty either way
    }
    if (err == ENOSPC) {
      const size_t slash = path_.rfind('/');
      fail(ErrorKind::kNoSpace, "not enough space in " + path_.substr(0, slash) + " for " + path_.substr(slash + 1) +
                                    " (" + std::to_string(size) + " bytes): free some, use a smaller " + size_name +
                                    ", or give the container more shared memory (docker --shm-size)");
    }
    fail_errno("posix_fallocate " + path_, err);
  }
  map(size);
}

void ShmFile::finish_attach() {
  ofd_lock_bounded(fd_.get(), kLockPresence, false, "attaching " + path_);
  ofd_unlock(fd_.get(), kLockInit);
}

std::vector<std::string> remove_stale_files(const std::string& dir, const std::string& name_prefix) {
  std::vector<std::string> removed;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return removed;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.compare(0, name_prefix.size(), name_prefix) != 0) continue;
    if (stale_file(dir, name, true)) removed.push_back(name);
  }
  closedir(d);
  return removed;
}

bool stale_file(const std::string& dir, const std::string& name, bool remove) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") return false;
  const std::string path = dir + "/" + name;
  UniqueFd fd(open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (!fd) return false;
  struct stat st{}, now{};
  if (fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) return false;
  if (!ofd_try_lock(fd.get(), kLockInit, true)) return false;  // someone is attaching right now
  if (stat(path.c_str(), &now) != 0 || now.st_ino != st.st_ino || now.st_dev != st.st_dev) return false;
  if (!ofd_try_lock(fd.get(), kLockPresence, true)) return false;  // a live process is attached
  if (remove) unlink(path.c_str());
  return true;  // closing fd releases both locks (OFD locks belong to the open file)
}

UniqueFd open_fifo(const std::string& path, int flags) {
  UniqueFd fd(open(path.c_str(), flags | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) {
    if (errno == ENOENT || (errno == ENXIO && (flags & O_ACCMODE) == O_WRONLY)) return fd;
    if (errno == ELOOP) fail(ErrorKind::kPermission, path + " is a symbolic link: refusing it");
    fail_errno("cannot open FIFO " + path);
  }
  struct stat st{};
  if (fstat(fd.get(), &st) != 0) fail_errno("fstat " + path);
  if (!S_ISFIFO(st.st_mode)) fail(ErrorKind::kPermission, path + " is not a FIFO: refusing it");
  if (st.st_uid != geteuid()) {
    fail(ErrorKind::kPermission, path + " belongs to uid " + std::to_string(st.st_uid) + ", not to us (uid " +
                                     std::to_string(geteuid()) + "): refusing it");
  }
  return fd;
}

}  // namespace vipc::common
