// File-descriptor wake-ups (readiness as a file descriptor; cpp/msgq/README.md, "Waiting"). A
// reader that wants to wait in select/epoll/asyncio owns a WakeSocket, an
// abstract-namespace AF_UNIX datagram socket; it writes the socket's name into
// its reader slot and sets its armed bit. After a commit, a writer that sees
// armed bits pokes each such reader once (one datagram). Nobody armed: no
// syscall. Abstract names leave no file behind; a stray datagram only causes
// a spurious wake-up, which every waiter tolerates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/files.h"

namespace vipc::msgq {

class WakeSocket {
 public:
  WakeSocket();
  int fd() const { return fd_.get(); }
  // Address bytes including the leading NUL of the abstract namespace.
  const char* name() const { return name_.data(); }
  size_t name_length() const { return name_.size(); }
  void drain();

 private:
  common::UniqueFd fd_;
  std::string name_;
};

class WakeSender {
 public:
  // Best effort: false if the reader is gone (its slot will be reclaimed).
  bool poke(const char* name, size_t length);

 private:
  common::UniqueFd fd_;
};

}  // namespace vipc::msgq
