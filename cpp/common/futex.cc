#include "common/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <ctime>

namespace ipc {

FutexResult futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns) {
  timespec ts{};
  timespec* tsp = nullptr;
  if (timeout_ns >= 0) {
    ts.tv_sec = timeout_ns / 1'000'000'000;
    ts.tv_nsec = timeout_ns % 1'000'000'000;
    tsp = &ts;
  }
  const long r = syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, tsp, nullptr, 0);
  if (r == 0) return FutexResult::kWoken;
  switch (errno) {
    case ETIMEDOUT: return FutexResult::kTimeout;
    case EINTR: return FutexResult::kInterrupted;
    default: return FutexResult::kValueChanged;  // EAGAIN: the word moved before we slept
  }
}

int futex_wake(std::atomic<uint32_t>* word, int count) {
  const long r = syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, count, nullptr, nullptr, 0);
  return r < 0 ? 0 : static_cast<int>(r);
}

}  // namespace ipc
