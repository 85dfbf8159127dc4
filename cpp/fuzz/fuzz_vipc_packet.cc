// Fuzz target: a VisionIPC client receiving frame packets and reading buffer
// metadata that a hostile or corrupt peer wrote (cpp/visionipc/client.cc
// handle / take_lease / is_valid). A real server and a connected client run
// in this process; the fuzzer publishes raw packets on the stream's msgq
// topic (taking it over from the server: "last publisher wins") and
// scribbles over the pool's BufferMeta words, which the client reads.
// The client must drop bad packets (counted in dropped()), never index a
// buffer out of range, and never wait unboundedly.
//
// Input: rounds of [op][operands...]
//   op 0: publish a packet of the fuzzer's bytes (any length);
//   op 1: publish a 64-byte packet with magic, server id and stream stamped;
//   op 2: overwrite one buffer's metadata (generation, frame_id, timestamps);
//   op 3: receive (no waiting) and check validity of what came.
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/errors.h"
#include "fuzz_input.h"
#include "msgq/publisher.h"
#include "visionipc/client.h"
#include "visionipc/format.h"
#include "visionipc/pool.h"
#include "visionipc/protocol.h"
#include "visionipc/server.h"

namespace {

using namespace vipc::visionipc;

constexpr uint32_t kBuffers = 3;
Server* g_server = nullptr;
Client* g_client = nullptr;
vipc::msgq::Publisher* g_raw = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string dir = fuzz::make_temp_dir();
  const std::string name = "fuzzpkt" + std::to_string(getpid());
  ServerOptions so;
  so.shm_dir = dir;
  g_server = new Server(name, so);
  g_server->create_buffers("s", kBuffers, make_geometry(Format::kGray8, 64, 8));
  g_server->start_listener();
  ClientOptions co;
  co.shm_dir = dir;
  g_client = new Client(name, "s", false, co);
  if (!g_client->connect()) abort();
  vipc::msgq::SegmentSpec spec;
  spec.dir = dir;
  spec.basename = vipc::msgq::segment_basename("", endpoint_name(name, "s"));
  g_raw = new vipc::msgq::Publisher(spec);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  auto* meta = reinterpret_cast<BufferMeta*>(g_server->pool("s")->data());
  for (int round = 0; round < 32 && !in.empty(); round++) {
    try {
      switch (in.take<uint8_t>() % 4) {
        case 0: {
          std::vector<uint8_t> raw(in.take<uint8_t>());
          in.fill(raw.data(), raw.size());
          g_raw->send(raw.data(), raw.size());
          break;
        }
        case 1: {
          Packet p;
          in.fill(&p, sizeof(p));
          p.magic = kProtocolMagic;
          p.server_id = g_server->id();
          p.stream_ordinal = 0;
          if (p.index & 0x100) p.index %= kBuffers;  // mostly in range, sometimes not
          g_raw->send(&p, sizeof(p));
          break;
        }
        case 2: {
          BufferMeta& m = meta[in.take<uint8_t>() % kBuffers];
          m.generation.store(in.take<uint64_t>(), std::memory_order_relaxed);
          m.frame_id.store(in.take<uint64_t>(), std::memory_order_relaxed);
          m.timestamp_sof.store(in.take<uint64_t>(), std::memory_order_relaxed);
          break;
        }
        case 3: {
          Frame f;
          // A deadline in the past: take what is there, never wait.
          if (g_client->recv(vipc::common::monotonic_ns(), f) == vipc::common::WaitStatus::kReady) {
            const uint8_t* b = g_client->buffer(f.index);
            volatile uint8_t sum = b[0] + b[g_client->geometry().size - 1];
            (void)sum;
            (void)g_client->is_valid(f.index, f.generation);
            g_client->release_lease();
          }
          break;
        }
      }
    } catch (const vipc::common::Error&) {
    }
  }
  return 0;
}
