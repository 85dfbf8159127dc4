#include "msgq/segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "common/clock.h"
#include "common/errors.h"
#include "common/futex.h"

namespace msgq {

using ipc::ErrorKind;
using ipc::fail;
using ipc::fail_errno;

void check_basename(const std::string& basename) {
  if (basename.empty() || basename.size() >= kNameCapacity || basename.find('/') != std::string::npos ||
      basename == "." || basename == ".." || basename.find('\0') != std::string::npos) {
    fail(ErrorKind::kInvalidArgument, "invalid segment name '" + basename + "'");
  }
}

namespace {

constexpr int kAttachAttempts = 100;

size_t round_data_size(size_t requested) {
  const size_t n = requested == 0 ? kDefaultDataSize : requested;
  if (n < kMinDataSize || n > kMaxDataSize) {
    fail(ErrorKind::kInvalidArgument, "segment_size must be between " + std::to_string(kMinDataSize) + " and " +
                                          std::to_string(kMaxDataSize) + " bytes, got " + std::to_string(n));
  }
  return (n + kCacheLine - 1) & ~(kCacheLine - 1);
}

}  // namespace

std::shared_ptr<Segment> Segment::attach(const SegmentSpec& spec) {
  check_basename(spec.basename);
  const std::string path = spec.dir + "/" + spec.basename;
  const size_t wanted = spec.data_size == 0 ? 0 : round_data_size(spec.data_size);

  for (int attempt = 0; attempt < kAttachAttempts; attempt++) {
    std::shared_ptr<Segment> seg(new Segment());
    seg->path_ = path;
    seg->fd_.reset(open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, spec.mode));
    if (!seg->fd_) {
      if (errno == ELOOP) fail(ErrorKind::kPermission, path + " is a symbolic link: refusing it");
      struct stat other {};
      if (errno == EACCES && lstat(path.c_str(), &other) == 0) {
        char mode[8];
        std::snprintf(mode, sizeof(mode), "%03o", static_cast<unsigned>(other.st_mode & 0777));
        fail(ErrorKind::kPermission,
             path + " belongs to uid " + std::to_string(other.st_uid) + " with mode " + mode +
                 ", and this process (uid " + std::to_string(geteuid()) + ") may not open it. To share topics "
                 "between users, run them with MSGQ_SHM_MODE=660 and MSGQ_SHM_DIR set to a setgid directory of a "
                 "common group, and MSGQ_TRUSTED_UIDS listing each other's uids");
      }
      fail_errno("cannot open shared-memory segment " + path);
    }
    const int fd = seg->fd();
    ipc::ofd_lock(fd, kLockInit, true);

    struct stat st {};
    if (fstat(fd, &st) != 0) fail_errno("fstat " + path);
    seg->dev_ = st.st_dev;
    seg->ino_ = st.st_ino;
    if (!seg->still_linked()) continue;  // unlinked by a detaching peer after we opened it: retry
    if (!S_ISREG(st.st_mode)) fail(ErrorKind::kPermission, path + " is not a regular file: refusing it");
    const bool trusted = std::find(spec.trusted_uids.begin(), spec.trusted_uids.end(), st.st_uid) != spec.trusted_uids.end();
    if (st.st_uid != geteuid() && !trusted) {
      fail(ErrorKind::kPermission, path + " belongs to uid " + std::to_string(st.st_uid) +
                                       ", not to us (uid " + std::to_string(geteuid()) +
                                       "): another user owns this topic name, or is squatting it (list the uid in "
                                       "MSGQ_TRUSTED_UIDS if you share topics with that user on purpose)");
    }
    if (st.st_mode & S_IWOTH) fail(ErrorKind::kPermission, path + " is world-writable: refusing it");
    seg->ours_ = true;

    const bool nobody_else = ipc::ofd_try_lock(fd, kLockPresence, true);
    if (nobody_else) ipc::ofd_unlock(fd, kLockPresence);

    if (st.st_size == 0) {
      seg->initialize(spec, wanted == 0 ? round_data_size(0) : wanted);
    } else {
      if (static_cast<size_t>(st.st_size) < kHeaderSize + kMinDataSize) {
        if (!nobody_else) fail(ErrorKind::kSegment, path + " is too small to be a msgq segment");
        seg->initialize(spec, wanted == 0 ? round_data_size(0) : wanted);
      } else {
        seg->map(static_cast<size_t>(st.st_size));
        const std::string problem = seg->adopt_header(static_cast<size_t>(st.st_size));
        if (!problem.empty()) {
          if (!nobody_else) {
            fail(ErrorKind::kSegment, path + ": " + problem +
                                          ". A process using it is still alive: stop it, or pick another name.");
          }
          seg->initialize(spec, wanted == 0 ? round_data_size(0) : wanted);  // stale leftover: start over
        } else if (wanted != 0 && spec.size_is_binding && seg->data_size_ != wanted) {
          seg->supersede();
          unlink(path.c_str());
          continue;  // the next attempt creates the segment at the size the publisher asked for
        }
      }
    }
    ipc::ofd_lock(fd, kLockPresence, false);
    ipc::ofd_unlock(fd, kLockInit);
    return seg;
  }
  fail(ErrorKind::kIpc, "could not attach " + path + ": it kept being replaced while we opened it");
}

