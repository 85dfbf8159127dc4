// VisionIPC core: formats, pool layout, the handshake (including a hostile
// server), the lease / generation protocol and server restarts. Server and
// clients share one process here; tests/test_visionipc*.py cover processes.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "check.h"
#include "check_errors.h"
#include "common/clock.h"
#include "common/frame_copy.h"
#include "test_support.h"
#include "visionipc/client.h"
#include "visionipc/protocol.h"
#include "visionipc/server.h"

using namespace vipc::visionipc;

namespace {

std::string unique_prefix() {
  static int n = 0;
  return "cpptest" + std::to_string(getpid()) + "x" + std::to_string(n++);
}

struct Rig {
  testing::TempDir dir;
  std::string prefix = unique_prefix();
  ServerOptions sopt() const { return ServerOptions{prefix, dir.path(), {}}; }
  ClientOptions copt() const { return ClientOptions{prefix, dir.path(), {}}; }
};

bool recv_frame(Client& c, Frame& f, int64_t timeout_ms = 1000) {
  return c.recv(vipc::common::deadline_after(timeout_ms * 1'000'000), f) == vipc::common::WaitStatus::kReady;
}

void fill(Server& s, const std::string& stream, uint8_t value, uint64_t frame_id) {
  const Acquired a = s.get_buffer(stream);
  std::memset(a.data, value, s.geometry(stream).size);
  s.send(stream, a.index, a.generation, frame_id, frame_id * 10, frame_id * 10 + 1);
}

}  // namespace

TEST(formats_follow_the_documented_layout) {
  const struct {
    Format f;
    uint32_t bpp;
  } single[] = {{Format::kGray8, 1}, {Format::kRGB8, 3}, {Format::kBGR8, 3}, {Format::kRaw16, 2}};
  for (uint32_t w : {1u, 63u, 64u, 65u, 1928u}) {
    for (auto [f, bpp] : single) {
      const Geometry g = make_geometry(f, w, 7);
      CHECK_EQ(g.stride % kStrideAlign, 0u);
      CHECK(g.stride >= w * bpp && g.stride < w * bpp + kStrideAlign);
      CHECK_EQ(g.size, uint64_t{g.stride} * 7);
      CHECK(geometry_problem(g).empty());
    }
  }
  for (Format f : {Format::kNV12, Format::kI420}) {
    const Geometry g = make_geometry(f, 1928, 1208);
    CHECK_EQ(g.stride, 1984u);
    CHECK_EQ(g.uv_offset, 1984u * 1208);
    CHECK_EQ(g.size, uint64_t{1984} * 1208 * 3 / 2);
    CHECK_THROWS_KIND(make_geometry(f, 3, 2), vipc::common::ErrorKind::kInvalidArgument);
  }
  CHECK_THROWS_KIND(make_geometry(Format::kNV12, 0, 2), vipc::common::ErrorKind::kInvalidArgument);
  CHECK_THROWS_KIND(make_geometry(static_cast<Format>(42), 2, 2), vipc::common::ErrorKind::kInvalidArgument);
  CHECK_THROWS_KIND(custom_geometry(100, 100, 100, 100, 0),
                    vipc::common::ErrorKind::kInvalidArgument);  // stride*h > size
  const PoolLayout l = make_layout(3, 5000);
  CHECK_EQ(l.slot_size, 8192u);
  CHECK_EQ(l.data_offset % kBufferAlign, 0u);
  CHECK_EQ(l.total_size, l.data_offset + 3 * 8192);
  CHECK_THROWS_KIND(make_layout(0, 10), vipc::common::ErrorKind::kInvalidArgument);
}

