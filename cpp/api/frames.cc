// vipc::FrameServer / FrameClient on the core's VisionIPC server and client
// (cpp/visionipc): leases, generations and the wire protocol live there.
#include "vipc/frames.h"

#include <sys/types.h>

#include <thread>
#include <utility>

#include "api/guard.h"
#include "visionipc/client.h"
#include "visionipc/format.h"
#include "visionipc/server.h"

namespace vipc {

namespace {

static_assert(static_cast<uint32_t>(PixelFormat::custom) == static_cast<uint32_t>(visionipc::Format::kCustom),
              "PixelFormat mirrors visionipc::Format, in order");

Geometry to_public(const visionipc::Geometry& g) {
  return Geometry{static_cast<PixelFormat>(g.format), g.width, g.height, g.stride, g.uv_offset, g.size};
}

std::vector<uid_t> uids(const std::vector<unsigned>& in) { return std::vector<uid_t>(in.begin(), in.end()); }

visionipc::ClientOptions client_options(const ClientOptions& o) {
  return visionipc::ClientOptions{o.run.prefix, o.run.shm_dir, uids(o.trusted_uids)};
}

[[noreturn]] void moved_from() { throw Error(ErrorKind::closed, "use of a moved-from or closed object"); }

}  // namespace

WriteBuffer& WriteBuffer::operator=(WriteBuffer&& other) noexcept {
  stream_ = std::move(other.stream_);
  index_ = other.index_;
  generation_ = other.generation_;
  data_ = std::exchange(other.data_, {});
  mapping_ = std::move(other.mapping_);
  return *this;
}

struct FrameServer::Impl {
  Impl(std::string name, visionipc::ServerOptions options) : server(std::move(name), std::move(options)) {}
  visionipc::Server server;
};

FrameServer::FrameServer(std::string_view name, const ServerOptions& options)
    : impl_(api::guarded([&] {
        visionipc::ServerOptions core{options.run.prefix, options.run.shm_dir, uids(options.allowed_uids)};
        core.wake = api::wake_mode(options.wake);
        return std::make_unique<Impl>(api::str(name), std::move(core));
      })) {}
FrameServer::~FrameServer() = default;
FrameServer::FrameServer(FrameServer&&) noexcept = default;
FrameServer& FrameServer::operator=(FrameServer&&) noexcept = default;

void FrameServer::create_buffers(std::string_view stream, uint32_t count, uint32_t width, uint32_t height,
                                 PixelFormat format) {
  if (!impl_) moved_from();
  api::guarded([&] {
    if (format == PixelFormat::custom) {
      common::fail(common::ErrorKind::kInvalidArgument,
                   "PixelFormat::custom buffers come from create_buffers_with_sizes()");
    }
    const auto f = static_cast<visionipc::Format>(format);
    if (static_cast<uint32_t>(format) > static_cast<uint32_t>(visionipc::Format::kCustom)) {
      common::fail(common::ErrorKind::kInvalidArgument,
                   "unknown PixelFormat " + std::to_string(static_cast<uint32_t>(format)));
    }
    impl_->server.create_buffers(api::str(stream), count, visionipc::make_geometry(f, width, height));
  });
}

void FrameServer::create_buffers_with_sizes(std::string_view stream, uint32_t count, uint32_t width, uint32_t height,
                                            uint64_t size, uint32_t stride, uint32_t uv_offset) {
  if (!impl_) moved_from();
  api::guarded([&] {
    impl_->server.create_buffers(api::str(stream), count,
                                 visionipc::custom_geometry(width, height, size, stride, uv_offset));
  });
}

void FrameServer::start_listener() {
  if (!impl_) moved_from();
  api::guarded([&] { impl_->server.start_listener(); });
}

WriteBuffer FrameServer::get_buffer(std::string_view stream) {
  if (!impl_) moved_from();
  return api::guarded([&] {
    const std::string key = api::str(stream);
    const visionipc::Acquired a = impl_->server.get_buffer(key);
    WriteBuffer b;
    b.stream_ = key;
    b.index_ = a.index;
    b.generation_ = a.generation;
    b.data_ = std::span(reinterpret_cast<std::byte*>(a.data), impl_->server.geometry(key).size);
    b.mapping_ = a.pool;
    return b;
  });
}

void FrameServer::send(WriteBuffer&& buffer, const FrameInfo& info) {
  if (!impl_) moved_from();
  if (!buffer) throw Error(ErrorKind::invalid_argument, "send() of an empty WriteBuffer (sent already, or moved from)");
  WriteBuffer b = std::move(buffer);
  api::guarded([&] {
    impl_->server.send(b.stream(), b.index(), b.generation(), info.frame_id, info.timestamp_sof, info.timestamp_eof);
  });
}

Geometry FrameServer::geometry(std::string_view stream) const {
  if (!impl_) moved_from();
  return api::guarded([&] { return to_public(impl_->server.geometry(api::str(stream))); });
}

uint32_t FrameServer::num_buffers(std::string_view stream) const {
  if (!impl_) moved_from();
  return api::guarded([&] { return impl_->server.count(api::str(stream)); });
}

uint32_t FrameServer::num_clients(std::string_view stream) const {
  if (!impl_) moved_from();
  return api::guarded([&] { return impl_->server.clients(api::str(stream)); });
}

Wake FrameServer::wake() const {
  if (!impl_) moved_from();
  return api::public_wake(impl_->server.wake());
}

uint64_t FrameServer::readers_woken(std::string_view stream) const {
  if (!impl_) moved_from();
  return api::guarded([&] { return impl_->server.readers_woken(api::str(stream)); });
}

std::vector<std::string> FrameServer::streams() const {
  if (!impl_) moved_from();
  return impl_->server.streams();
}

const std::string& FrameServer::name() const {
  if (!impl_) moved_from();
  return impl_->server.name();
}

void FrameServer::close() {
  if (impl_) impl_->server.close();
}

struct FrameClient::Impl {
  Impl(std::string name, std::string stream, bool conflate, visionipc::ClientOptions options)
      : client(std::move(name), std::move(stream), conflate, std::move(options)) {}
  visionipc::Client client;
};

namespace {
// What a Frame keeps alive: its client (for valid()) and the mapping its bytes are in.
struct FrameOwner {
  std::shared_ptr<const visionipc::Client> client;
  std::shared_ptr<visionipc::Mapping> pool;
};
}  // namespace

FrameClient::FrameClient(std::string_view name, std::string_view stream, const ClientOptions& options)
    : impl_(api::guarded([&] {
        return std::make_shared<Impl>(api::str(name), api::str(stream), options.conflate, client_options(options));
      })) {}
FrameClient::~FrameClient() = default;
FrameClient::FrameClient(FrameClient&&) noexcept = default;
FrameClient& FrameClient::operator=(FrameClient&&) noexcept = default;

bool FrameClient::connect(Timeout timeout) {
  if (!impl_) moved_from();
  return api::guarded([&] {
    const int64_t deadline = api::deadline_of(timeout);
    for (;;) {
      if (impl_->client.connect()) {
        impl_->client.require_host_frames();
        return true;
      }
      if (common::monotonic_ns() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
}

bool FrameClient::connected() {
  if (!impl_) moved_from();
  return api::guarded([&] { return impl_->client.connected(); });
}

std::optional<Frame> FrameClient::recv(Timeout timeout) {
  if (!impl_) moved_from();
  return api::guarded([&]() -> std::optional<Frame> {
    visionipc::Client& c = impl_->client;
    const int64_t deadline = api::deadline_of(timeout);
    visionipc::Frame f;
    for (;;) {
      const common::WaitStatus st = c.recv(deadline, f);
      if (st == common::WaitStatus::kReady) break;
      if (st == common::WaitStatus::kClosed)
        common::fail(common::ErrorKind::kClosed, "client was closed while waiting");
      if (st == common::WaitStatus::kTimeout) return std::nullopt;
      if (deadline != common::kNever && common::monotonic_ns() >= deadline) return std::nullopt;  // interrupted, late
    }
    c.require_host_frames();
    Frame out;
    out.data_ = std::span(reinterpret_cast<const std::byte*>(c.buffer(f.index)), c.geometry().size);
    out.index_ = f.index;
    out.generation_ = f.generation;
    out.epoch_ = c.epoch();
    out.publish_ns_ = f.publish_ns;
    out.info_ = FrameInfo{f.frame_id, f.timestamp_sof, f.timestamp_eof};
    out.owner_ =
        std::make_shared<FrameOwner>(FrameOwner{std::shared_ptr<const visionipc::Client>(impl_, &c), c.pool()});
    return out;
  });
}

bool Frame::valid() const {
  if (!owner_) return false;
  const auto& owner = *static_cast<const FrameOwner*>(owner_.get());
  const visionipc::Client& c = *owner.client;
  return c.pool() == owner.pool && c.epoch() == epoch_ && c.is_valid(index_, generation_);
}

Geometry FrameClient::geometry() const {
  if (!impl_) moved_from();
  return to_public(impl_->client.geometry());
}

uint32_t FrameClient::num_buffers() const {
  if (!impl_) moved_from();
  return impl_->client.count();
}

int FrameClient::fd() {
  if (!impl_) moved_from();
  return api::guarded([&] { return impl_->client.fileno(); });
}

bool FrameClient::arm() {
  if (!impl_) moved_from();
  return api::guarded([&] { return impl_->client.arm(); });
}

void FrameClient::close() {
  if (impl_) impl_->client.close();
}

std::optional<std::vector<std::string>> FrameClient::available_streams(std::string_view name,
                                                                       const ClientOptions& options) {
  return api::guarded([&] { return visionipc::Client::list_streams(api::str(name), client_options(options)); });
}

}  // namespace vipc
