// VisionIPC frames: a FrameServer owns pools of frame buffers in shared memory
// and publishes them; FrameClients map a stream's pool and receive frames
// without a copy. Wire-compatible with the Python visionipc package.
//
// Zero copy, both ways, with leases and generations:
//   server: get_buffer() checks a buffer out (a WriteBuffer; no client is
//     reading it), the producer fills data(), send() publishes it. A buffer a
//     client still holds is not handed out while another one is free.
//   client: recv() returns a Frame that leases its buffer until the next
//     recv(). Frame::valid() re-checks the buffer's generation: false means
//     the server had to recycle it (every buffer was leased), so bytes read
//     since may be torn; never a silent torn frame.
//
// Threads: each stream's get_buffer/send belong to one producer thread at a
// time, and each stream may have its own (the listener runs on its own
// thread); a FrameClient is used by one thread at a time. close() of either
// may come from any thread: later calls throw Error(closed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "vipc/error.h"

namespace vipc {

enum class PixelFormat : uint32_t { nv12, i420, gray8, rgb8, bgr8, raw16, custom };

// The byte layout of one frame (rows start 64-byte aligned; NV12/I420 have a
// chroma plane at uv_offset). custom: create_buffers_with_sizes().
struct Geometry {
  PixelFormat format = PixelFormat::nv12;
  uint32_t width = 0, height = 0;
  uint32_t stride = 0;     // bytes from one row to the next (the Y plane for NV12/I420)
  uint32_t uv_offset = 0;  // start of the chroma plane(s); 0 for single-plane formats
  uint64_t size = 0;       // bytes of one frame
};

struct FrameInfo {
  uint64_t frame_id = 0;
  uint64_t timestamp_sof = 0;  // start / end of frame, in the producer's clock
  uint64_t timestamp_eof = 0;
};

struct ServerOptions {
  RunOptions run;
  std::vector<unsigned> allowed_uids = {};  // users besides our own that may connect
  Wake wake = Wake::all;                    // how send() wakes sleeping clients (MSGQ_WAKE)
};

struct ClientOptions {
  RunOptions run;
  bool conflate = false;                    // recv() skips to the newest frame
  std::vector<unsigned> trusted_uids = {};  // server users trusted besides our own and root
};

// One buffer checked out of a server's pool: fill data(), then FrameServer::send().
// Move-only; a buffer dropped unsent stays checked out until the pool runs out
// of free buffers and recycles it.
class VIPC_API WriteBuffer {
 public:
  WriteBuffer() = default;
  std::span<std::byte> data() const { return data_; }
  uint32_t index() const { return index_; }
  uint64_t generation() const { return generation_; }  // odd while checked out
  const std::string& stream() const { return stream_; }
  explicit operator bool() const { return !data_.empty(); }

  WriteBuffer(WriteBuffer&& other) noexcept { *this = std::move(other); }
  WriteBuffer& operator=(WriteBuffer&& other) noexcept;
  WriteBuffer(const WriteBuffer&) = delete;
  WriteBuffer& operator=(const WriteBuffer&) = delete;

 private:
  friend class FrameServer;
  std::string stream_;
  uint32_t index_ = 0;
  uint64_t generation_ = 0;
  std::span<std::byte> data_;
  std::shared_ptr<void> mapping_;  // keeps the pool mapped while the buffer is out
};

class VIPC_API FrameServer {
 public:
  explicit FrameServer(std::string_view name, const ServerOptions& options = {});
  ~FrameServer();  // stops the listener; clients' mappings stay valid until they drop them
  FrameServer(FrameServer&&) noexcept;
  FrameServer& operator=(FrameServer&&) noexcept;

  // A stream of `count` (1-256) buffers; call before start_listener().
  void create_buffers(std::string_view stream, uint32_t count, uint32_t width, uint32_t height,
                      PixelFormat format = PixelFormat::nv12);
  void create_buffers_with_sizes(std::string_view stream, uint32_t count, uint32_t width, uint32_t height,
                                 uint64_t size, uint32_t stride, uint32_t uv_offset);
  void start_listener();

  WriteBuffer get_buffer(std::string_view stream);  // never blocks
  // Publishes the buffer (consumed: its data() must not be written after this).
  void send(WriteBuffer&& buffer, const FrameInfo& info = {});

  Geometry geometry(std::string_view stream) const;
  uint32_t num_buffers(std::string_view stream) const;
  uint32_t num_clients(std::string_view stream) const;  // connected now
  // How send() wakes sleeping clients, and how many of the stream's clients this
  // server's own system calls have woken so far (Wake::handoff: at most one per frame).
  Wake wake() const;
  uint64_t readers_woken(std::string_view stream) const;
  std::vector<std::string> streams() const;
  const std::string& name() const;
  void close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A received frame: its buffer's bytes (zero copy) and what the server sent with it.
class VIPC_API Frame {
 public:
  std::span<const std::byte> data() const { return data_; }
  uint32_t index() const { return index_; }
  uint64_t generation() const { return generation_; }
  const FrameInfo& info() const { return info_; }
  uint64_t publish_ns() const { return publish_ns_; }  // CLOCK_MONOTONIC at the server's send
  // The buffer still holds this frame (re-read after reading the bytes you rely on).
  bool valid() const;

 private:
  friend class FrameClient;
  std::span<const std::byte> data_;
  uint32_t index_ = 0;
  uint64_t generation_ = 0, epoch_ = 0, publish_ns_ = 0;
  FrameInfo info_;
  std::shared_ptr<void> owner_;  // the client state and the mapping the bytes live in
};

class VIPC_API FrameClient {
 public:
  FrameClient(std::string_view name, std::string_view stream, const ClientOptions& options = {});
  ~FrameClient();
  FrameClient(FrameClient&&) noexcept;
  FrameClient& operator=(FrameClient&&) noexcept;

  // Connects (retrying until the server and stream exist) within the timeout.
  bool connect(Timeout timeout = Timeout{0});
  bool connected();
  // The next frame, or nullopt within the timeout. Reconnects by itself when
  // the server restarts.
  std::optional<Frame> recv(Timeout timeout = kForever);

  Geometry geometry() const;  // once connected
  uint32_t num_buffers() const;
  // Event loops: arm(), wait until fd() is readable, then recv(Timeout{0}).
  int fd();
  bool arm();
  void close();

  // Stream names a server offers; nullopt when no server of that name answers.
  static std::optional<std::vector<std::string>> available_streams(std::string_view name,
                                                                   const ClientOptions& options = {});

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace vipc
