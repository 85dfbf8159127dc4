// One benchmark, two builds: written only against the reference's public C++
// API, so the same source builds against visionipc (cmake, this folder) and
// against commaai/msgq's own sources (tools/bench_cpp_reference.sh). Two
// processes (fork), each measurement in its own pair of topics:
//   msgq  64 B one-way: ping-pong with blocking receive(), one-way = RTT / 2
//   vipc  4K (3840x2160 NV12) frame handoff: the server writes the frame's
//         first bytes, sends with its CLOCK_MONOTONIC in timestamp_sof; the
//         client's latency is recv() return time minus that (paced frames)
// Output: one JSON line per measurement (median and p99 in microseconds).
//   bench_compat [--iters 20000] [--frames 300] [--tag NAME (topic and server names)]
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "msgq/ipc.h"
#include "msgq/visionipc/visionipc_client.h"
#include "msgq/visionipc/visionipc_server.h"

static uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

static void report(const char* what, std::vector<double> us) {
  std::sort(us.begin(), us.end());
  std::printf("{\"bench\": \"%s\", \"n\": %zu, \"median_us\": %.2f, \"p99_us\": %.2f}\n", what, us.size(),
              us[us.size() / 2], us[us.size() * 99 / 100]);
  std::fflush(stdout);
}

static void echo(const std::string& tag, int iters) {
  std::unique_ptr<Context> c(Context::create());
  std::unique_ptr<SubSocket> ping(SubSocket::create(c.get(), tag + "_ping"));
  std::unique_ptr<PubSocket> pong(PubSocket::create(c.get(), tag + "_pong"));
  for (int i = 0; i < iters; i++) {
    std::unique_ptr<Message> m(ping->receive());
    if (!m) std::exit(1);
    pong->send(m->getData(), m->getSize());
  }
}

static void bench_msgq(const std::string& tag, int iters) {
  std::unique_ptr<Context> c(Context::create());
  std::unique_ptr<PubSocket> ping(PubSocket::create(c.get(), tag + "_ping"));
  std::unique_ptr<SubSocket> pong(SubSocket::create(c.get(), tag + "_pong"));
  pid_t child = fork();
  if (child == 0) {
    echo(tag, iters + 1);
    std::_Exit(0);
  }
  char payload[64] = {};
  pong->setTimeout(100);
  for (;;) {  // until the echo process is subscribed and answering
    ping->send(payload, sizeof(payload));
    if (std::unique_ptr<Message> m{pong->receive()}) break;
  }
  pong->setTimeout(-1);
  std::vector<double> one_way;
  for (int i = 0; i < iters; i++) {
    const uint64_t t0 = now_ns();
    ping->send(payload, sizeof(payload));
    std::unique_ptr<Message> m(pong->receive());
    one_way.push_back((now_ns() - t0) / 2000.0);
  }
  waitpid(child, nullptr, 0);
  report("msgq_64B_one_way", one_way);
}

static void bench_vipc(const std::string& tag, int frames) {
  const size_t w = 3840, h = 2160;
  int ready[2];
  if (pipe(ready) != 0) std::exit(1);
  pid_t child = fork();
  if (child == 0) {
    VisionIpcServer server(tag);
    server.create_buffers(0, 4, w, h);
    server.start_listener();
    char go = 0;
    if (read(ready[0], &go, 1) != 1) std::_Exit(1);  // the client is connected
    for (int i = 0; i < frames + 20; i++) {
      VisionBuf* buf = server.get_buffer(0);
      std::memset(buf->addr, i & 0xff, 4096);  // touch the frame, as a producer would
      VisionIpcBufExtra extra{uint32_t(i), now_ns(), 0, true};
      server.send(buf, &extra);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::_Exit(0);
  }
  VisionIpcClient client(tag, 0, false);
  client.connect(true);
  if (write(ready[1], "g", 1) != 1) std::exit(1);
  std::vector<double> latency;
  VisionIpcBufExtra extra{};
  for (int i = 0; i < frames;) {
    VisionBuf* buf = client.recv(&extra, 1000);
    if (buf == nullptr) break;
    const uint64_t t = now_ns();
    if (static_cast<uint8_t*>(buf->addr)[0] != (extra.frame_id & 0xff)) std::exit(2);
    latency.push_back((t - extra.timestamp_sof) / 1000.0);
    i++;
  }
  waitpid(child, nullptr, 0);
  report("vipc_4k_frame_handoff", latency);
}

int main(int argc, char** argv) {
  int iters = 20000, frames = 300;
  std::string tag = "cppbench" + std::to_string(getpid());
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--iters") == 0) iters = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--frames") == 0) frames = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--tag") == 0) tag = argv[i + 1];
  }
  bench_msgq(tag, iters);
  bench_vipc(tag, frames);
  return 0;
}
