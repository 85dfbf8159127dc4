// The reference's VisionIPC C++ API (commaai/msgq msgq/visionipc/*.h) on the
// core's VisionIPC server and client. Its buffers point into the stream's
// shared pool; leases and generations work underneath as in the native API.
// Where the reference asserted, these throw vipc::Error.
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

#include "api/guard.h"
#include "common/frame_copy.h"
#include "msgq/visionipc/visionipc_client.h"
#include "msgq/visionipc/visionipc_server.h"
#include "visionipc/client.h"
#include "visionipc/format.h"
#include "visionipc/protocol.h"
#include "visionipc/server.h"

namespace {

std::string stream_key(VisionStreamType type) { return std::to_string(type); }

// Points buf at buffer `index` of a pool of the given geometry.
void describe(VisionBuf& buf, uint8_t* addr, const vipc::visionipc::Geometry& g, uint64_t server_id, size_t index,
              VisionStreamType type) {
  buf.addr = addr;
  buf.len = buf.mmap_len = g.size;
  buf.fd = -1;
  buf.server_id = server_id;
  buf.idx = index;
  buf.type = type;
  buf.init_yuv(g.width, g.height, g.stride, g.uv_offset);
}

}  // namespace

void VisionBuf::allocate(size_t length) {
  vipc::api::guarded([&] {
    vipc::common::UniqueFd memfd(memfd_create("visionbuf", MFD_CLOEXEC));
    if (!memfd) vipc::common::fail_errno("memfd_create(visionbuf)");
    const size_t total = length + sizeof(uint64_t);  // the frame id after the pixels, as in the reference
    if (ftruncate(memfd.get(), static_cast<off_t>(total)) != 0) vipc::common::fail_errno("ftruncate(visionbuf)");
    len = length;
    mmap_len = total;
    fd = memfd.release();
    standalone_ = true;
    import();
  });
}

void VisionBuf::import() {
  vipc::api::guarded([&] {
    void* p = mmap(nullptr, mmap_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) vipc::common::fail_errno("mmap(visionbuf)");
    addr = p;
    frame_id = reinterpret_cast<uint64_t*>(static_cast<uint8_t*>(p) + len);
    standalone_ = true;
  });
}

void VisionBuf::init_yuv(size_t w, size_t h, size_t s, size_t uv_off) {
  width = w;
  height = h;
  stride = s;
  uv_offset = uv_off;
  y = static_cast<uint8_t*>(addr);
  uv = y == nullptr ? nullptr : y + uv_offset;
}

int VisionBuf::sync(int dir) {
  (void)dir;
  return 0;
}

int VisionBuf::free() {
  if (!standalone_) return 0;  // pool buffers belong to their server or client
  int r = addr != nullptr ? munmap(addr, mmap_len) : 0;
  if (fd >= 0 && ::close(fd) != 0) r = -1;
  addr = nullptr;
  frame_id = nullptr;
  fd = -1;
  standalone_ = false;
  return r;
}

void VisionBuf::set_frame_id(uint64_t id) {
  if (frame_id == nullptr) frame_id = &frame_id_storage_;
  *frame_id = id;
}

uint64_t VisionBuf::get_frame_id() { return frame_id == nullptr ? 0 : *frame_id; }

std::string get_endpoint_name(std::string name, VisionStreamType type) {
  return vipc::visionipc::endpoint_name(name, stream_key(type));
}

std::string get_ipc_path(const std::string& name) {
  std::string addr = vipc::visionipc::socket_address(vipc::RunOptions::from_environment().prefix, name);
  addr[0] = '@';  // the abstract namespace's leading NUL, as ss(8) shows it
  return addr;
}

struct VisionIpcServer::Impl {
  explicit Impl(std::string name) : server(std::move(name), core_options()) {}
  static vipc::visionipc::ServerOptions core_options() {
    const vipc::RunOptions run = vipc::RunOptions::from_environment();
    vipc::visionipc::ServerOptions o{run.prefix, run.shm_dir, {}};
    o.wake = vipc::api::wake_mode(vipc::RunOptions::wake_from_environment());  // MSGQ_WAKE
    return o;
  }
  vipc::visionipc::Server server;
  std::map<VisionStreamType, std::vector<std::unique_ptr<VisionBuf>>> buffers;
  std::map<VisionStreamType, std::map<size_t, uint64_t>> checked_out;  // index -> generation, from get_buffer()

