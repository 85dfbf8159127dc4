#include "visionipc/server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "common/clock.h"
#include "common/errors.h"
#include "common/process.h"
#include "visionipc/protocol.h"

namespace vipc::visionipc {

namespace {

uint64_t random_id() {
  uint64_t id = 0;
  while (id == 0) {
    if (getrandom(&id, sizeof(id), 0) != sizeof(id)) common::fail_errno("getrandom");
  }
  return id;
}

msgq::SegmentSpec topic_spec(const ServerOptions& o, const std::string& topic) {
  msgq::SegmentSpec spec;
  spec.dir = o.shm_dir;
  spec.basename = msgq::segment_basename(o.prefix, topic);
  return spec;
}

// The topic ring lives on as an unnamed file: its name goes right after the
// publisher made it (if it is still the file we opened), so nothing is left
// in the shm directory whatever kills the server; clients get it by fd only.
void unlink_topic(const msgq::Segment& seg) {
  struct stat ours{}, named{};
  if (fstat(seg.fd(), &ours) != 0 || stat(seg.path().c_str(), &named) != 0) return;
  if (ours.st_dev == named.st_dev && ours.st_ino == named.st_ino) unlink(seg.path().c_str());
}

// Who holds an abstract socket name: "uid U (pid P)", or "" if no one answers.
std::string holder_of(const sockaddr_un& sa, socklen_t len) {
  common::UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd || ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&sa), len) != 0) return "";
  ucred cred{};
  socklen_t n = sizeof(cred);
  if (getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &n) != 0) return "";
  return "uid " + std::to_string(cred.uid) + " (pid " + std::to_string(cred.pid) + ")";
}

}  // namespace

// The socket name is claimed here, not in start_listener(): a second server
// of the same name fails before it takes over any of the first one's topics.
Server::Server(std::string name, ServerOptions options)
    : name_(std::move(name)), options_(std::move(options)), owner_(common::current_pid()), id_(random_id()) {
  check_name("server name", name_);
  common::UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) common::fail_errno("socket(AF_UNIX)");
  sockaddr_un sa{};
  const socklen_t len = socket_sockaddr(options_.prefix, name_, sa);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), len) != 0) {
    if (errno == EADDRINUSE) {
      const std::string who = holder_of(sa, len);
      const std::string what = "VisionIPC server name '" + name_ + "' (prefix '" + options_.prefix + "')";
      if (!who.empty() && who.rfind("uid " + std::to_string(geteuid()) + " ", 0) != 0) {
        common::fail(common::ErrorKind::kIpc, "the " + what + " is held by another user, " + who +
                                                  ": pick another name or run prefix (MSGQ_PREFIX)");
      }
      common::fail(common::ErrorKind::kIpc,
                   "another VisionIPC server with the " + what + " is running" +
                       (who.empty() ? std::string(" (its process does not answer)") : " as " + who) +
                       ": stop it or pick another name");
    }
    common::fail_errno("bind of the VisionIPC socket");
  }
  listen_fd_ = std::move(fd);
}

Server::~Server() { close(); }

void Server::close() {
  if (common::current_pid() != owner_) {
    forget_after_fork();
    return;
  }
  // A get_buffer/send/... on another thread finishes first (none blocks); any
  // later one throws kClosed. SYNC: UseGate's enter/begin_close pairing.
  gate_.begin_close();
  gate_.wait_idle();
  if (listener_.joinable()) {
    const uint64_t one = 1;
    if (write(stop_fd_.get(), &one, sizeof(one)) != sizeof(one)) std::abort();  // eventfd write cannot fail here
    listener_.join();
  }
  connections_.clear();
  listen_fd_.reset();
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& p : by_ordinal_) p.store(nullptr, std::memory_order_relaxed);
  streams_.clear();
}

// A forked child has no listener thread (fork copies only the caller) but
// shares the parent's stop eventfd, socket and segment descriptions: writing,
// joining or locking any of them would stop or freeze the parent. The
// child's std::thread handle names the parent's thread: it is parked in a
// leaked handle (destroying a joinable one aborts; joining would wait on a
// thread that does not exist here). mutex_ may have been held by the
// parent's listener at the fork: it is not taken.
void Server::forget_after_fork() {
  if (listener_.joinable()) new std::thread(std::move(listener_));  // never joined, never freed
  for (auto& kv : streams_) {
    if (kv.second->publisher) kv.second->publisher->forget_after_fork();
  }
  for (auto& p : by_ordinal_) p.store(nullptr, std::memory_order_relaxed);
  streams_.clear();  // our copies of the pool fds and mappings only
  connections_.clear();
  stop_fd_.reset();
  listen_fd_.reset();
}

