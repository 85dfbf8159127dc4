// vipc::Error from the core's common::Error, and the run options' one look at
// the environment.
#include <cerrno>
#include <cstdlib>
#include <string>
#include <string_view>

#include "api/guard.h"
#include "common/names.h"

namespace vipc {

namespace api {

void rethrow(const common::Error& e) {
  using common::ErrorKind;
  ErrorKind k = e.kind();
  vipc::ErrorKind out = vipc::ErrorKind::ipc;
  switch (k) {
    case ErrorKind::kIpc:
      out = vipc::ErrorKind::ipc;
      break;
    case ErrorKind::kMultiplePublishers:
      out = vipc::ErrorKind::multiple_publishers;
      break;
    case ErrorKind::kMessageTooLarge:
      out = vipc::ErrorKind::message_too_large;
      break;
    case ErrorKind::kSegment:
      out = vipc::ErrorKind::segment;
      break;
    case ErrorKind::kTooManyReaders:
      out = vipc::ErrorKind::too_many_readers;
      break;
    case ErrorKind::kClosed:
      out = vipc::ErrorKind::closed;
      break;
    case ErrorKind::kPermission:
      out = vipc::ErrorKind::permission;
      break;
    case ErrorKind::kInvalidArgument:
      out = vipc::ErrorKind::invalid_argument;
      break;
    case ErrorKind::kNoSpace:
      out = vipc::ErrorKind::no_space;
      break;
    case ErrorKind::kTimeout:
      out = vipc::ErrorKind::timeout;
      break;
  }
  throw vipc::Error(out, e.what());
}

}  // namespace api

std::string RunOptions::default_shm_dir() { return std::string(common::kSegmentDir); }

RunOptions RunOptions::from_environment() {
  RunOptions r;
  const char* prefix = std::getenv("MSGQ_PREFIX");
  if (prefix == nullptr || *prefix == '\0') prefix = std::getenv("OPENPILOT_PREFIX");
  if (prefix != nullptr) r.prefix = prefix;
  if (const char* dir = std::getenv("MSGQ_SHM_DIR"); dir != nullptr && *dir != '\0') r.shm_dir = dir;
  return r;
}

namespace {

// A variable's value as Python's msgq reads it: unset or blank is "", and
// surrounding whitespace does not count.
std::string env_text(const char* name) {
  const char* raw = std::getenv(name);
  std::string_view text = raw == nullptr ? std::string_view() : std::string_view(raw);
  constexpr std::string_view kSpace = " \t\n\r\f\v";
  const size_t first = text.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return "";
  return std::string(text.substr(first, text.find_last_not_of(kSpace) - first + 1));
}

constexpr long long kMaxSpinUs = 1'000'000;  // msgq._shared.MAX_SPIN_US

}  // namespace

// The errors are worded as the Python package words them (msgq/_shared.py).
std::chrono::microseconds RunOptions::spin_from_environment() {
  const std::string text = env_text("MSGQ_SPIN_US");
  if (text.empty()) return std::chrono::microseconds(50);
  const std::string range = "0 to " + std::to_string(kMaxSpinUs);
  char* end = nullptr;
  errno = 0;
  const long long us = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0') {
    throw Error(ErrorKind::invalid_argument, "MSGQ_SPIN_US='" + text + "' must be an integer from " + range);
  }
  if (errno == ERANGE || us < 0 || us > kMaxSpinUs) {
    throw Error(ErrorKind::invalid_argument, "MSGQ_SPIN_US must be " + range + ", got " + text);
  }
  return std::chrono::microseconds(us);
}

Wake RunOptions::wake_from_environment() {
  const std::string text = env_text("MSGQ_WAKE");
  if (text.empty() || text == "all") return Wake::all;
  if (text == "handoff") return Wake::handoff;
  throw Error(ErrorKind::invalid_argument, "MSGQ_WAKE must be 'all' or 'handoff', not '" + text + "'");
}

}  // namespace vipc
