// A place in shared memory where processes sleep until another process makes
// a condition true (a chunk written, a chunk consumed, a shutdown). One futex
// word: bit 0 says "someone may be asleep here", the other bits count
// wake-ups. A notifier pays no system call while the bit is clear.
//
// SYNC (Dekker pair, seq_cst fences on both sides):
//   waiter:   w = word.fetch_or(1); fence; check the condition; FUTEX_WAIT(word, w | 1)
//   notifier: make the condition true; fence; w = word.load();
//             if (w & 1): CAS word w -> (w & ~1) + 2, then FUTEX_WAKE all
// Either the notifier's load sees the waiter's bit (its fetch_or precedes
// the waiter's fence, which then precedes the notifier's fence in the
// single total order), or the waiter's check sees the condition. A wake
// between the waiter's check and its sleep changes the word, so FUTEX_WAIT
// returns at once. The waiter always does the read-modify-write, even when
// the bit is already set: the argument needs its own store before its fence.
//
// The notifier clears the bit as it wakes everybody: until a woken waiter
// runs and registers again, further notifications make no system call (with
// a count of sleepers they each paid one, as the woken still counted).
// Waiters that find the condition true after registering, time out or die
// leave the bit set; the next notifier then makes one needless wake, which
// clears it. Nothing is ever missed, at worst one syscall is wasted.
#pragma once

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>

#include "common/clock.h"
#include "common/futex.h"
#include "common/wait_status.h"

namespace vipc::common {

struct WaitPoint {
  // Futex word. Waiter: fetch_or(1, seq_cst). Notifier: load after a seq_cst
  // fence, then compare_exchange (release) to (w & ~1) + 2.
  std::atomic<uint32_t> word;
  uint32_t reserved;  // zero; keeps the 8-byte footprint of layout v2
};
static_assert(sizeof(WaitPoint) == 8, "two 32-bit words");

inline constexpr uint32_t kMaySleep = 1;

// wait_until returns kReady, kTimeout or kInterrupted.

// Wake every sleeper, whether or not the bit says one may sleep (closing a
// handle whose waits must end now).
inline void wake_all_now(WaitPoint& wp) {
  uint32_t w = wp.word.load(std::memory_order_relaxed);
  while (!wp.word.compare_exchange_weak(w, (w & ~kMaySleep) + 2, std::memory_order_seq_cst)) {
  }
  futex_wake(&wp.word, INT_MAX);
}

// Sleep until ready() is true or the deadline (monotonic ns, kNever) passes.
// Polls first for up to spin_ns, yielding between polls (0: sleep at once). Signals end the wait with
// kInterrupted so the caller can run its handlers and wait again.
template <class Ready>
WaitStatus wait_until(WaitPoint& wp, Ready&& ready, int64_t deadline_ns, int64_t spin_ns = 0) {
  if (ready()) return WaitStatus::kReady;
  if (spin_ns > 0) {
    // Poll, yielding the CPU between polls: on a machine with fewer cores than
    // busy processes the peer we wait for gets to run, and a stream of
    // messages costs no futex sleep / wake per message. Then sleep (0 % CPU).
    const int64_t spin_end = std::min(deadline_ns, monotonic_ns() + spin_ns);
    do {
      sched_yield();
      if (ready()) return WaitStatus::kReady;
    } while (monotonic_ns() < spin_end);
  }
  for (;;) {
    const uint32_t w = wp.word.fetch_or(kMaySleep, std::memory_order_seq_cst) | kMaySleep;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (ready()) return WaitStatus::kReady;
    const int64_t now = monotonic_ns();
    if (now >= deadline_ns) return WaitStatus::kTimeout;
    const FutexResult r = futex_wait(&wp.word, w, deadline_ns == kNever ? -1 : deadline_ns - now);
    if (ready()) return WaitStatus::kReady;
    if (r == FutexResult::kInterrupted) return WaitStatus::kInterrupted;
  }
}

// Call after making a condition true (any store ordering: the fence orders it).
// wanted(), if given, runs only when someone may sleep (after the fence) and
// may say the sleepers do not care about this change yet: the bit then stays.
template <class Wanted>
void notify_all_if(WaitPoint& wp, Wanted&& wanted) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  uint32_t w = wp.word.load(std::memory_order_acquire);
  if ((w & kMaySleep) == 0 || !wanted()) return;
  // One notifier clears the bit and wakes. One that loses the race may give
  // up: the winner wakes every sleeper, and a waiter registering after the
  // winner's change sees our condition (its fetch_or comes after the value
  // our failed compare read, so its fence follows ours). The model
  // (model/wait_point.pml) verifies with and without a retry.
  if (wp.word.compare_exchange_strong(w, (w & ~kMaySleep) + 2, std::memory_order_release, std::memory_order_relaxed)) {
    futex_wake(&wp.word, INT_MAX);
  }
}
inline void notify_all(WaitPoint& wp) {
  notify_all_if(wp, [] { return true; });
}

}  // namespace vipc::common
