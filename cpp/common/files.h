// File-descriptor helpers: OFD byte-range locks (owned by the open file
// description, released by the kernel when the holder dies) and an RAII fd.
#pragma once

#include <sys/types.h>

#include <cstdint>
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
// Blocking (retries on EINTR). Only for locks no other process may hold for
// long; waits on locks a peer may hold use ofd_lock_bounded.
void ofd_lock(int fd, off_t byte, bool exclusive);
// Waits for the lock at most the lock patience (lock_patience_ns()), polling
// with growing sleeps (20 us to 5 ms: a lock held for microseconds costs
// about that much, and nothing spins). Between sleeps it runs the interrupt
// check if `interruptible` (Python bindings: a signal handler's exception,
// e.g. KeyboardInterrupt, propagates from there). Runs out with kTimeout:
// "<what>: waited N s for the lock ... held by pid P (comm)".
void ofd_lock_bounded(int fd, off_t byte, bool exclusive, const std::string& what, bool interruptible = true);
// As ofd_lock_bounded, but gives up at `deadline_ns` (monotonic) and returns false.
bool ofd_lock_until(int fd, off_t byte, bool exclusive, int64_t deadline_ns, bool interruptible);
// The kTimeout of a bounded wait that lasted `patience_ns` (ofd_lock_bounded's message).
[[noreturn]] void fail_lock_timeout(int fd, off_t byte, const std::string& what, int64_t patience_ns);
// How long a bounded lock wait lasts: MSGQ_LOCK_TIMEOUT_S seconds (default 10;
// a malformed value is kInvalidArgument).
int64_t lock_patience_ns();
// "pid 123 (python3), pid 456 (x)": the processes holding a lock on `byte` of
// fd's file (another description than fd), found through /proc/*/fdinfo (OFD
// locks do not record a pid); "an unknown process" if none is visible.
std::string lock_holders(int fd, off_t byte);

// The check a bounded wait runs between its sleeps: may throw to end the
// wait (a pending Python signal). Each native module installs its own; the
// default does nothing. It runs only on the thread that waits.
using InterruptCheck = void (*)();
void set_interrupt_check(InterruptCheck check);
void check_interrupt();
void ofd_unlock(int fd, off_t byte);
// True if another open file description holds a conflicting lock.
bool ofd_is_locked(int fd, off_t byte, bool exclusive);

}  // namespace vipc::common