  void create(VisionStreamType type, uint32_t count, const vipc::visionipc::Geometry& g) {
    const std::string key = stream_key(type);
    server.create_buffers(key, count, g);
    auto& bufs = buffers[type];
    for (uint32_t i = 0; i < count; i++) {
      bufs.push_back(std::make_unique<VisionBuf>());
      bufs.back()->set_frame_id(0);
      describe(*bufs.back(), server.buffer(key, i), g, server.id(), i, type);
    }
  }
  std::vector<std::unique_ptr<VisionBuf>>& stream(VisionStreamType type) {
    auto it = buffers.find(type);
    if (it == buffers.end()) {
      vipc::common::fail(vipc::common::ErrorKind::kInvalidArgument,
                         "no stream " + stream_key(type) + " (create_buffers first)");
    }
    return it->second;
  }
};

VisionIpcServer::VisionIpcServer(std::string name)
    : impl(vipc::api::guarded([&] { return std::make_unique<Impl>(std::move(name)); })) {}

VisionIpcServer::~VisionIpcServer() = default;

static uint32_t count_of(size_t n) {
  vipc::common::check_range<size_t>("num_buffers", n, 1, vipc::visionipc::kMaxBuffers);
  return static_cast<uint32_t>(n);
}

static uint32_t dim(const char* what, size_t v) {
  vipc::common::check_range<size_t>(what, v, 1, vipc::visionipc::kMaxDimension);
  return static_cast<uint32_t>(v);
}

void VisionIpcServer::create_buffers(VisionStreamType type, size_t num_buffers, size_t width, size_t height) {
  vipc::api::guarded([&] {
    impl->create(
        type, count_of(num_buffers),
        vipc::visionipc::make_geometry(vipc::visionipc::Format::kNV12, dim("width", width), dim("height", height)));
  });
}

void VisionIpcServer::create_buffers_with_sizes(VisionStreamType type, size_t num_buffers, size_t width, size_t height,
                                                size_t size, size_t stride, size_t uv_offset) {
  vipc::api::guarded([&] {
    vipc::common::check_range<size_t>("stride", stride, 1, UINT32_MAX);
    vipc::common::check_range<size_t>("uv_offset", uv_offset, 0, UINT32_MAX);
    impl->create(type, count_of(num_buffers),
                 vipc::visionipc::custom_geometry(dim("width", width), dim("height", height), size,
                                                  static_cast<uint32_t>(stride), static_cast<uint32_t>(uv_offset)));
  });
}

VisionBuf* VisionIpcServer::get_buffer(VisionStreamType type, int idx) {
  return vipc::api::guarded([&]() -> VisionBuf* {
    auto& bufs = impl->stream(type);
    if (idx >= 0) {  // as in the reference: that buffer, not checked out (send() copies if it must)
      vipc::common::check_range<size_t>("buffer index", static_cast<size_t>(idx), 0, bufs.size() - 1);
      return bufs[static_cast<size_t>(idx)].get();
    }
    const vipc::visionipc::Acquired a = impl->server.get_buffer(stream_key(type));
    impl->checked_out[type][a.index] = a.generation;
    return bufs[a.index].get();
  });
}

void VisionIpcServer::send(VisionBuf* buf, VisionIpcBufExtra* extra, bool sync) {
  (void)sync;
  vipc::api::guarded([&] {
    if (buf == nullptr) vipc::common::fail(vipc::common::ErrorKind::kInvalidArgument, "send() of a null VisionBuf");
    const VisionIpcBufExtra none{};
    const VisionIpcBufExtra& x = extra == nullptr ? none : *extra;
    auto& bufs = impl->stream(buf->type);
    const std::string key = stream_key(buf->type);
    if (buf->idx >= bufs.size() || bufs[buf->idx].get() != buf) {
      vipc::common::fail(vipc::common::ErrorKind::kInvalidArgument,
                         "send() of a VisionBuf that is not one of this server's");
    }
    auto& out = impl->checked_out[buf->type];
    uint32_t index = static_cast<uint32_t>(buf->idx);
    uint64_t generation = 0;
    if (auto it = out.find(buf->idx); it != out.end() && it->second == impl->server.generation(key, index)) {
      generation = it->second;
      out.erase(it);
    } else {  // not checked out (get_buffer(type, idx), or sent already): publish a copy in a checked-out buffer
      if (it != out.end()) out.erase(it);
      const vipc::visionipc::Acquired a = impl->server.get_buffer(key);
      if (a.index != index) vipc::common::copy_frame(a.data, buf->addr, buf->len);
      out.erase(a.index);
      index = a.index;
      generation = a.generation;
    }
    impl->server.send(key, index, generation, x.frame_id, x.timestamp_sof, x.timestamp_eof);
    bufs[index]->set_frame_id(x.frame_id);
    buf->set_frame_id(x.frame_id);
  });
}

