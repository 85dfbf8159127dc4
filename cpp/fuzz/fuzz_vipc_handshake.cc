// Fuzz target: a VisionIPC client talking to a hostile server
// (cpp/visionipc/client.cc: the Reply of the handshake, the fds that come
// with it, and the stream list). A fake server thread answers the client's
// Request with the fuzzer's bytes and 0..3 memfds of the fuzzer's sizes and
// seals. The client must refuse anything inconsistent with an vipc::common::Error or
// a false return, and never index or map outside what it checked.
//
// Input: [flags][fd size words x3][Reply bytes...]
//   flags bit 0: stamp a consistent header (magic, version, status ok) and
//                pool layout fields derived from count and buffer_size;
//   bits 1-2:    number of fds attached (0..3);
//   bit 3:       seal the memfds against resizing (as a real server does);
//   bit 4:       give the memfds exactly the sizes the Reply claims;
//   bit 5:       ask for the stream list instead of attaching.
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/errors.h"
#include "common/files.h"
#include "fuzz_input.h"
#include "visionipc/client.h"
#include "visionipc/pool.h"
#include "visionipc/protocol.h"

namespace {

using namespace vipc::visionipc;

std::string g_dir;
std::string g_name;
vipc::common::UniqueFd g_listener;

vipc::common::UniqueFd memfd_of(uint64_t size, bool sealed) {
  vipc::common::UniqueFd fd(memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd || ftruncate(fd.get(), static_cast<off_t>(size)) != 0) abort();
  if (sealed && fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) abort();
  return fd;
}

// poll() that retries when libFuzzer's -timeout alarm interrupts it.
int poll_one(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  int r;
  do {
    r = poll(&p, 1, timeout_ms);
  } while (r < 0 && errno == EINTR);
  return r;
}

// Accept one connection, read its Request, answer with `reply` and `fds`.
// Returns the connection (kept open while the client uses it).
vipc::common::UniqueFd serve_once(const std::vector<uint8_t>& reply, const std::vector<int>& fds) {
  if (poll_one(g_listener.get(), 2000) != 1) return {};
  vipc::common::UniqueFd conn(accept4(g_listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!conn) return {};
  Request req;
  if (poll_one(conn.get(), 2000) != 1 || recv(conn.get(), &req, sizeof(req), 0) <= 0) return conn;
  send_with_fds(conn.get(), reply.data(), reply.size(), fds);
  return conn;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_dir = fuzz::make_temp_dir();
  g_name = "fuzz" + std::to_string(getpid());
  g_listener.reset(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un sa;
  const socklen_t len = fuzz::abstract_address(socket_address("", g_name), sa);
  if (bind(g_listener.get(), reinterpret_cast<sockaddr*>(&sa), len) != 0 || listen(g_listener.get(), 8) != 0) abort();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const uint8_t flags = in.take<uint8_t>();
  uint64_t fd_sizes[3];
  for (uint64_t& s : fd_sizes) s = in.take<uint32_t>() % (1u << 22);  // up to 4 MiB each

  std::vector<uint8_t> bytes(sizeof(Reply), 0);
  const size_t got = in.fill(bytes.data(), bytes.size());
  auto* r = reinterpret_cast<Reply*>(bytes.data());
  if (flags & 1) {
    r->magic = kProtocolMagic;
    r->version = kProtocolVersion;
    r->status = 0;
    r->lease_table_size = kLeaseTableSize;
    if (r->count != 0 && r->count <= kMaxBuffers) {
      const PoolLayout l = make_layout(r->count, r->buffer_size % (1u << 20));
      r->buffer_size = l.buffer_size;
      r->slot_size = l.slot_size;
      r->data_offset = l.data_offset;
      r->pool_size = l.total_size;
    }
  } else {
    bytes.resize(got == 0 ? 1 : got);  // short replies too
  }
  if (flags & 16) {
    fd_sizes[0] = r->pool_size % (1u << 28);
    fd_sizes[1] = r->lease_table_size % (1u << 28);
  }
  std::vector<vipc::common::UniqueFd> owned;
  std::vector<int> fds;
  for (uint32_t i = 0; i < ((flags >> 1) & 3u); i++) {
    owned.push_back(memfd_of(fd_sizes[i], flags & 8));
    fds.push_back(owned.back().get());
  }

  vipc::common::UniqueFd conn;
  std::thread server([&] { conn = serve_once(bytes, fds); });
  ClientOptions options;
  options.shm_dir = g_dir;
  try {
    if (flags & 32) {
      (void)Client::list_streams(g_name, options);
    } else {
      Client client(g_name, "s", false, options);
      if (client.connect()) {
        // Touch what a connected client exposes: every buffer's first and last byte.
        for (uint32_t i = 0; i < client.count(); i++) {
          const uint8_t* b = client.buffer(i);
          volatile uint8_t sum = b[0] + b[client.geometry().size - 1];
          (void)sum;
          (void)client.is_valid(i, 2);
        }
        Frame f;
        (void)client.recv(vipc::common::monotonic_ns(), f);
      }
    }
  } catch (const vipc::common::Error&) {
  }
  server.join();
  return 0;
}
