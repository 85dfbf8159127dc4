#pragma once

#include <cstdint>
#include <ctime>

namespace vipc::common {

inline int64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

inline int64_t realtime_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Deadline arithmetic: timeout < 0 means "never".
inline constexpr int64_t kNever = INT64_MAX;
inline int64_t deadline_after(int64_t timeout_ns) { return timeout_ns < 0 ? kNever : monotonic_ns() + timeout_ns; }

}  // namespace vipc::common
