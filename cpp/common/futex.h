// Linux futexes on words in shared (file-backed) memory. Not FUTEX_PRIVATE:
// waiters and wakers live in different processes.
#pragma once

#include <atomic>
#include <cstdint>

namespace ipc {

enum class FutexResult { kWoken, kTimeout, kInterrupted, kValueChanged };

// Sleep while *word == expected, at most timeout_ns (< 0: no limit).
FutexResult futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns);

// Wake up to `count` sleepers; returns how many were woken.
int futex_wake(std::atomic<uint32_t>* word, int count);

}  // namespace ipc