void Server::check_open() const {
  if (!listen_fd_ || common::current_pid() != owner_) {
    common::fail(common::ErrorKind::kClosed,
                 "server '" + name_ + "' is closed (or inherited across fork: a child makes its own)");
  }
}

Server::Stream& Server::find(const std::string& stream) const {
  check_open();
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = streams_.find(stream);
  if (it == streams_.end())
    common::fail(common::ErrorKind::kInvalidArgument, "server '" + name_ + "' has no stream '" + stream + "'");
  return *it->second;
}

namespace {

// The per-frame functions' errors, out of line (cold): their messages are built here,
// not in the hot code (issue 36).
[[noreturn, gnu::cold, gnu::noinline]] void fail_wrong_size(const std::string& stream, uint64_t size, uint64_t want) {
  common::fail(common::ErrorKind::kInvalidArgument, "frame data is " + std::to_string(size) + " bytes, stream '" +
                                                        stream + "' buffers are " + std::to_string(want) + " bytes");
}

[[noreturn, gnu::cold, gnu::noinline]] void fail_not_checked_out(const std::string& stream, uint32_t index) {
  common::fail(common::ErrorKind::kInvalidArgument,
               "buffer " + std::to_string(index) + " of stream '" + stream +
                   "' is not checked out by get_buffer() under this generation (sent already, or recycled since)");
}

}  // namespace

// The per-frame functions (at, leased, checkout, acquire, send_at, publish, send_copy_at,
// send_copy_on) are [[gnu::hot]]: the compiler puts them together (.text.hot), so a cold
// frame's code sits on few pages and lines; their rare paths are out of line (issue 36).
[[gnu::hot]] Server::Stream& Server::at(uint32_t handle) const {
  check_open();
  if (handle < kFastStreams) [[likely]] {
    if (Stream* s = by_ordinal_[handle].load(std::memory_order_acquire)) [[likely]]
      return *s;
  }
  return at_slowly(handle);
}

Server::Stream& Server::at_slowly(uint32_t handle) const {
  if (handle >= kFastStreams) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& kv : streams_) {
      if (kv.second->ordinal == handle) return *kv.second;
    }
  }
  common::fail(common::ErrorKind::kInvalidArgument,
               "server '" + name_ + "' has no stream of handle " + std::to_string(handle));
}

uint32_t Server::handle(const std::string& stream) const {
  const common::UseOrClosed call = use();
  return find(stream).ordinal;
}

Geometry Server::geometry(const std::string& stream) const {
  const common::UseOrClosed call = use();
  return find(stream).geometry;
}

uint32_t Server::count(const std::string& stream) const {
  const common::UseOrClosed call = use();
  return find(stream).layout.count;
}

std::shared_ptr<Mapping> Server::pool(const std::string& stream) const {
  const common::UseOrClosed call = use();
  return find(stream).pool;
}

uint64_t Server::readers_woken(const std::string& stream) const {
  const common::UseOrClosed call = use();
  return find(stream).publisher->readers_woken();
}

std::vector<std::string> Server::streams() const {
  const common::UseOrClosed call = use();
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> out;
  for (const auto& kv : streams_) out.push_back(kv.first);
  return out;
}

uint8_t* Server::buffer(const std::string& stream, uint32_t index) const {
  const common::UseOrClosed call = use();
  const Stream& s = find(stream);
  if (index >= s.layout.count) common::fail(common::ErrorKind::kInvalidArgument, "buffer index out of range");
  return s.buffer(index);
}

uint32_t Server::clients(const std::string& stream) const {
  const common::UseOrClosed call = use();
  const Stream& s = find(stream);
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<uint32_t>(__builtin_popcountll(s.slot_used.load(std::memory_order_relaxed)));
}

uint64_t Server::generation(const std::string& stream, uint32_t index) const {
  const common::UseOrClosed call = use();
  const Stream& s = find(stream);
  return index < s.layout.count ? s.generation[index] : 0;
}

