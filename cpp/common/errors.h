// One exception type for the whole C++ core; its kind picks the Python
// exception the bindings raise (msgq/errors.py documents them).
#pragma once

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace vipc::common {

enum class ErrorKind {
  kIpc,                 // anything else that went wrong talking to a peer or the OS
  kMultiplePublishers,  // another publisher took the topic over
  kMessageTooLarge,     // payload larger than the ring can ever hold
  kSegment,             // corrupt, incompatible or foreign shared-memory segment
  kTooManyReaders,      // all reader slots of a topic are taken by live readers
  kClosed,              // use after close()
  kPermission,          // owner / mode / peer credential check failed
  kInvalidArgument,     // a bad size, count, name or option
  kNoSpace,             // /dev/shm (or memfd) could not provide the memory
  kTimeout,             // a bounded wait ran out
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

[[noreturn]] inline void fail(ErrorKind kind, const std::string& what) { throw Error(kind, what); }

// errno-based failure: "what: strerror (errno N)".
[[noreturn]] inline void fail_errno(const std::string& what, int err = errno) {
  const ErrorKind kind = (err == ENOSPC || err == ENOMEM)  ? ErrorKind::kNoSpace
                         : (err == EACCES || err == EPERM) ? ErrorKind::kPermission
                                                           : ErrorKind::kIpc;
  throw Error(kind, what + ": " + std::strerror(err) + " (errno " + std::to_string(err) + ")");
}

// kInvalidArgument "<what> must be <lo> to <hi><unit>, not <value>" unless lo <= value <= hi.
template <typename T>
void check_range(const char* what, T value, T lo, T hi, const char* unit = "") {
  if (value < lo || value > hi) {
    fail(ErrorKind::kInvalidArgument, std::string(what) + " must be " + std::to_string(lo) + " to " +
                                          std::to_string(hi) + unit + ", not " + std::to_string(value));
  }
}

}  // namespace vipc::common
