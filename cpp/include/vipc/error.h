// visionipc's native C++ API: the one error type and the run options every
// object takes. Errors are exceptions (vipc::Error); nothing returns a code.
#pragma once

#include <chrono>
#include <stdexcept>
#include <string>

#include "vipc/export.h"

namespace vipc {

// The library's version; the shared library's soname is libvisionipc.so.MAJOR.MINOR
// (0.x: every minor release may change the ABI, see docs/cpp.md).
inline constexpr int kVersionMajor = 0;
inline constexpr int kVersionMinor = 1;
inline constexpr int kVersionPatch = 0;

enum class ErrorKind {
  ipc,                  // anything else that went wrong talking to a peer or the OS
  multiple_publishers,  // another publisher took the topic over ("last publisher wins")
  message_too_large,    // a message larger than the topic's ring can ever hold
  segment,              // a corrupt, incompatible (other layout version) or foreign segment
  too_many_readers,     // all 64 reader slots of a topic are held by live readers
  closed,               // use after close()
  permission,           // owner / mode / peer credential check failed
  invalid_argument,     // a bad size, count, name or option
  no_space,             // the shared-memory directory (or memfd) could not provide the memory
  timeout,              // a bounded wait ran out where the call cannot return "nothing"
};

class VIPC_API Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

// Timeouts: a duration; kForever (any negative value) waits without limit, 0 never waits.
using Timeout = std::chrono::milliseconds;
inline constexpr Timeout kForever{-1};

// How a publisher (or a frame server's send) wakes subscribers asleep in a
// blocking receive. all: one system call wakes every sleeper (each wakes as
// early as it can; the publisher's CPU per message grows with the sleepers).
// handoff: the publisher wakes one, that subscriber wakes the rest (the
// publisher's cost stays that of one; the others wake one hop later).
enum class Wake { all, handoff };

// Where a run's shared memory lives. Processes that talk share these: the
// prefix isolates every segment and socket name of a run.
struct VIPC_API RunOptions {
  std::string prefix;                       // MSGQ_PREFIX; "" = no prefix
  std::string shm_dir = default_shm_dir();  // MSGQ_SHM_DIR: the directory of the topic segments

  // The core's shared-memory directory (cpp/common/names.h), where segments live
  // unless MSGQ_SHM_DIR says otherwise.
  static std::string default_shm_dir();

  // MSGQ_PREFIX (or the reference's OPENPILOT_PREFIX) and MSGQ_SHM_DIR, as the
  // Python package reads them. With the two below, the only places
  // the C++ API reads the environment.
  static RunOptions from_environment();
  // MSGQ_SPIN_US (a subscriber's busy-wait before sleeping; TopicOptions::spin), default 50 us.
  static std::chrono::microseconds spin_from_environment();
  // MSGQ_WAKE ("all" or "handoff"; TopicOptions::wake, ServerOptions::wake), default all.
  static Wake wake_from_environment();
};

}  // namespace vipc