void Server::create_buffers(const std::string& stream, uint32_t count, const Geometry& geometry, uint32_t pool_flags) {
  const common::UseOrClosed call = use();
  check_open();
  check_name("stream name", stream);
  {
    std::lock_guard<std::mutex> lock(mutex_);  // checked again below: the listener only reads streams_
    if (streams_.count(stream))
      common::fail(common::ErrorKind::kInvalidArgument, "stream '" + stream + "' already has buffers");
  }
  const std::string problem = geometry_problem(geometry);
  if (!problem.empty()) common::fail(common::ErrorKind::kInvalidArgument, problem);
  if ((pool_flags & ~kKnownPoolFlags) != 0)
    common::fail(common::ErrorKind::kInvalidArgument, "unknown pool flags " + std::to_string(pool_flags));
  auto s = std::make_unique<Stream>();
  s->name = stream;
  s->pool_flags = pool_flags;
  s->geometry = geometry;
  s->layout = make_layout(count, geometry.size);
  s->pool_fd = create_sealed_memfd(("vipc-pool-" + stream).c_str(), s->layout.total_size);
  s->lease_fd = create_sealed_memfd(("vipc-leases-" + stream).c_str(), kLeaseTableSize);
  s->pool = std::make_shared<Mapping>(s->pool_fd.get(), s->layout.total_size, true);
  s->leases = std::make_unique<Mapping>(s->lease_fd.get(), kLeaseTableSize, true);
  s->metas = reinterpret_cast<BufferMeta*>(s->pool->data());
  s->slots = reinterpret_cast<LeaseSlot*>(s->leases->data());
  s->pixels = s->pool->data() + s->layout.data_offset;
  s->generation.assign(count, 0);
  s->lru.resize(count);
  for (uint32_t i = 0; i < count; i++) s->lru[i] = static_cast<uint16_t>(i);
  s->publisher = std::make_unique<msgq::Publisher>(topic_spec(options_, endpoint_name(name_, stream)));
  s->publisher->set_wake_mode(options_.wake);
  unlink_topic(*s->publisher->segment());
  std::lock_guard<std::mutex> lock(mutex_);
  if (streams_.count(stream))
    common::fail(common::ErrorKind::kInvalidArgument, "stream '" + stream + "' already has buffers");
  s->ordinal = static_cast<uint32_t>(streams_.size());
  if (s->ordinal < kFastStreams) by_ordinal_[s->ordinal].store(s.get(), std::memory_order_release);
  streams_[stream] = std::move(s);
}

// Whether a client's lease holds buffer `index` at `generation`. Only the slots of
// admitted clients are read (slot_used), one cache line each, instead of all 64:
// cold, at a camera's pace, each is a miss (issue 36).
//
// SYNC (all seq_cst, so one total order S): the decisive call is the one after the
// probe (G1a: probe store P, then this). A client's L1 store L is followed by its
// re-read R of the generation; its admission bit was set by a RMW A that happens
// before L (A precedes the reply the client read). If our load M of slot_used
// misses the bit, M precedes A in S, so P < M < A < L < R: R sees the probe and the
// client backs off (the frame is not its lease). If M has the bit, we read the slot
// as before: either we see L or R sees P (the unchanged two-sided argument).
// Model: cpp/visionipc/model/lease.pml (tests/system/test_model.py), with the
// mutations that break it (reply before the bit, mask read before the probe).
[[gnu::hot]] bool Server::leased(const Stream& s, uint32_t index, uint64_t generation) const {
  const uint64_t word = lease_word(index, generation);
  for (uint64_t live = s.slot_used.load(std::memory_order_seq_cst); live != 0; live &= live - 1) {
    const auto slot = static_cast<uint32_t>(__builtin_ctzll(live));
    // SYNC: pairs with the client's L1 store (seq_cst both sides).
    if (s.lease(slot).word.load(std::memory_order_seq_cst) == word) return true;
  }
  return false;
}

Acquired Server::get_buffer(const std::string& stream) {
  const common::UseOrClosed call = use();
  Stream& s = find(stream);
  const Checkout c = acquire(s);
  return Acquired{c.index, c.generation, s.buffer(c.index), s.pool};
}

[[gnu::hot]] Checkout Server::checkout(uint32_t handle) {
  const common::UseOrClosed call = use();
  return acquire(at(handle));
}