TEST(frames_arrive_intact_with_their_metadata) {
  Rig rig;
  Server server("cam", rig.sopt());
  server.create_buffers("road", 3, make_geometry(Format::kNV12, 64, 32));
  server.start_listener();
  Client client("cam", "road", false, rig.copt());
  CHECK(client.connect());
  CHECK_EQ(client.count(), 3u);
  CHECK_EQ(client.geometry().size, server.geometry("road").size);
  for (uint64_t id = 1; id <= 10; id++) {
    fill(server, "road", static_cast<uint8_t>(id), id);
    Frame f;
    CHECK(recv_frame(client, f));
    CHECK(f.valid);
    CHECK_EQ(f.frame_id, id);
    CHECK_EQ(f.timestamp_eof, id * 10 + 1);
    const uint8_t* p = client.buffer(f.index);
    for (uint64_t i = 0; i < client.geometry().size; i++) CHECK_EQ(p[i], static_cast<uint8_t>(id));
  }
  Frame none;
  CHECK(!recv_frame(client, none, 10));
  auto names = Client::list_streams("cam", rig.copt());
  CHECK(names.has_value() && names->size() == 1 && (*names)[0] == "road");
}

TEST(missing_server_or_stream_connects_false) {
  Rig rig;
  Client nobody("ghost", "road", false, rig.copt());
  CHECK(!nobody.connect());
  CHECK(!Client::list_streams("ghost", rig.copt()).has_value());
  Server server("cam", rig.sopt());
  server.create_buffers("road", 1, make_geometry(Format::kGray8, 8, 8));
  server.start_listener();
  Client wrong("cam", "driver", false, rig.copt());
  CHECK(!wrong.connect());
  CHECK_THROWS_KIND(server.get_buffer("driver"), vipc::common::ErrorKind::kInvalidArgument);
  CHECK_THROWS_KIND(server.create_buffers("road", 1, make_geometry(Format::kGray8, 8, 8)),
                    vipc::common::ErrorKind::kInvalidArgument);
  CHECK_THROWS_KIND(Server("bad/name", rig.sopt()), vipc::common::ErrorKind::kInvalidArgument);
}

TEST(a_leased_buffer_is_skipped_until_every_buffer_is_leased) {
  Rig rig;
  Server server("cam", rig.sopt());
  server.create_buffers("s", 2, make_geometry(Format::kGray8, 16, 16));
  server.start_listener();
  Client client("cam", "s", false, rig.copt());
  CHECK(client.connect());
  fill(server, "s", 1, 1);
  Frame held;
  CHECK(recv_frame(client, held));
  CHECK(held.valid);  // recv leased it
  for (int i = 0; i < 5; i++) {
    const Acquired a = server.get_buffer("s");
    CHECK(a.index != held.index);
    server.send("s", a.index, a.generation, 2, 0, 0);
    CHECK(client.is_valid(held.index, held.generation));
  }
  // A buffer sent twice under one generation is refused.
  const Acquired a = server.get_buffer("s");
  server.send("s", a.index, a.generation, 3, 0, 0);
  CHECK_THROWS_KIND(server.send("s", a.index, a.generation, 3, 0, 0), vipc::common::ErrorKind::kInvalidArgument);

  // One buffer and a lease on it: the producer takes it anyway, the holder is told.
  Server one("one", rig.sopt());
  one.create_buffers("s", 1, make_geometry(Format::kGray8, 16, 16));
  one.start_listener();
  Client c1("one", "s", false, rig.copt());
  CHECK(c1.connect());
  fill(one, "s", 1, 1);
  Frame f;
  CHECK(recv_frame(c1, f) && f.valid);
  const Acquired b = one.get_buffer("s");
  CHECK_EQ(b.index, f.index);
  CHECK(!c1.is_valid(f.index, f.generation));
  CHECK(!c1.take_lease(f.index, f.generation));
}

TEST(a_closed_client_no_longer_pins_its_buffer) {
  Rig rig;
  Server server("cam", rig.sopt());
  server.create_buffers("s", 2, make_geometry(Format::kGray8, 16, 16));
  server.start_listener();
  auto client = std::make_unique<Client>("cam", "s", false, rig.copt());
  CHECK(client->connect());
  CHECK_EQ(server.clients("s"), 1u);
  fill(server, "s", 1, 1);
  Frame held;
  CHECK(recv_frame(*client, held) && held.valid);
  client.reset();  // the listener sees the hang-up (L3, cpp/visionipc/pool.h)
  const int64_t deadline = vipc::common::monotonic_ns() + 5'000'000'000;
  while (server.clients("s") != 0 && vipc::common::monotonic_ns() < deadline) usleep(1000);
  CHECK_EQ(server.clients("s"), 0u);
  // Least recently sent first: the formerly leased buffer is never-sent's successor.
  const Acquired a = server.get_buffer("s");
  server.send("s", a.index, a.generation, 2, 0, 0);
  CHECK(a.index != held.index);
  CHECK_EQ(server.get_buffer("s").index, held.index);
}

