// Private to the API layer: the core's errors (common::Error) become the
// public vipc::Error at the API boundary, so no internal header leaks.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "common/errors.h"
#include "msgq/publisher.h"
#include "vipc/error.h"

namespace vipc::api {

[[noreturn]] void rethrow(const common::Error& e);

template <class F>
decltype(auto) guarded(F&& f) {
  try {
    return f();
  } catch (const common::Error& e) {
    rethrow(e);
  }
}

// The public wake choice as the core's.
inline msgq::WakeMode wake_mode(Wake wake) {
  return wake == Wake::handoff ? msgq::WakeMode::kHandoff : msgq::WakeMode::kAll;
}
inline Wake public_wake(msgq::WakeMode mode) { return mode == msgq::WakeMode::kHandoff ? Wake::handoff : Wake::all; }

// A Timeout as the core's deadline (monotonic ns; common::kNever for kForever).
inline int64_t deadline_of(Timeout timeout) {
  return common::deadline_after(timeout.count() < 0 ? -1 : std::chrono::nanoseconds(timeout).count());
}

inline std::string str(std::string_view s) { return std::string(s); }

}  // namespace vipc::api
