// Lets close() on one thread wait for calls in flight on other threads (which
// run with the GIL released) instead of unmapping memory under them.
#pragma once

#include <unistd.h>

#include <atomic>

#include "common/errors.h"

namespace vipc::common {

class UseGate {
 public:
  // SYNC: enter() increments then reads closing_; begin_close() stores closing_
  // then reads the count (all seq_cst): either the caller sees the close and
  // backs out, or close() sees the caller and waits for it to leave.
  bool enter() {
    users_.fetch_add(1, std::memory_order_seq_cst);
    if (!closing_.load(std::memory_order_seq_cst)) return true;
    leave();
    return false;
  }
  void leave() { users_.fetch_sub(1, std::memory_order_release); }
  void begin_close() { closing_.store(true, std::memory_order_seq_cst); }
  bool closing() const { return closing_.load(std::memory_order_acquire); }
  bool idle() const { return users_.load(std::memory_order_seq_cst) == 0; }
  // After begin_close() (and waking any waiter): until every call has left.
  void wait_idle() const {
    while (!idle()) usleep(50);
  }
  // The same, calling wake() before each look: for calls that may be asleep
  // (or between their check and their sleep) on a futex only a wake-up ends.
  template <class Wake>
  void wait_idle(Wake&& wake) const {
    while (!idle()) {
      wake();
      usleep(50);
    }
  }

 private:
  std::atomic<int> users_{0};
  std::atomic<bool> closing_{false};
};

// enter() for a scope; ok() says whether it got in.
class UseGuard {
 public:
  explicit UseGuard(UseGate& gate) : gate_(gate), ok_(gate.enter()) {}
  ~UseGuard() {
    if (ok_) gate_.leave();
  }
  UseGuard(const UseGuard&) = delete;
  UseGuard& operator=(const UseGuard&) = delete;
  bool ok() const { return ok_; }

 private:
  UseGate& gate_;
  bool ok_;
};

// enter() for a scope, or throw kClosed saying `what` (a call that must not
// start once close() has begun: close() waits for the ones that did).
class UseOrClosed {
 public:
  UseOrClosed(UseGate& gate, const char* what) : gate_(gate) {
    if (!gate.enter()) fail(ErrorKind::kClosed, what);
  }
  ~UseOrClosed() { gate_.leave(); }
  UseOrClosed(const UseOrClosed&) = delete;
  UseOrClosed& operator=(const UseOrClosed&) = delete;

 private:
  UseGate& gate_;
};

}  // namespace vipc::common
