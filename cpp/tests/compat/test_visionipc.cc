// The reference's msgq/visionipc/tests/test_visionipc.py scenarios, in C++
// against its header names ("msgq/visionipc/visionipc_server.h", ...).
#include <cstring>
#include <memory>
#include <set>
#include <string>

#include "compat_check.h"
#include "msgq/visionipc/visionipc_client.h"
#include "msgq/visionipc/visionipc_server.h"

struct Vipc {
  std::unique_ptr<VisionIpcServer> server;
  std::unique_ptr<VisionIpcClient> client;
};

static Vipc setup_vipc(const std::string& name, std::set<VisionStreamType> stream_types, size_t num_buffers = 1,
                       size_t width = 100, size_t height = 100, bool conflate = false) {
  Vipc v;
  v.server = std::make_unique<VisionIpcServer>(name);
  for (VisionStreamType t : stream_types) v.server->create_buffers(t, num_buffers, width, height);
  v.server->start_listener();
  v.client = std::make_unique<VisionIpcClient>(name, *stream_types.begin(), conflate);
  CHECK(v.client->connect(true));
  return v;
}

// server.send(0, buf, frame_id=...) of the Python test: fill a buffer, then send it.
static void send_frame(VisionIpcServer& server, uint32_t frame_id, uint64_t first_word = 0) {
  VisionBuf* buf = server.get_buffer(0);
  CHECK(buf != nullptr && buf->addr != nullptr);
  std::memset(buf->addr, 0, buf->len);
  std::memcpy(buf->addr, &first_word, sizeof(first_word));
  VisionIpcBufExtra extra{frame_id, 0, 0, true};
  server.send(buf, &extra);
}

TEST(test_connect) {
  Vipc v = setup_vipc("camerad", {0});
  CHECK(v.client->is_connected());
}

TEST(test_available_streams) {
  Vipc v = setup_vipc("camerad", {0, 2});
  CHECK(VisionIpcClient::getAvailableStreams("camerad", true) == (std::set<VisionStreamType>{0, 2}));
}

TEST(test_buffers) {
  const size_t width = 100, height = 200, num_buffers = 5;
  Vipc v = setup_vipc("camerad", {0}, num_buffers, width, height);
  CHECK(v.client->buffers[0].width == width);
  CHECK(v.client->buffers[0].height == height);
  CHECK(v.client->buffers[0].len > 0);
  CHECK(v.client->num_buffers == static_cast<int>(num_buffers));
  CHECK(v.client->buffers[0].uv == v.client->buffers[0].y + v.client->buffers[0].uv_offset);
}

TEST(test_send_single_buffer) {
  Vipc v = setup_vipc("camerad", {0});
  send_frame(*v.server, 1337, 1234);
  VisionIpcBufExtra extra{};
  VisionBuf* recv_buf = v.client->recv(&extra);
  CHECK(recv_buf != nullptr);
  uint64_t first = 0;
  std::memcpy(&first, recv_buf->addr, sizeof(first));
  CHECK(first == 1234);
  CHECK(recv_buf->len == v.client->buffers[0].len);
  CHECK(extra.frame_id == 1337 && extra.valid);
  CHECK(recv_buf->get_frame_id() == 1337);
}

TEST(test_no_conflate) {
  Vipc v = setup_vipc("camerad", {0});
  send_frame(*v.server, 1);
  send_frame(*v.server, 2);
  VisionIpcBufExtra extra{};
  CHECK(v.client->recv(&extra) != nullptr && extra.frame_id == 1);
  CHECK(v.client->recv(&extra) != nullptr && extra.frame_id == 2);
}

TEST(test_conflate) {
  Vipc v = setup_vipc("camerad", {0}, 1, 100, 100, true);
  send_frame(*v.server, 1);
  send_frame(*v.server, 2);
  VisionIpcBufExtra extra{};
  CHECK(v.client->recv(&extra) != nullptr && extra.frame_id == 2);
  CHECK(v.client->recv(&extra, 5) == nullptr);
}

TEST(test_get_buffer_by_index_and_bad_input_throw_not_abort) {
  Vipc v = setup_vipc("camerad", {0}, 2);
  VisionBuf* b1 = v.server->get_buffer(0, 1);
  CHECK(b1->idx == 1);
  std::memset(b1->addr, 7, b1->len);
  VisionIpcBufExtra extra{42, 0, 0, true};
  v.server->send(b1, &extra);
  VisionBuf* got = v.client->recv(&extra);
  CHECK(got != nullptr && extra.frame_id == 42 && static_cast<uint8_t*>(got->addr)[got->len - 1] == 7);
  bool threw = false;
  try {
    v.server->create_buffers(1, 0, 100, 100);
  } catch (const std::exception&) {
    threw = true;
  }
  CHECK(threw);
}

int main() { return run_compat_tests(); }