TEST(clients_follow_a_restarted_server) {
  Rig rig;
  auto server = std::make_unique<Server>("cam", rig.sopt());
  server->create_buffers("s", 2, make_geometry(Format::kGray8, 16, 16));
  server->start_listener();
  Client client("cam", "s", false, rig.copt());
  CHECK(client.connect());
  const uint64_t first_id = client.server_id();
  fill(*server, "s", 1, 1);
  Frame f;
  CHECK(recv_frame(client, f));
  server.reset();
  CHECK(!client.connected());
  server = std::make_unique<Server>("cam", rig.sopt());
  server->create_buffers("s", 3, make_geometry(Format::kGray8, 32, 16));
  server->start_listener();
  fill(*server, "s", 9, 7);
  CHECK(recv_frame(client, f));
  CHECK(client.server_id() != first_id);
  CHECK_EQ(client.count(), 3u);
  CHECK_EQ(f.frame_id, 7u);
  CHECK(f.valid);
  CHECK_EQ(client.buffer(f.index)[0], 9);
}

// A hostile server: answers the handshake with out-of-range fields. The
// client must refuse (kSegment), never map or index with them.
TEST(a_hostile_handshake_is_refused) {
  Rig rig;
  const std::string addr = socket_address(rig.prefix, "evil");
  vipc::common::UniqueFd lfd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, addr.data(), addr.size());
  CHECK(bind(lfd.get(), reinterpret_cast<sockaddr*>(&sa),
             static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + addr.size())) == 0);
  CHECK(listen(lfd.get(), 8) == 0);
  vipc::common::UniqueFd pool = create_sealed_memfd("evil", 8192);
  vipc::common::UniqueFd leases = create_sealed_memfd("evil-l", kLeaseTableSize);
  auto good = std::make_unique<Reply>();
  std::memset(good.get(), 0, sizeof(Reply));
  good->magic = kProtocolMagic;
  good->version = kProtocolVersion;
  good->server_id = 1;
  good->format = static_cast<uint32_t>(Format::kGray8);
  good->width = good->height = good->stride = 64;
  good->buffer_size = 4096;
  good->count = 1;
  const PoolLayout l = make_layout(1, 4096);
  good->slot_size = l.slot_size;
  good->data_offset = l.data_offset;
  good->pool_size = l.total_size;
  good->lease_table_size = kLeaseTableSize;
  std::vector<void (*)(Reply&)> corruptions = {
      [](Reply& r) { r.count = 100000; },
      [](Reply& r) { r.buffer_size = 1ull << 40; },
      [](Reply& r) { r.lease_slot = 1000; },
      [](Reply& r) { r.stride = 1; },
      [](Reply& r) { r.pool_size = 1ull << 20; },  // claims more than the memfd holds
      [](Reply& r) { r.format = 99; },
  };
  std::thread evil([&] {
    for (auto corrupt : corruptions) {
      vipc::common::UniqueFd c(accept(lfd.get(), nullptr, nullptr));
      Request req;
      std::vector<vipc::common::UniqueFd> junk;
      recv_with_fds(c.get(), &req, sizeof(req), junk);
      Reply r = *good;
      corrupt(r);
      send_with_fds(c.get(), &r, sizeof(r), {pool.get(), leases.get(), pool.get()});  // third: the topic
    }
  });
  for (size_t i = 0; i < corruptions.size(); i++) {
    Client client("evil", "s", false, rig.copt());
    CHECK_THROWS_KIND(client.connect(), vipc::common::ErrorKind::kSegment);
  }
  evil.join();
}

