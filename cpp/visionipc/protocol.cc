#include "visionipc/protocol.h"

#include <sys/socket.h>
#include <sys/un.h>

#include <cstddef>
#include <cstdio>

#include <cerrno>
#include <cstring>

namespace vipc::visionipc {

namespace {
uint64_t fnv1a(const std::string& text, uint64_t seed) {
  uint64_t h = seed;
  for (unsigned char ch : text) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}
}  // namespace

std::string socket_address(const std::string& prefix, const std::string& name) {
  std::string addr(1, '\0');
  const std::string readable = "visionipc@" + prefix + "@" + name;
  if (readable.size() < sizeof(sockaddr_un::sun_path)) return addr + readable;
  // Too long for sun_path (a long prefix and name): a 128-bit digest of it.
  char digest[33];
  std::snprintf(digest, sizeof(digest), "%016llx%016llx",
                static_cast<unsigned long long>(fnv1a(readable, 0xcbf29ce484222325ull)),
                static_cast<unsigned long long>(fnv1a(readable, 0x84222325cbf29ce4ull)));
  return addr + "visionipc#" + digest;
}

socklen_t socket_sockaddr(const std::string& prefix, const std::string& name, sockaddr_un& sa) {
  const std::string addr = socket_address(prefix, name);
  sa = sockaddr_un{};
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, addr.data(), addr.size());  // fits: socket_address keeps it under sun_path's size
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + addr.size());
}

std::string endpoint_name(const std::string& name, const std::string& stream) {
  return "visionipc_" + name + "_" + stream;
}

bool send_with_fds(int sock, const void* data, size_t n, const std::vector<int>& fds) {
  iovec iov{const_cast<void*>(data), n};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)] = {};
  if (fds.size() > kMaxFdsPerMessage) {  // refuse rather than overflow `control` (found by cpp/fuzz)
    errno = EINVAL;
    return false;
  }
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(cm), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    const ssize_t r = sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (r == static_cast<ssize_t>(n)) return true;
    if (r < 0 && errno == EINTR) continue;
    return false;
  }
}

ssize_t recv_with_fds(int sock, void* data, size_t n, std::vector<common::UniqueFd>& fds) {
  iovec iov{data, n};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t r;
  do {
    r = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (r < 0 && errno == EINTR);
  if (r < 0) return r;
  // Take every fd that arrived, even unexpected ones, so none leaks.
  for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; i++) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
      fds.emplace_back(fd);
    }
  }
  if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
    errno = EMSGSIZE;
    return -1;
  }
  return r;
}

}  // namespace vipc::visionipc

#include "common/names.h"

namespace vipc::visionipc {

void check_name(const char* kind, const std::string& name) { common::check_name(kind, name, kMaxNameLength); }

}  // namespace vipc::visionipc