// Candidates from least to most recently sent (s.lru); buffers already checked out
// (odd) are skipped, so recycling one only happens when nothing else is left.
[[gnu::hot]] Checkout Server::acquire(Stream& s) {
  const uint32_t n = s.layout.count;
  uint32_t fallback = n;  // the least recently sent buffer not checked out
  for (uint32_t k = 0; k < n; k++) {
    const uint32_t i = s.lru[k];
    const uint64_t gen = s.generation[i];
    if (gen & 1) continue;
    if (fallback == n) fallback = i;
    if (gen != 0 && leased(s, i, gen)) continue;
    if (gen != 0) {
      // G1a: probe, then re-check: a client whose L1 store we missed sees the
      // probe at its re-read and waits for us, or we see its lease now.
      s.meta(i).generation.store(gen | kProbeBit, std::memory_order_seq_cst);
      if (leased(s, i, gen)) {
        s.meta(i).generation.store(gen, std::memory_order_seq_cst);  // untouched: hand it back
        continue;
      }
    }
    s.meta(i).generation.store(gen + 1, std::memory_order_seq_cst);  // G1b
    std::atomic_thread_fence(std::memory_order_release);             // pixel writes after it
    s.generation[i] = gen + 1;
    return Checkout{i, gen + 1};
  }
  // Everything is leased (or checked out): take the least recently sent one not
  // checked out (else the least recently sent); its holder's validity check
  // fails from here on.
  const uint32_t chosen = fallback < n ? fallback : s.lru[0];
  uint64_t& gen = s.generation[chosen];
  gen += (gen & 1) ? 2 : 1;
  s.meta(chosen).generation.store(gen, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_release);
  return Checkout{chosen, gen};
}

void Server::send(const std::string& stream, uint32_t index, uint64_t generation, uint64_t frame_id, uint64_t sof,
                  uint64_t eof) {
  const common::UseOrClosed call = use();
  publish(find(stream), index, generation, frame_id, sof, eof);
}

[[gnu::hot]] void Server::send_at(uint32_t handle, uint32_t index, uint64_t generation, uint64_t frame_id, uint64_t sof,
                                  uint64_t eof) {
  const common::UseOrClosed call = use();
  publish(at(handle), index, generation, frame_id, sof, eof);
}

uint32_t Server::send_copy(const std::string& stream, uint64_t size, uint64_t frame_id, uint64_t sof, uint64_t eof,
                           const std::function<void(uint8_t*)>& fill) {
  const common::UseOrClosed call = use();
  return send_copy_on(find(stream), size, frame_id, sof, eof, fill);
}

[[gnu::hot]] uint32_t Server::send_copy_at(uint32_t handle, uint64_t size, uint64_t frame_id, uint64_t sof,
                                           uint64_t eof, const std::function<void(uint8_t*)>& fill) {
  const common::UseOrClosed call = use();
  return send_copy_on(at(handle), size, frame_id, sof, eof, fill);
}

[[gnu::hot]] uint32_t Server::send_copy_on(Stream& s, uint64_t size, uint64_t frame_id, uint64_t sof, uint64_t eof,
                                           const std::function<void(uint8_t*)>& fill) {
  if (size != s.geometry.size) [[unlikely]]
    fail_wrong_size(s.name, size, s.geometry.size);
  const Checkout c = acquire(s);
  fill(s.buffer(c.index));
  publish(s, c.index, c.generation, frame_id, sof, eof);
  return c.index;
}

[[gnu::hot]] void Server::publish(Stream& s, uint32_t index, uint64_t generation, uint64_t frame_id, uint64_t sof,
                                  uint64_t eof) {
  if (index >= s.layout.count || s.generation[index] != generation || !(generation & 1)) [[unlikely]] {
    fail_not_checked_out(s.name, index);
  }
  BufferMeta& m = s.meta(index);
  m.frame_id.store(frame_id, std::memory_order_relaxed);
  m.timestamp_sof.store(sof, std::memory_order_relaxed);
  m.timestamp_eof.store(eof, std::memory_order_relaxed);
  const uint64_t published = generation + 1;
  m.generation.store(published, std::memory_order_release);  // G3: pixels and metadata before this
  s.generation[index] = published;
  // The sent buffer becomes the most recently sent: the ones after it move up one.
  uint16_t* order = s.lru.data();
  const uint32_t last = s.layout.count - 1;
  uint32_t k = 0;
  while (order[k] != index) k++;
  for (; k < last; k++) order[k] = order[k + 1];
  order[last] = static_cast<uint16_t>(index);
  const Packet p{kProtocolMagic, s.ordinal, id_, index, 0,
                 published,      frame_id,  sof, eof,   static_cast<uint64_t>(common::monotonic_ns())};
  s.publisher->send(&p, sizeof(p));
}

