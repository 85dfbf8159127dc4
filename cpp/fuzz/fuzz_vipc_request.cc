// Fuzz target: a VisionIPC server reading requests from a hostile client
// (cpp/visionipc/server.cc serve_request, protocol.cc recv_with_fds). A real
// server with one stream runs its listener thread in this process; each input
// is sent on a fresh connection as one message of any length, optionally with
// a stray fd attached. The server must answer or hang up, keep serving, and
// leak nothing (no fd, no lease slot: afterwards a well-formed client still
// attaches).
//
// Input: [flags][message bytes...]
//   flags bit 0: stamp the magic;  bit 1: stamp the version;
//   bit 2: attach an fd;           bit 3: NUL-terminate the stream name.
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/files.h"
#include "fuzz_input.h"
#include "visionipc/client.h"
#include "visionipc/format.h"
#include "visionipc/protocol.h"
#include "visionipc/server.h"

namespace {

using namespace vipc::visionipc;

std::string g_dir;
std::string g_name;
Server* g_server = nullptr;  // lives for the whole run (its listener thread serves every input)
uint64_t g_runs = 0;

vipc::common::UniqueFd dial() {
  vipc::common::UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un sa;
  const socklen_t len = fuzz::abstract_address(socket_address("", g_name), sa);
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), len) != 0) abort();  // the server must still listen
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_dir = fuzz::make_temp_dir();
  g_name = "fuzzsrv" + std::to_string(getpid());
  ServerOptions options;
  options.shm_dir = g_dir;
  g_server = new Server(g_name, options);
  g_server->create_buffers("s", 2, make_geometry(Format::kGray8, 64, 8));
  g_server->start_listener();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const uint8_t flags = in.take<uint8_t>();
  std::vector<uint8_t> msg(in.rest(), in.rest() + in.left());
  if (msg.size() >= 8) {
    if (flags & 1) std::memcpy(msg.data(), &kProtocolMagic, 4);
    if (flags & 2) std::memcpy(msg.data() + 4, &kProtocolVersion, 4);
  }
  if ((flags & 8) && msg.size() >= sizeof(Request)) msg[sizeof(Request) - 1] = 0;
  if (msg.empty()) msg.push_back(0);

  vipc::common::UniqueFd fd = dial();
  vipc::common::UniqueFd stray(dup(STDERR_FILENO));
  std::vector<int> fds;
  if (flags & 4) fds.push_back(stray.get());
  send_with_fds(fd.get(), msg.data(), msg.size(), fds);
  // The answer (or the hang-up) comes from the listener thread.
  pollfd p{fd.get(), POLLIN, 0};
  int ready;
  do {
    ready = poll(&p, 1, 5000);
  } while (ready < 0 && errno == EINTR);  // libFuzzer's -timeout alarm interrupts us
  if (ready != 1) abort();  // a server that neither answers nor hangs up within 5 s is a hang
  auto reply = std::make_unique<Reply>();
  std::vector<vipc::common::UniqueFd> got;
  (void)recv_with_fds(fd.get(), reply.get(), sizeof(Reply), got);

  // Every so often, check the server still serves a real client.
  if (++g_runs % 256 == 0) {
    ClientOptions options;
    options.shm_dir = g_dir;
    Client client(g_name, "s", false, options);
    // Hang-ups of earlier inputs' connections free their lease slots in the
    // listener thread, asynchronously: allow it a moment.
    bool ok = client.connect();
    for (int i = 0; i < 200 && !ok; i++) {
      usleep(5000);
      ok = client.connect();
    }
    if (!ok) abort();
  }
  return 0;
}
