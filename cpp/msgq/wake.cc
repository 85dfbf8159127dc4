#include "msgq/wake.h"

#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/errors.h"
#include "msgq/layout.h"

namespace vipc::msgq {

namespace {

sockaddr_un abstract_address(const char* name, size_t length, socklen_t* addr_len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  length = std::min(length, sizeof(addr.sun_path));
  std::memcpy(addr.sun_path, name, length);
  *addr_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + length);
  return addr;
}

}  // namespace

WakeSocket::WakeSocket() {
  fd_.reset(socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd_) common::fail_errno("socket(AF_UNIX) for wake-ups");
  for (int attempt = 0; attempt < 8; attempt++) {
    uint64_t nonce = 0;
    if (getrandom(&nonce, sizeof(nonce), 0) != sizeof(nonce)) nonce = static_cast<uint64_t>(getpid()) << 20 ^ attempt;
    char buf[kWakeNameCapacity];
    const int n = std::snprintf(buf, sizeof(buf), "%cmsgqw.%016llx", '\0', static_cast<unsigned long long>(nonce));
    name_.assign(buf, static_cast<size_t>(n));
    socklen_t len = 0;
    const sockaddr_un addr = abstract_address(name_.data(), name_.size(), &len);
    if (bind(fd_.get(), reinterpret_cast<const sockaddr*>(&addr), len) == 0) return;
    if (errno != EADDRINUSE) common::fail_errno("bind wake-up socket");
  }
  common::fail(common::ErrorKind::kIpc, "could not bind a wake-up socket name");
}

void WakeSocket::drain() {
  char buf[64];
  while (recv(fd_.get(), buf, sizeof(buf), MSG_DONTWAIT) > 0) {
  }
}

bool WakeSender::poke(const char* name, size_t length) {
  if (length < 2 || name[0] != '\0') return false;  // not an abstract name: ignore garbage
  if (!fd_) {
    fd_.reset(socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd_) return false;
  }
  socklen_t len = 0;
  const sockaddr_un addr = abstract_address(name, length, &len);
  const char byte = 1;
  const ssize_t r =
      sendto(fd_.get(), &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&addr), len);
  return r == 1 || errno == EAGAIN;  // a full queue is already readable
}

}  // namespace vipc::msgq
