// How a blocking wait ended: the one status every wait in the core returns
// (common/wait_point.h, msgq::Subscriber / Poller, the broadcast queue, the
// ordered topic, the VisionIPC client). Not every wait can end every way:
// kShutdown only comes from the broadcast queue and the ordered topic, and
// kClosed from handles that can be closed by another thread meanwhile.
#pragma once

namespace vipc::common {

enum class WaitStatus { kReady, kTimeout, kInterrupted, kShutdown, kClosed };

// "ready", "timeout", "interrupted", "shutdown", "closed": the names the
// Python bindings hand back (msgq/broadcast.py, msgq/ordered.py).
inline const char* wait_status_name(WaitStatus st) {
  switch (st) {
    case WaitStatus::kReady:
      return "ready";
    case WaitStatus::kTimeout:
      return "timeout";
    case WaitStatus::kInterrupted:
      return "interrupted";
    case WaitStatus::kShutdown:
      return "shutdown";
    case WaitStatus::kClosed:
      return "closed";
  }
  return "?";
}

}  // namespace vipc::common
