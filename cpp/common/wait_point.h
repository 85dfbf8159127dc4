// A place in shared memory where processes sleep until another process makes
// a condition true (a chunk written, a chunk consumed, a shutdown). A futex
// sequence word plus a count of sleepers, so that a notifier pays no system
// call while nobody sleeps.
//
// SYNC (Dekker pair, seq_cst fences on both sides):
//   waiter:   sleepers += 1; fence; seq0 = seq; check the condition; FUTEX_WAIT(seq, seq0)
//   notifier: make the condition true; fence; if sleepers != 0: seq += 1, FUTEX_WAKE
// Either the notifier sees the sleeper, or the waiter's check sees the
// condition. A wake between the waiter's check and its sleep changes seq, so
// FUTEX_WAIT returns at once. A waiter killed in its sleep leaves the count
// raised: notifiers then make one needless syscall each, never miss a wake.
#pragma once

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>

#include "common/clock.h"
#include "common/futex.h"

namespace ipc {

struct WaitPoint {
  std::atomic<uint32_t> seq;       // futex word; notifier: fetch_add(release); waiter: load(acquire)
  std::atomic<uint32_t> sleepers;  // waiter: fetch_add / fetch_sub (seq_cst); notifier: load after a seq_cst fence
};
static_assert(sizeof(WaitPoint) == 8, "two 32-bit words");

enum class WaitResult { kReady, kTimeout, kInterrupted };

// Sleep until ready() is true or the deadline (monotonic ns, kNever) passes.
// Polls first for up to spin_ns, yielding between polls (0: sleep at once). Signals end the wait with
// kInterrupted so the caller can run its handlers and wait again.
template <class Ready>
WaitResult wait_until(WaitPoint& wp, Ready&& ready, int64_t deadline_ns, int64_t spin_ns = 0) {
  if (ready()) return WaitResult::kReady;
  if (spin_ns > 0) {
    // Poll, yielding the CPU between polls: on a machine with fewer cores than
    // busy processes the peer we wait for gets to run, and a stream of
    // messages costs no futex sleep / wake per message. Then sleep (0 % CPU).
    const int64_t spin_end = std::min(deadline_ns, monotonic_ns() + spin_ns);
    do {
      sched_yield();
      if (ready()) return WaitResult::kReady;
    } while (monotonic_ns() < spin_end);
  }
  for (;;) {
    wp.sleepers.fetch_add(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const uint32_t seq = wp.seq.load(std::memory_order_acquire);
    if (ready()) {
      wp.sleepers.fetch_sub(1, std::memory_order_relaxed);
      return WaitResult::kReady;
    }
    const int64_t now = monotonic_ns();
    if (now >= deadline_ns) {
      wp.sleepers.fetch_sub(1, std::memory_order_relaxed);
      return WaitResult::kTimeout;
    }
    const FutexResult r = futex_wait(&wp.seq, seq, deadline_ns == kNever ? -1 : deadline_ns - now);
    wp.sleepers.fetch_sub(1, std::memory_order_relaxed);
    if (ready()) return WaitResult::kReady;
    if (r == FutexResult::kInterrupted) return WaitResult::kInterrupted;
  }
}

// Call after making a condition true (any store ordering: the fence orders it).
// wanted(), if given, runs only when someone sleeps (after the fence) and
// may say the sleepers do not care about this change yet.
inline void notify_all(WaitPoint& wp) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (wp.sleepers.load(std::memory_order_relaxed) == 0) return;
  wp.seq.fetch_add(1, std::memory_order_release);
  futex_wake(&wp.seq, INT_MAX);
}
template <class Wanted>
void notify_all_if(WaitPoint& wp, Wanted&& wanted) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (wp.sleepers.load(std::memory_order_relaxed) == 0 || !wanted()) return;
  wp.seq.fetch_add(1, std::memory_order_release);
  futex_wake(&wp.seq, INT_MAX);
}

}  // namespace ipc