void Server::start_listener() {
  const common::UseOrClosed call = use();  // a close() on another thread waits, then stops the thread started here
  check_open();
  if (listener_.joinable()) return;
  if (listen(listen_fd_.get(), 64) != 0) common::fail_errno("listen");
  stop_fd_.reset(eventfd(0, EFD_CLOEXEC));
  if (!stop_fd_) common::fail_errno("eventfd");
  listener_ = std::thread([this] { listen_loop(); });
}

// A connection that has not asked anything kPendingTimeoutNs after it was
// accepted is hung up: idle peers cannot keep the pending places forever.
void Server::listen_loop() {
  for (;;) {
    std::vector<pollfd> fds{{stop_fd_.get(), POLLIN, 0}, {listen_fd_.get(), POLLIN, 0}};
    int64_t first_expiry = common::kNever;
    for (const Connection& c : connections_) {
      fds.push_back({c.fd.get(), POLLIN, 0});
      if (c.stream == nullptr) first_expiry = std::min(first_expiry, c.accepted_ns + kPendingTimeoutNs);
    }
    const int timeout_ms =
        first_expiry == common::kNever
            ? -1
            : static_cast<int>(std::max<int64_t>(0, first_expiry - common::monotonic_ns()) / 1'000'000 + 1);
    if (poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents) return;
    const int64_t now = common::monotonic_ns();
    // Walk backwards so erasing keeps the indices of the rest valid.
    for (size_t i = connections_.size(); i-- > 0;) {
      Connection& c = connections_[i];
      const bool expired = c.stream == nullptr && now >= c.accepted_ns + kPendingTimeoutNs;
      if (fds[i + 2].revents == 0 && !expired) continue;
      if ((fds[i + 2].revents & POLLIN) && c.stream == nullptr && serve_request(c)) continue;
      hang_up(c);
      connections_.erase(connections_.begin() + static_cast<long>(i));
    }
    if (fds[1].revents & POLLIN) accept_client();
  }
}

bool Server::peer_allowed(const ucred& cred) const {
  if (cred.uid == geteuid()) return true;
  return std::find(options_.allowed_uids.begin(), options_.allowed_uids.end(), cred.uid) != options_.allowed_uids.end();
}

// Say why, so the client can tell its user what to do; then hang up.
void Server::refuse(int fd, ReplyStatus status) {
  auto reply = std::make_unique<Reply>();
  std::memset(reply.get(), 0, sizeof(Reply));
  reply->magic = kProtocolMagic;
  reply->version = kProtocolVersion;
  reply->server_id = id_;
  reply->status = static_cast<uint32_t>(status);
  send_with_fds(fd, reply.get(), sizeof(Reply), {});
  // Closing with the client's request unread would reset the connection and
  // drop our answer from its queue (ECONNRESET): stop more coming in (a later
  // send gets EPIPE and the client reads the answer), then drain what came.
  shutdown(fd, SHUT_RDWR);
  Request junk{};
  for (std::vector<common::UniqueFd> fds; recv_with_fds(fd, &junk, sizeof(junk), fds) > 0; fds.clear()) {
  }
}

// Admission: a peer of a refused uid, a peer with max_per_peer connections
// still waiting to ask, or one over kMaxPending waiting in all, is refused at
// once with the reason (kDenied / kPeerLimit / kFull).
void Server::accept_client() {
  for (;;) {
    common::UniqueFd fd(accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd) return;
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || !peer_allowed(cred)) {
      refuse(fd.get(), ReplyStatus::kDenied);
      continue;
    }
    uint32_t pending = 0, mine = 0;
    for (const Connection& c : connections_) {
      if (c.stream != nullptr) continue;
      pending++;
      mine += c.peer == cred.pid;
    }
    if (mine >= options_.max_per_peer || pending >= kMaxPending) {
      refuse(fd.get(), mine >= options_.max_per_peer ? ReplyStatus::kPeerLimit : ReplyStatus::kFull);
      continue;
    }
    connections_.push_back(Connection{std::move(fd), cred.pid, common::monotonic_ns(), nullptr, 0});
  }
}

namespace {
bool topic_ok(const std::vector<int>& fds) { return fds.empty() || fds.back() >= 0; }
}  // namespace

