// vipc::Error from the core's common::Error, and the run options' one look at
// the environment.
#include <cstdlib>

#include "api/guard.h"

namespace vipc {

namespace api {

void rethrow(const common::Error& e) {
  using common::ErrorKind;
  ErrorKind k = e.kind();
  vipc::ErrorKind out = vipc::ErrorKind::ipc;
  switch (k) {
    case ErrorKind::kIpc: out = vipc::ErrorKind::ipc; break;
    case ErrorKind::kMultiplePublishers: out = vipc::ErrorKind::multiple_publishers; break;
    case ErrorKind::kMessageTooLarge: out = vipc::ErrorKind::message_too_large; break;
    case ErrorKind::kSegment: out = vipc::ErrorKind::segment; break;
    case ErrorKind::kTooManyReaders: out = vipc::ErrorKind::too_many_readers; break;
    case ErrorKind::kClosed: out = vipc::ErrorKind::closed; break;
    case ErrorKind::kPermission: out = vipc::ErrorKind::permission; break;
    case ErrorKind::kInvalidArgument: out = vipc::ErrorKind::invalid_argument; break;
    case ErrorKind::kNoSpace: out = vipc::ErrorKind::no_space; break;
    case ErrorKind::kTimeout: out = vipc::ErrorKind::timeout; break;
  }
  throw vipc::Error(out, e.what());
}

}  // namespace api

RunOptions RunOptions::from_environment() {
  RunOptions r;
  const char* prefix = std::getenv("MSGQ_PREFIX");
  if (prefix == nullptr || *prefix == '\0') prefix = std::getenv("OPENPILOT_PREFIX");
  if (prefix != nullptr) r.prefix = prefix;
  if (const char* dir = std::getenv("MSGQ_SHM_DIR"); dir != nullptr && *dir != '\0') r.shm_dir = dir;
  return r;
}

std::chrono::microseconds RunOptions::spin_from_environment() {
  const char* text = std::getenv("MSGQ_SPIN_US");
  if (text == nullptr || *text == '\0') return std::chrono::microseconds(50);
  char* end = nullptr;
  const long long us = std::strtoll(text, &end, 10);
  if (*end != '\0' || us < 0) {
    throw Error(ErrorKind::invalid_argument, std::string("MSGQ_SPIN_US='") + text + "' must be a non-negative integer (microseconds)");
  }
  return std::chrono::microseconds(us);
}

Wake RunOptions::wake_from_environment() {
  const char* text = std::getenv("MSGQ_WAKE");
  if (text == nullptr || *text == '\0' || std::strcmp(text, "all") == 0) return Wake::all;
  if (std::strcmp(text, "handoff") == 0) return Wake::handoff;
  throw Error(ErrorKind::invalid_argument, std::string("MSGQ_WAKE='") + text + "' must be 'all' or 'handoff'");
}

}  // namespace vipc