std::shared_ptr<Segment> Segment::adopt(int fd_in, const SegmentSpec& spec) {
  check_basename(spec.basename);
  std::shared_ptr<Segment> seg(new Segment());
  seg->path_ = spec.dir + "/" + spec.basename;
  seg->fd_.reset(fcntl(fd_in, F_DUPFD_CLOEXEC, 0));
  if (!seg->fd_) fail_errno("dup of the segment descriptor for " + seg->path_);
  const int fd = seg->fd();
  ipc::ofd_lock(fd, kLockInit, true);
  struct stat st {};
  if (fstat(fd, &st) != 0) fail_errno("fstat " + seg->path_);
  if (!S_ISREG(st.st_mode)) fail(ErrorKind::kPermission, seg->path_ + ": the descriptor passed is not a regular file");
  if (static_cast<size_t>(st.st_size) < kHeaderSize + kMinDataSize) {
    fail(ErrorKind::kSegment, seg->path_ + ": the descriptor passed is too small to be a msgq segment");
  }
  seg->dev_ = st.st_dev;
  seg->ino_ = st.st_ino;
  // Our own file at its usual path: detach like attach() does (the last one out unlinks it).
  seg->ours_ = st.st_uid == geteuid() && seg->still_linked();
  seg->map(static_cast<size_t>(st.st_size));
  if (const std::string problem = seg->adopt_header(static_cast<size_t>(st.st_size)); !problem.empty()) {
    fail(ErrorKind::kSegment, seg->path_ + " (passed by descriptor): " + problem);
  }
  ipc::ofd_lock(fd, kLockPresence, false);
  ipc::ofd_unlock(fd, kLockInit);
  return seg;  // not ours_: the destructor only unmaps and closes (which drops our locks)
}

Segment::~Segment() {
  if (header_ != nullptr) munmap(header_, map_length_);
  if (!fd_ || !ours_) return;
  const int fd = fd_.get();
  try {
    ipc::ofd_lock(fd, kLockInit, true);
    ipc::ofd_unlock(fd, kLockPresence);
    if (ipc::ofd_try_lock(fd, kLockPresence, true) && still_linked()) unlink(path_.c_str());
  } catch (const ipc::Error&) {
    // Detaching must not throw; the file is left for remove_stale_segments().
  }
}

void Segment::forget_after_fork() {
  if (header_ != nullptr) munmap(header_, map_length_);
  header_ = nullptr;
  fd_.reset();  // the parent's descriptor keeps the shared open file (and its locks) alive
}

bool Segment::still_linked() const {
  struct stat st {};
  if (stat(path_.c_str(), &st) != 0) return false;
  return st.st_dev == dev_ && st.st_ino == ino_;
}

void Segment::map(size_t length) {
  if (header_ != nullptr) munmap(header_, map_length_);
  void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
  if (p == MAP_FAILED) fail_errno("mmap " + path_);
  header_ = static_cast<SegmentHeader*>(p);
  map_length_ = length;
}