uint32_t Server::list_streams(Reply& reply) const {
  std::string list;
  for (const auto& kv : streams_) list += kv.first + "\n";
  list = list.substr(0, kListCapacity);
  std::memcpy(reply.list, list.data(), list.size());
  return static_cast<uint32_t>(list.size());
}

uint32_t Server::peer_slots(pid_t peer, const Stream& s) const {
  uint32_t n = 0;
  for (const Connection& c : connections_) n += c.peer == peer && c.stream == &s;
  return n;
}

bool Server::serve_request(Connection& c) {
  Request req{};
  std::vector<common::UniqueFd> junk;
  const ssize_t r = recv_with_fds(c.fd.get(), &req, sizeof(req), junk);
  if (r != static_cast<ssize_t>(sizeof(req)) || req.magic != kProtocolMagic) return false;
  auto reply = std::make_unique<Reply>();  // ~8 KiB: keep it off the listener's stack
  std::memset(reply.get(), 0, sizeof(Reply));
  reply->magic = kProtocolMagic;
  reply->version = kProtocolVersion;
  reply->server_id = id_;
  req.stream[kStreamNameCapacity - 1] = '\0';
  const std::string wanted(req.stream);
  std::vector<int> fds;
  common::UniqueFd topic;
  std::unique_lock<std::mutex> lock(mutex_);
  if (req.version != kProtocolVersion) {
    reply->status = static_cast<uint32_t>(ReplyStatus::kBadRequest);
  } else if (req.kind == static_cast<uint32_t>(RequestKind::kList)) {
    reply->list_length = list_streams(*reply);
  } else if (auto it = streams_.find(wanted); it == streams_.end()) {
    reply->status = static_cast<uint32_t>(ReplyStatus::kUnknownStream);
    reply->list_length = list_streams(*reply);  // so the client can name the ones there are
  } else if (Stream& s = *it->second; ~s.slot_used.load(std::memory_order_relaxed) == 0) {
    reply->status = static_cast<uint32_t>(ReplyStatus::kFull);
  } else if (peer_slots(c.peer, s) >= options_.max_per_peer) {
    reply->status = static_cast<uint32_t>(ReplyStatus::kPeerLimit);
  } else {
    const auto slot = static_cast<uint32_t>(__builtin_ctzll(~s.slot_used.load(std::memory_order_relaxed)));
    s.lease(slot).word.store(0, std::memory_order_release);
    s.slot_used.fetch_or(uint64_t{1} << slot, std::memory_order_seq_cst);  // A: before the reply (see leased)
    c.stream = &s;
    c.slot = slot;
    reply->lease_slot = slot;
    reply->stream_ordinal = s.ordinal;
    reply->format = static_cast<uint32_t>(s.geometry.format);
    reply->width = s.geometry.width;
    reply->height = s.geometry.height;
    reply->stride = s.geometry.stride;
    reply->uv_offset = s.geometry.uv_offset;
    reply->buffer_size = s.geometry.size;
    reply->count = s.layout.count;
    reply->pool_flags = s.pool_flags;
    reply->slot_size = s.layout.slot_size;
    reply->data_offset = s.layout.data_offset;
    reply->pool_size = s.layout.total_size;
    reply->lease_table_size = kLeaseTableSize;
    // The topic's segment, as an open file description of the client's own
    // (OFD locks are per description): an admitted user of another uid needs
    // no permission on the file itself.
    topic.reset(open(("/proc/self/fd/" + std::to_string(s.publisher->segment()->fd())).c_str(), O_RDWR | O_CLOEXEC));
    fds = {s.pool_fd.get(), s.lease_fd.get(), topic.get()};
  }
  lock.unlock();
  const bool sent = topic_ok(fds) && send_with_fds(c.fd.get(), reply.get(), sizeof(Reply), fds);
  return sent && c.stream != nullptr;  // list and refusals: done, drop the connection
}

void Server::hang_up(Connection& c) {
  if (c.stream == nullptr) return;
  // L3: the client is gone (or closed): its lease no longer pins a buffer.
  c.stream->lease(c.slot).word.store(0, std::memory_order_seq_cst);
  std::lock_guard<std::mutex> lock(mutex_);
  c.stream->slot_used.fetch_and(~(uint64_t{1} << c.slot), std::memory_order_seq_cst);  // after L3
  c.stream = nullptr;
}

}  // namespace vipc::visionipc