// A producer thread flat out, a reader thread checking every byte of every
// frame it holds a valid lease on: a lease must protect the pixels.
TEST(leased_frames_are_never_overwritten_under_a_fast_producer) {
  Rig rig;
  Server server("cam", rig.sopt());
  server.create_buffers("s", 3, make_geometry(Format::kGray8, 64, 64));
  server.start_listener();
  Client client("cam", "s", true, rig.copt());
  CHECK(client.connect());
  std::atomic<bool> stop{false};
  std::thread producer([&] {
    for (uint64_t id = 1; !stop.load(std::memory_order_relaxed); id++) fill(server, "s", static_cast<uint8_t>(id), id);
  });
  uint64_t checked = 0;
  const int64_t end = vipc::common::monotonic_ns() + 500'000'000;
  while (vipc::common::monotonic_ns() < end || checked < 20) {
    Frame f;
    if (!recv_frame(client, f, 100) || !f.valid) continue;
    const uint8_t* p = client.buffer(f.index);
    for (uint64_t i = 0; i < client.geometry().size; i += 61) CHECK_EQ(p[i], static_cast<uint8_t>(f.frame_id));
    CHECK(client.is_valid(f.index, f.generation));
    client.release_lease();
    checked++;
  }
  stop.store(true);
  producer.join();
  CHECK(checked >= 20);
}