void Segment::initialize(const SegmentSpec& spec, size_t data_size) {
  const int fd = fd_.get();
  const size_t total = kHeaderSize + data_size;
  if (ftruncate(fd, 0) != 0) fail_errno("ftruncate " + path_);
  if (fchmod(fd, spec.mode) != 0) fail_errno("fchmod " + path_);
  // Reserve every page now: on a full /dev/shm this fails cleanly here instead
  // of killing a process with SIGBUS at its first write.
  if (const int err = posix_fallocate(fd, 0, static_cast<off_t>(total)); err != 0) {
    ftruncate(fd, 0);
    if (err == ENOSPC) {
      fail(ErrorKind::kNoSpace, "not enough space in " + spec.dir + " for " + spec.basename + " (" +
                                    std::to_string(total) + " bytes): free some, use a smaller segment_size, " +
                                    "or give the container more shared memory (docker --shm-size)");
    }
    fail_errno("posix_fallocate " + path_, err);
  }
  map(total);
  std::memset(static_cast<void*>(header_), 0, kHeaderSize);
  SegmentHeader& h = *header_;
  h.layout_version = kLayoutVersion;
  h.header_size = kHeaderSize;
  h.data_size = data_size;
  h.max_readers = kMaxReaders;
  h.creator_uid = geteuid();
  h.created_ns = static_cast<uint64_t>(ipc::realtime_ns());
  std::strncpy(h.name, spec.basename.c_str(), kNameCapacity - 1);
  h.state.store(kStateReady, std::memory_order_relaxed);
  // Published to attachers by the init lock; magic last so a crash before
  // this line leaves a file the next attacher recognises as unfinished.
  std::atomic_ref<uint64_t>(h.magic).store(kMagic, std::memory_order_release);
  data_size_ = static_cast<uint32_t>(data_size);
}

std::string header_problem(const SegmentHeader& h, size_t file_size) {
  if (h.magic != kMagic) return "not a msgq segment (no magic number: unfinished, or another program's file)";
  if (h.layout_version != kLayoutVersion) {
    return "created by an incompatible msgq layout version " + std::to_string(h.layout_version) +
           " (this library speaks version " + std::to_string(kLayoutVersion) + ")";
  }
  if (h.header_size != kHeaderSize || h.max_readers != kMaxReaders || h.data_size < kMinDataSize ||
      h.data_size > kMaxDataSize || h.data_size % kCacheLine != 0 || kHeaderSize + h.data_size != file_size) {
    return "corrupt header (sizes do not match the file)";
  }
  return {};
}

std::string Segment::adopt_header(size_t file_size) {
  std::string problem = header_problem(*header_, file_size);
  if (problem.empty()) data_size_ = static_cast<uint32_t>(header_->data_size);
  return problem;
}

// A publisher wants another ring size: retire this segment. Its old publisher
// fails on its next send, and its readers reattach by name after draining it.
void Segment::supersede() {
  SegmentHeader& h = *header_;
  constexpr uint64_t kRetiredToken = 1 << 1;  // token 1 is never handed to a publisher
  uint64_t cur = h.publisher.load(std::memory_order_acquire);
  const int64_t give_up = ipc::monotonic_ns() + 2'000'000'000;
  for (;;) {
    const bool owner_alive = ipc::ofd_is_locked(fd_.get(), publisher_liveness_byte(cur >> 1), true);
    if ((cur & 1) != 0 && owner_alive && ipc::monotonic_ns() < give_up) {  // a send is in flight: let it finish
      usleep(100);
      cur = h.publisher.load(std::memory_order_acquire);
      continue;
    }
    if (h.publisher.compare_exchange_weak(cur, kRetiredToken, std::memory_order_acq_rel)) break;
  }
  h.state.store(kStateSuperseded, std::memory_order_release);
  h.futex_seq.fetch_add(1, std::memory_order_release);
  ipc::futex_wake(&h.futex_seq, INT32_MAX);
}

std::vector<std::string> remove_stale_segments(const std::string& dir, const std::string& name_prefix) {
  std::vector<std::string> removed;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return removed;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.compare(0, name_prefix.size(), name_prefix) != 0) continue;
    const std::string path = dir + "/" + name;
    ipc::UniqueFd fd(open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
    if (!fd) continue;
    struct stat st {}, now {};
    if (fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) continue;
    if (!ipc::ofd_try_lock(fd.get(), kLockInit, true)) continue;  // someone is attaching right now
    if (stat(path.c_str(), &now) != 0 || now.st_ino != st.st_ino || now.st_dev != st.st_dev) continue;
    if (ipc::ofd_try_lock(fd.get(), kLockPresence, true)) {
      unlink(path.c_str());
      removed.push_back(name);
    }
  }
  closedir(d);
  return removed;
}

}  // namespace msgq
