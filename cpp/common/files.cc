#include "common/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "common/clock.h"

#include "common/errors.h"

namespace vipc::common {

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

UniqueFd::~UniqueFd() { reset(); }

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

namespace {

struct flock byte_lock(off_t byte, short type) {
  struct flock fl{};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = byte;
  fl.l_len = 1;
  fl.l_pid = 0;  // required for OFD locks
  return fl;
}

}  // namespace

bool ofd_try_lock(int fd, off_t byte, bool exclusive) {
  struct flock fl = byte_lock(byte, exclusive ? F_WRLCK : F_RDLCK);
  for (;;) {
    if (fcntl(fd, F_OFD_SETLK, &fl) == 0) return true;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EACCES) return false;
    fail_errno("fcntl(F_OFD_SETLK)");
  }
}

void ofd_lock(int fd, off_t byte, bool exclusive) {
  struct flock fl = byte_lock(byte, exclusive ? F_WRLCK : F_RDLCK);
  while (fcntl(fd, F_OFD_SETLKW, &fl) != 0) {
    if (errno != EINTR) fail_errno("fcntl(F_OFD_SETLKW)");
  }
}

void ofd_unlock(int fd, off_t byte) {
  struct flock fl = byte_lock(byte, F_UNLCK);
  fcntl(fd, F_OFD_SETLK, &fl);
}

namespace {

constexpr int64_t kDefaultLockPatienceNs = 10'000'000'000;
constexpr int64_t kFirstSleepNs = 20'000;
constexpr int64_t kLongestSleepNs = 5'000'000;

std::atomic<InterruptCheck> interrupt_check{nullptr};

// True if a "lock:" line of /proc/PID/fdinfo/FD describes a lock covering
// `byte` of the file `dev_ino` ("MAJ:MIN:INO", as the kernel prints it).
bool line_covers(const std::string& line, const std::string& dev_ino, off_t byte) {
  std::istringstream in(line);
  std::string word;
  std::vector<std::string> w;
  while (in >> word) w.push_back(word);
  // ... OFDLCK|POSIX|FLOCK ADVISORY WRITE|READ PID MAJ:MIN:INO START END
  for (size_t i = 0; i + 2 < w.size(); i++) {
    if (w[i] != dev_ino) continue;
    const long long start = std::atoll(w[i + 1].c_str());
    const bool to_eof = w[i + 2] == "EOF";
    const long long end = to_eof ? INT64_MAX : std::atoll(w[i + 2].c_str());
    return byte >= start && byte <= end;
  }
  return false;
}

std::string comm_of(const std::string& pid) {
  std::ifstream f("/proc/" + pid + "/comm");
  std::string name;
  std::getline(f, name);
  return name;
}

}  // namespace

int64_t lock_patience_ns() {
  const char* text = std::getenv("MSGQ_LOCK_TIMEOUT_S");
  if (text == nullptr || *text == '\0') return kDefaultLockPatienceNs;
  char* end = nullptr;
  const double s = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(s > 0) || s > 1e6) {
    fail(ErrorKind::kInvalidArgument,
         std::string("MSGQ_LOCK_TIMEOUT_S='") + text + "' must be a number of seconds above 0 (at most 1e6), e.g. 10");
  }
  return static_cast<int64_t>(s * 1e9);
}

void set_interrupt_check(InterruptCheck check) { interrupt_check.store(check, std::memory_order_relaxed); }

void check_interrupt() {
  if (InterruptCheck check = interrupt_check.load(std::memory_order_relaxed)) check();
}

bool ofd_lock_until(int fd, off_t byte, bool exclusive, int64_t deadline_ns, bool interruptible) {
  int64_t sleep_ns = kFirstSleepNs;
  for (;;) {
    if (ofd_try_lock(fd, byte, exclusive)) return true;
    const int64_t now = monotonic_ns();
    if (now >= deadline_ns) return false;
    if (interruptible) check_interrupt();
    const int64_t ns = std::min({sleep_ns, deadline_ns - now, kLongestSleepNs});
    const timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
    nanosleep(&ts, nullptr);  // a signal ends it early: the check above runs next
    sleep_ns = std::min(sleep_ns * 2, kLongestSleepNs);
  }
}

void ofd_lock_bounded(int fd, off_t byte, bool exclusive, const std::string& what, bool interruptible) {
  if (ofd_try_lock(fd, byte, exclusive)) return;  // the common case: no syscall beyond this one
  const int64_t patience = lock_patience_ns();
  if (ofd_lock_until(fd, byte, exclusive, monotonic_ns() + patience, interruptible)) return;
  fail_lock_timeout(fd, byte, what, patience);
}

void fail_lock_timeout(int fd, off_t byte, const std::string& what, int64_t patience) {
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%.3g", static_cast<double>(patience) / 1e9);
  fail(ErrorKind::kTimeout, what + ": waited " + seconds + " s for its lock (byte " + std::to_string(byte) +
                                ") held by " + lock_holders(fd, byte) +
                                ", which is stuck or hostile: stop that process (MSGQ_LOCK_TIMEOUT_S sets the wait)");
}

std::string lock_holders(int fd, off_t byte) {
  struct stat mine{};
  if (fstat(fd, &mine) != 0) return "an unknown process";
  char dev_ino[64];
  std::snprintf(dev_ino, sizeof(dev_ino), "%02x:%02x:%lu", major(mine.st_dev), minor(mine.st_dev),
                static_cast<unsigned long>(mine.st_ino));
  const std::string self = std::to_string(getpid());
  std::set<std::string> pids;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return "an unknown process";
  while (dirent* p = readdir(proc)) {
    const std::string pid = p->d_name;
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string fd_dir = "/proc/" + pid + "/fd";
    DIR* fds = opendir(fd_dir.c_str());
    if (fds == nullptr) continue;  // another user's process: not ours to see
    while (dirent* e = readdir(fds)) {
      if (e->d_name[0] == '.') continue;
      if (pid == self && std::atoi(e->d_name) == fd) continue;
      struct stat st{};
      if (stat((fd_dir + "/" + e->d_name).c_str(), &st) != 0 || st.st_dev != mine.st_dev || st.st_ino != mine.st_ino) {
        continue;
      }
      std::ifstream info("/proc/" + pid + "/fdinfo/" + e->d_name);
      for (std::string line; std::getline(info, line);) {
        if (line.rfind("lock:", 0) == 0 && line_covers(line, dev_ino, byte)) pids.insert(pid);
      }
    }
    closedir(fds);
  }
  closedir(proc);
  if (pids.empty()) return "an unknown process (another user's, or one that already let go)";
  std::string out;
  for (const std::string& pid : pids) out += (out.empty() ? "pid " : ", pid ") + pid + " (" + comm_of(pid) + ")";
  return out;
}

bool ofd_is_locked(int fd, off_t byte, bool exclusive) {
  struct flock fl = byte_lock(byte, exclusive ? F_WRLCK : F_RDLCK);
  if (fcntl(fd, F_OFD_GETLK, &fl) != 0) fail_errno("fcntl(F_OFD_GETLK)");
  return fl.l_type != F_UNLCK;
}

}  // namespace vipc::common