// The threading contract: each stream may have its own producer thread, all
// sending at once, while clients connect and hang up (the listener thread)
// and another thread adds a stream. Every frame a client holds a valid lease
// on is its stream's own, intact, and each client's frames come in order.
TEST(each_stream_may_have_its_own_producer_thread) {
  Rig rig;
  ServerOptions options = rig.sopt();
  options.wake = vipc::msgq::WakeMode::kHandoff;  // the clients' hand-offs run beside the sends too
  Server server("cam", options);
  const std::vector<std::string> streams = {"road", "wide", "driver"};
  for (const auto& name : streams) server.create_buffers(name, 6, make_geometry(Format::kGray8, 64, 48));
  server.start_listener();
  constexpr uint64_t kFrames = 400;
  std::atomic<int> started{0}, finished{0};
  std::atomic<uint64_t> checked{0};
  std::vector<std::thread> threads;
  for (size_t k = 0; k < streams.size(); k++) {
    const std::string name = streams[k];
    const auto tag = [k](uint64_t id) { return static_cast<uint8_t>(id * 3 + k); };
    for (int c = 0; c < 2; c++) {
      threads.emplace_back([&, name, tag] {
        Client client("cam", name, false, rig.copt());
        CHECK(client.connect());
        uint64_t last = 0;
        while (last < kFrames) {
          Frame f;
          if (!recv_frame(client, f, 2000)) break;
          CHECK(f.frame_id > last);
          last = f.frame_id;
          const uint8_t* p = client.buffer(f.index);
          const uint8_t want = tag(f.frame_id);
          bool intact = true;
          for (uint64_t i = 0; i < client.geometry().size; i += 97) intact = intact && p[i] == want;
          if (client.is_valid(f.index, f.generation)) {
            CHECK(intact);  // read under a valid lease: the stream's own frame, untouched
            checked.fetch_add(1, std::memory_order_relaxed);
          }
        }
        CHECK_EQ(last, kFrames);
      });
    }
    threads.emplace_back([&, name, tag] {
      while (server.clients(name) < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      started.fetch_add(1);
      for (uint64_t id = 1; id <= kFrames; id++) {
        const Acquired a = server.get_buffer(name);
        std::memset(a.data, tag(id), server.geometry(name).size);
        server.send(name, a.index, a.generation, id, id, id);
        if (id % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      finished.fetch_add(1);
    });
  }
  threads.emplace_back([&] {  // connections come and go on the listener thread meanwhile
    while (started.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    for (int i = 0; finished.load() < 3; i++) {
      Client churn("cam", streams[i % streams.size()], true, rig.copt());
      CHECK(churn.connect());
      Frame f;
      recv_frame(churn, f, 5);
    }
  });
  threads.emplace_back([&] {  // and a new stream is added while the others send
    server.create_buffers("late", 2, make_geometry(Format::kGray8, 16, 16));
    fill(server, "late", 7, 1);
  });
  for (auto& t : threads) t.join();
  CHECK(checked.load() > 0);
  CHECK_EQ(server.streams().size(), 4u);
}

// close() from another thread, while frames flow: the client's close ends its
// recv() (kClosed) or makes the reader's next call throw kClosed, and the
// server's close makes the producer's next call throw kClosed; nothing is
// unmapped under a call in flight (the sanitizer builds run this).
TEST(client_and_server_close_from_another_thread_while_frames_flow) {
  for (int round = 0; round < 40; round++) {
    Rig rig;
    Server server("cam", rig.sopt());
    server.create_buffers("s", 4, make_geometry(Format::kGray8, 128, 64));
    server.start_listener();
    Client client("cam", "s", round % 2 == 1, rig.copt());
    CHECK(client.connect());
    std::atomic<bool> reading{false};
    const auto closed = [](const vipc::common::Error& e) { return e.kind() == vipc::common::ErrorKind::kClosed; };
    std::thread producer([&] {
      try {
        for (uint64_t id = 1;; id++) {
          fill(server, "s", static_cast<uint8_t>(id), id);
          if (id % 8 == 0) std::this_thread::yield();
        }
      } catch (const vipc::common::Error& e) {
        CHECK(closed(e));
      }
    });
    std::thread reader([&] {
      try {
        for (;;) {
          Frame f;
          const auto st = client.recv(vipc::common::deadline_after(1'000'000'000), f);
          if (st == vipc::common::WaitStatus::kClosed) break;
          if (st != vipc::common::WaitStatus::kReady) continue;
          reading.store(true);
          const std::shared_ptr<Mapping> mapped = client.pool();  // what keeps p readable after a close()
          const uint8_t* p = client.buffer(f.index);
          bool intact = true;
          for (uint64_t i = 8; i < client.geometry().size; i += 53)
            intact = intact && p[i] == static_cast<uint8_t>(f.frame_id);
          if (client.is_valid(f.index, f.generation)) CHECK(intact);
          client.release_lease();
          (void)client.take_lease(f.index, f.generation);
        }
      } catch (const vipc::common::Error& e) {
        CHECK(closed(e));
      }
    });
    while (!reading.load()) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::microseconds(50 * (round % 7)));
    client.close();
    reader.join();
    CHECK(!client.is_valid(0, 1));
    CHECK_THROWS_KIND(client.buffer(0), vipc::common::ErrorKind::kClosed);
    Frame f;
    CHECK(client.recv(vipc::common::deadline_after(0), f) == vipc::common::WaitStatus::kClosed);
    server.close();
    producer.join();
    CHECK_THROWS_KIND(server.get_buffer("s"), vipc::common::ErrorKind::kClosed);
  }
}

// The copying sends' copy: every byte, at any alignment of either side, on both
// sides of the streaming-store threshold; nothing written outside the range.
TEST(frame_copy_copies_every_byte_at_any_alignment) {
  const size_t big = vipc::common::kStreamingCopyMin;
  for (size_t n : {size_t{0}, size_t{1}, size_t{63}, big - 1, big, big + 37, big + 4096 + 5}) {
    for (size_t src_off : {0, 1, 7, 63}) {
      for (size_t dst_off : {0, 1, 15, 64}) {
        std::vector<unsigned char> src(n + 64), dst(n + 128, 0xEE);
        for (size_t i = 0; i < src.size(); i++) src[i] = static_cast<unsigned char>(i * 131 + n);
        vipc::common::copy_frame(dst.data() + dst_off, src.data() + src_off, n);
        CHECK(std::memcmp(dst.data() + dst_off, src.data() + src_off, n) == 0);
        for (size_t i = 0; i < dst_off; i++) CHECK(dst[i] == 0xEE);
        for (size_t i = dst_off + n; i < dst.size(); i++) CHECK(dst[i] == 0xEE);
      }
    }
  }
}

int main(int argc, char** argv) { return check::run_all(argc, argv); }
