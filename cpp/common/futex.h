// Linux futexes on words in shared (file-backed) memory. Not FUTEX_PRIVATE:
// waiters and wakers live in different processes.
#pragma once

#include <atomic>
#include <cstdint>

namespace vipc::common {

enum class FutexResult { kWoken, kTimeout, kInterrupted, kValueChanged };

// Sleep while *word == expected, at most timeout_ns (< 0: no limit).
FutexResult futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns);

// Wake up to `count` sleepers; returns how many were woken.
int futex_wake(std::atomic<uint32_t>* word, int count);

// FUTEX_WAIT_BITSET / FUTEX_WAKE_BITSET on any aligned 32-bit word (e.g. the
// low half of a 64-bit atomic): a waiter names the events it waits for in
// `bitset`, and a wake reaches only waiters whose bitset intersects its own.
FutexResult futex_wait_bitset(const void* word32, uint32_t expected, int64_t timeout_ns, uint32_t bitset);
int futex_wake_bitset(const void* word32, int count, uint32_t bitset);

}  // namespace vipc::common
