// File-descriptor helpers: OFD byte-range locks (owned by the open file
// description, released by the kernel when the holder dies) and an RAII fd.
#pragma once

#include <sys/types.h>

#include <string>

namespace vipc::common {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Non-blocking: true if the lock on [byte, byte+1) was taken.
bool ofd_try_lock(int fd, off_t byte, bool exclusive);
// Blocking (retries on EINTR).
void ofd_lock(int fd, off_t byte, bool exclusive);
void ofd_unlock(int fd, off_t byte);
// True if another open file description holds a conflicting lock.
bool ofd_is_locked(int fd, off_t byte, bool exclusive);

}  // namespace vipc::common