void VisionIpcServer::start_listener() {
  vipc::api::guarded([&] { impl->server.start_listener(); });
}

struct VisionIpcClient::Impl {
  Impl(std::string name, VisionStreamType type, bool conflate)
      : client(std::move(name), stream_key(type), conflate,
               vipc::visionipc::ClientOptions{
                   vipc::RunOptions::from_environment().prefix, vipc::RunOptions::from_environment().shm_dir, {}}) {}
  vipc::visionipc::Client client;
  uint64_t epoch = 0;  // the client's mapping that buffers[] describe
};

VisionIpcClient::VisionIpcClient(std::string name, VisionStreamType stream_type, bool conflate)
    : impl(vipc::api::guarded([&] { return std::make_unique<Impl>(std::move(name), stream_type, conflate); })),
      type(stream_type) {}

VisionIpcClient::~VisionIpcClient() = default;

void VisionIpcClient::describe_buffers() {
  const vipc::visionipc::Client& c = impl->client;
  c.require_host_frames();
  impl->epoch = c.epoch();
  num_buffers = static_cast<int>(c.count());
  for (uint32_t i = 0; i < c.count(); i++) {
    buffers[i].set_frame_id(0);
    describe(buffers[i], const_cast<uint8_t*>(c.buffer(i)), c.geometry(), c.server_id(), i, type);
  }
}

bool VisionIpcClient::connect(bool blocking) {
  return vipc::api::guarded([&] {
    while (!impl->client.connect()) {
      if (!blocking) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    connected = true;
    describe_buffers();
    return true;
  });
}

VisionBuf* VisionIpcClient::recv(VisionIpcBufExtra* extra, const int timeout_ms) {
  return vipc::api::guarded([&]() -> VisionBuf* {
    if (!connected) return nullptr;
    vipc::visionipc::Client& c = impl->client;
    const int64_t deadline = vipc::api::deadline_of(timeout_ms < 0 ? vipc::kForever : vipc::Timeout(timeout_ms));
    vipc::visionipc::Frame f;
    if (c.recv(deadline, f) != vipc::common::WaitStatus::kReady) return nullptr;
    if (impl->epoch != c.epoch()) describe_buffers();  // remapped: the server restarted
    VisionBuf* buf = &buffers[f.index];
    buf->set_frame_id(f.frame_id);
    if (extra != nullptr) {
      extra->frame_id = static_cast<uint32_t>(f.frame_id);
      extra->timestamp_sof = f.timestamp_sof;
      extra->timestamp_eof = f.timestamp_eof;
      extra->valid = f.valid;
    }
    return buf;
  });
}

std::set<VisionStreamType> VisionIpcClient::getAvailableStreams(const std::string& name, bool blocking) {
  return vipc::api::guarded([&] {
    const vipc::RunOptions run = vipc::RunOptions::from_environment();
    std::optional<std::vector<std::string>> names;
    while (!(names = vipc::visionipc::Client::list_streams(name, {run.prefix, run.shm_dir, {}})) && blocking) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    std::set<VisionStreamType> out;
    for (const std::string& s : names.value_or(std::vector<std::string>{})) {
      char* end = nullptr;
      const unsigned long v = std::strtoul(s.c_str(), &end, 10);
      if (!s.empty() && *end == '\0' && v < VISION_STREAM_LIST) out.insert(static_cast<VisionStreamType>(v));
    }
    return out;
  });
}
