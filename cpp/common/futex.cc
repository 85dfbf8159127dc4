#include "common/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <ctime>

namespace vipc::common {

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
    case ETIMEDOUT:
      return FutexResult::kTimeout;
    case EINTR:
      return FutexResult::kInterrupted;
    default:
      return FutexResult::kValueChanged;  // EAGAIN: the word moved before we slept
  }
}

int futex_wake(std::atomic<uint32_t>* word, int count) {
  const long r = syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, count, nullptr, nullptr, 0);
  return r < 0 ? 0 : static_cast<int>(r);
}

FutexResult futex_wait_bitset(const void* word32, uint32_t expected, int64_t timeout_ns, uint32_t bitset) {
  timespec ts{};
  timespec* tsp = nullptr;
  if (timeout_ns >= 0) {  // FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC time
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    const int64_t at = int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec + timeout_ns;
    ts.tv_sec = at / 1'000'000'000;
    ts.tv_nsec = at % 1'000'000'000;
    tsp = &ts;
  }
  auto* addr = const_cast<uint32_t*>(static_cast<const uint32_t*>(word32));
  const long r = syscall(SYS_futex, addr, FUTEX_WAIT_BITSET, expected, tsp, nullptr, bitset);
  if (r == 0) return FutexResult::kWoken;
  switch (errno) {
    case ETIMEDOUT:
      return FutexResult::kTimeout;
    case EINTR:
      return FutexResult::kInterrupted;
    default:
      return FutexResult::kValueChanged;
  }
}

int futex_wake_bitset(const void* word32, int count, uint32_t bitset) {
  auto* addr = const_cast<uint32_t*>(static_cast<const uint32_t*>(word32));
  const long r = syscall(SYS_futex, addr, FUTEX_WAKE_BITSET, count, nullptr, nullptr, bitset);
  return r < 0 ? 0 : static_cast<int>(r);
}

}  // namespace vipc::common
