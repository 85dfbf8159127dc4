#include "visionipc/client.h"

#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/clock.h"
#include "common/errors.h"
#include "common/process.h"

namespace vipc::visionipc {

namespace {

// The server's uid must be ours, root's, or one we were told to trust.
void check_server(int fd, const std::string& name, const ClientOptions& options) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    common::fail_errno("SO_PEERCRED of VisionIPC server '" + name + "'");
  if (cred.uid == geteuid() || cred.uid == 0) return;
  for (uid_t u : options.trusted_uids) {
    if (u == cred.uid) return;
  }
  common::fail(common::ErrorKind::kPermission,
               "VisionIPC server '" + name + "' is run by uid " + std::to_string(cred.uid) + " (pid " +
                   std::to_string(cred.pid) + "), which this client (uid " + std::to_string(geteuid()) +
                   ") does not trust: if that is really your server, pass its uid in trusted_uids; otherwise another "
                   "user is squatting the name");
}

common::UniqueFd dial(const std::string& prefix, const std::string& name) {
  common::UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd) common::fail_errno("socket(AF_UNIX)");
  sockaddr_un sa{};
  const socklen_t len = socket_sockaddr(prefix, name, sa);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), len) != 0) return {};
  // A server that accepts but never answers must not hang us.
  timeval tv{2, 0};
  setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

// False if the server hung up or answered garbage; throws for a refusal
// (kDenied) and for a version mismatch, which retrying cannot fix.
bool ask(int fd, const std::string& name, RequestKind kind, const std::string& stream, Reply& reply,
         std::vector<common::UniqueFd>& fds) {
  Request req{};
  req.magic = kProtocolMagic;
  req.version = kProtocolVersion;
  req.kind = static_cast<uint32_t>(kind);
  std::memcpy(req.stream, stream.data(), std::min(stream.size(), kStreamNameCapacity - 1));
  // A refusing server answers and hangs up without reading: read its answer even if our send failed.
  (void)send_with_fds(fd, &req, sizeof(req), {});
  const ssize_t r = recv_with_fds(fd, &reply, sizeof(reply), fds);
  if (r < 8 || reply.magic != kProtocolMagic) return false;
  if (reply.version != kProtocolVersion ||
      (r == sizeof(reply) && reply.status == static_cast<uint32_t>(ReplyStatus::kBadRequest))) {
    common::fail(common::ErrorKind::kIpc, "VisionIPC server '" + name + "' speaks protocol version " +
                                              std::to_string(reply.version) + ", this client version " +
                                              std::to_string(kProtocolVersion) +
                                              ": run the same visionipc release in the server and its clients");
  }
  if (r != static_cast<ssize_t>(sizeof(reply))) return false;
  if (reply.status == static_cast<uint32_t>(ReplyStatus::kDenied)) {
    common::fail(common::ErrorKind::kPermission,
                 "VisionIPC server '" + name + "' refused this client (uid " + std::to_string(geteuid()) +
                     "): it admits its own user only; start it with allowed_uids=[" + std::to_string(geteuid()) + "]");
  }
  return true;
}

struct PacketSink {
  Packet packet{};
  size_t size = 0;
  char scratch[256];
  char* prepare(size_t n) {
    size = n;
    // Anything but a Packet is garbage: read it into scratch (or nowhere) and reject it.
    if (n == sizeof(Packet)) return reinterpret_cast<char*>(&packet);
    return n <= sizeof(scratch) ? scratch : nullptr;
  }
  void discard() { size = 0; }
};

}  // namespace

Client::Client(std::string name, std::string stream, bool conflate, ClientOptions options)
    : name_(std::move(name)),
      stream_(std::move(stream)),
      conflate_(conflate),
      options_(std::move(options)),
      owner_(common::current_pid()) {
  check_name("server name", name_);
  check_name("stream name", stream_);
}

Client::~Client() { close(); }

void Client::close() {
  if (common::current_pid() != owner_) {
    forget_after_fork();
    return;
  }
  gate_.begin_close();
  {
    std::lock_guard<std::mutex> lock(sub_mutex_);
    if (sub_) sub_->interrupt();  // a recv() asleep on the ring returns kClosed
  }
  gate_.wait_idle();  // recv() (at most one reconnect slice) and the lease calls leave
  disconnect();
  topic_fd_.reset();
  pool_.reset();
  sub_.reset();
}

// A forked child shares the parent's lease table, socket and topic segment
// description: clearing the lease would unpin the parent's frame, and the
// subscriber's normal detach would take (and, on the shared description,
// keep) the segment's attach lock. Only our copies go.
void Client::forget_after_fork() {
  lease_ = nullptr;
  leases_.reset();
  sock_.reset();
  topic_fd_.reset();
  pool_.reset();
  if (sub_) sub_->forget_after_fork();
  sub_.reset();
  owner_ = common::current_pid();  // what is left (nothing) is ours: a later close() is an ordinary one
}

void Client::disconnect() {
  if (lease_ != nullptr) lease_->word.store(0, std::memory_order_release);
  lease_ = nullptr;
  leases_.reset();
  sock_.reset();  // the server clears our slot (L3) when it sees this
}

// The topic ring comes only from the server (an unnamed file, passed at each
// attach): a reconnect to a restarted server moves to its new ring.
void Client::adopt_topic(bool same_server) {
  if (!topic_fd_) return;
  std::lock_guard<std::mutex> lock(sub_mutex_);
  if (sub_ && same_server) {  // connect() again to the same server: its ring is the one we read
    topic_fd_.reset();
    return;
  }
  msgq::SegmentSpec spec;
  spec.dir = options_.shm_dir;
  spec.basename = msgq::segment_basename(options_.prefix, endpoint_name(name_, stream_));
  auto seg = msgq::Segment::adopt(topic_fd_.get(), spec);
  topic_fd_.reset();
  // A restarted server's ring: read it from its start, so the frames it sent
  // before we noticed the restart are not lost (the first ring: from now on).
  const bool moving = sub_ != nullptr;
  if (sub_) sub_->close();
  sub_ = std::make_unique<msgq::Subscriber>(spec, conflate_, std::move(seg), moving);
}

bool Client::refused(Refusal why, std::string message) {
  refusal_ = why;
  error_ = std::move(message);
  return false;
}

void Client::check_owner() const {
  if (common::current_pid() != owner_) {
    common::fail(common::ErrorKind::kClosed, "this VisionIPC client belongs to pid " + std::to_string(owner_) +
                                                 " (inherited across fork): close it here and make a new one");
  }
}

bool Client::connect() {
  const common::UseOrClosed call = use();
  check_owner();
  const std::string who =
      "VisionIPC server '" + name_ + "'" + (options_.prefix.empty() ? "" : " (prefix '" + options_.prefix + "')");
  common::UniqueFd fd = dial(options_.prefix, name_);
  if (!fd) return refused(Refusal::kNoServer, "no " + who + " is running");
  check_server(fd.get(), name_, options_);
  auto reply = std::make_unique<Reply>();
  std::vector<common::UniqueFd> fds;
  if (!ask(fd.get(), name_, RequestKind::kAttach, stream_, *reply, fds)) {
    return refused(Refusal::kNoServer, who + " hung up without answering");
  }
  switch (static_cast<ReplyStatus>(reply->status)) {
    case ReplyStatus::kOk:
      break;
    case ReplyStatus::kUnknownStream: {
      std::string known(reply->list, std::min<size_t>(reply->list_length, kListCapacity));
      while (!known.empty() && known.back() == '\n') known.pop_back();
      for (char& ch : known) ch = ch == '\n' ? ',' : ch;
      return refused(Refusal::kUnknownStream, who + " has no stream '" + stream_ +
                                                  "'; it has: " + (known.empty() ? std::string("none yet") : known));
    }
    case ReplyStatus::kFull:
      return refused(Refusal::kFull, who + " is full: all " + std::to_string(kMaxClients) +
                                         " client slots of stream '" + stream_ + "' are taken (or " +
                                         std::to_string(kMaxPending) +
                                         " connections wait for an answer); close a client or try again later");
    case ReplyStatus::kPeerLimit:
      return refused(Refusal::kPeerLimit, who + " refused this process (pid " + std::to_string(getpid()) +
                                              "): it already holds its share of stream '" + stream_ + "' (" +
                                              std::to_string(kMaxClientsPerPeer) +
                                              " connections); close some of this process's clients");
    default:
      return refused(Refusal::kNoServer, who + " refused with status " + std::to_string(reply->status));
  }
  const uint64_t before = server_id_;
  if (!accept_reply(*reply, fds)) {
    common::fail(common::ErrorKind::kSegment, "VisionIPC server '" + name_ + "' sent an inconsistent handshake");
  }
  sock_ = std::move(fd);
  adopt_topic(server_id_ == before);
  refusal_ = Refusal::kNone;
  error_.clear();
  return true;
}

// Bounds-check everything a server told us before mapping or indexing with it.
bool Client::accept_reply(const Reply& r, std::vector<common::UniqueFd>& fds) {
  if (fds.size() != 3 || r.lease_slot >= kMaxClients || r.lease_table_size != kLeaseTableSize) return false;
  Geometry g{static_cast<Format>(r.format), r.width, r.height, r.stride, r.uv_offset, r.buffer_size};
  if (r.format > static_cast<uint32_t>(Format::kCustom) || !geometry_problem(g).empty()) return false;
  if (r.count == 0 || r.count > kMaxBuffers || (r.pool_flags & ~kKnownPoolFlags) != 0) return false;
  const PoolLayout l = make_layout(r.count, r.buffer_size);
  if (l.slot_size != r.slot_size || l.data_offset != r.data_offset || l.total_size != r.pool_size) return false;
  if (!sealed_memfd_problem(fds[0].get(), l.total_size).empty()) return false;
  if (!sealed_memfd_problem(fds[1].get(), kLeaseTableSize).empty()) return false;
  // Pixels are writable, as in the reference (a client may annotate a frame;
  // every client sees the same bytes); the metadata the server's seqlock and
  // lease checks rely on is mapped read-only.
  auto pool = std::make_shared<Mapping>(fds[0].get(), l.total_size, true, l.data_offset);
  auto leases = std::make_unique<Mapping>(fds[1].get(), kLeaseTableSize, true);
  geometry_ = g;
  layout_ = l;
  pool_flags_ = r.pool_flags;
  pool_ = std::move(pool);
  epoch_++;
  disconnect();
  leases_ = std::move(leases);
  lease_ = reinterpret_cast<LeaseSlot*>(leases_->data()) + r.lease_slot;
  if (server_id_ != r.server_id) retired_id_ = server_id_;
  server_id_ = r.server_id;
  ordinal_ = r.stream_ordinal;
  topic_fd_ = std::move(fds[2]);  // checked as a segment when the subscriber adopts it
  return true;
}

void Client::require_host_frames() const {
  if ((pool_flags_ & kPoolInDeviceMemory) != 0) {
    common::fail(common::ErrorKind::kInvalidArgument,
                 "stream '" + stream_ + "' of VisionIPC server '" + name_ +
                     "' keeps its frames in GPU memory (create_buffers(memory=\"cuda\")); "
                     "read it with visionipc.VisionIpcClient(..., cuda=True)");
  }
}

bool Client::connected() {
  const common::UseGuard use(gate_);
  if (!use.ok() || !sock_) return false;
  pollfd p{sock_.get(), POLLIN, 0};
  if (poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR | POLLIN))) {
    disconnect();  // the server went away (it never sends after the handshake)
    return false;
  }
  return true;
}

std::shared_ptr<Mapping> Client::pool() const {
  const common::UseGuard use(gate_);
  return use.ok() ? pool_ : nullptr;
}

int Client::fileno() {
  const common::UseOrClosed call = use();
  return connected_subscriber().fileno();
}

bool Client::arm() {
  const common::UseOrClosed call = use();
  return connected_subscriber().arm();
}

const uint8_t* Client::buffer(uint32_t index) const {
  const common::UseOrClosed call = use();
  if (!pool_ || index >= layout_.count) common::fail(common::ErrorKind::kInvalidArgument, "buffer index out of range");
  return pool_->data() + layout_.data_offset + uint64_t{index} * layout_.slot_size;
}

bool Client::is_valid(uint32_t index, uint64_t generation) const {
  const common::UseGuard use(gate_);
  if (!use.ok() || !pool_ || index >= layout_.count) return false;
  std::atomic_thread_fence(std::memory_order_acquire);  // V: the caller's pixel reads come first
  const uint64_t g = meta(index).generation.load(std::memory_order_relaxed);
  return g == generation || g == (generation | kProbeBit);
}

bool Client::take_lease(uint32_t index, uint64_t generation) {
  const common::UseGuard use(gate_);
  if (!use.ok() || lease_ == nullptr || index >= layout_.count) return false;
  // L1: publish the lease, then confirm the frame is still there.
  lease_->word.store(lease_word(index, generation), std::memory_order_seq_cst);
  // A probe resolves within a few instructions; a server preempted (or
  // killed) mid-probe costs us at most this long, then the frame counts as lost.
  // (The clock is read only once a probe is seen: none on the common path.)
  int64_t give_up = 0;
  for (int spins = 0;; spins++) {
    const uint64_t g = meta(index).generation.load(std::memory_order_seq_cst);
    if (g == generation) return true;
    if (g != (generation | kProbeBit)) break;
    const int64_t now = common::monotonic_ns();
    if (give_up == 0) give_up = now + 2'000'000;
    if (now > give_up) break;
    if (spins > 64) sched_yield();
    common::cpu_relax();
  }
  lease_->word.store(0, std::memory_order_release);
  return false;
}

void Client::release_lease() {
  const common::UseGuard use(gate_);
  if (use.ok() && lease_ != nullptr) lease_->word.store(0, std::memory_order_release);  // L2
}

bool Client::handle(const Packet& p, Frame& out) {
  if (p.magic != kProtocolMagic || p.server_id == retired_id_) return false;
  if (p.server_id != server_id_ || !sock_) {
    // A new server instance (restart): remap before trusting its indices.
    if (!connect() || p.server_id != server_id_) return false;
  }
  if (p.stream_ordinal != ordinal_ || p.index >= layout_.count || (p.generation & 1)) return false;
  out.index = p.index;
  out.generation = p.generation;
  out.frame_id = p.frame_id;
  out.timestamp_sof = p.timestamp_sof;
  out.timestamp_eof = p.timestamp_eof;
  out.publish_ns = p.publish_ns;
  out.receive_ns = static_cast<uint64_t>(common::monotonic_ns());
  out.valid = take_lease(p.index, p.generation);
  return true;
}

// Waits in slices of kReconnectCheckNs: a slice that ends without data
// checks the connection and reconnects to a restarted server (whose frames
// go to a new ring). Frames arriving never pay for the check.
common::WaitStatus Client::recv(int64_t deadline_ns, Frame& out) {
  const common::UseGuard use(gate_);
  if (!use.ok()) return common::WaitStatus::kClosed;
  check_owner();  // an inherited subscriber would move the parent's read position
  if (receiving_.exchange(true, std::memory_order_acquire)) {
    common::fail(common::ErrorKind::kIpc,
                 "recv() of this client is already waiting in another thread: use one client per thread");
  }
  struct Done {
    std::atomic<bool>& flag;
    ~Done() { flag.store(false, std::memory_order_release); }
  } done{receiving_};
  for (;;) {
    if (gate_.closing()) return common::WaitStatus::kClosed;  // close() on another thread waits for us
    if (sub_) {
      PacketSink sink;
      while (sub_->try_read(sink)) {
        if (sink.size == sizeof(Packet) && handle(sink.packet, out)) return common::WaitStatus::kReady;
        dropped_++;
      }
    }
    const int64_t now = common::monotonic_ns();
    if (deadline_ns != common::kNever && now >= deadline_ns) return common::WaitStatus::kTimeout;
    const int64_t slice =
        deadline_ns == common::kNever ? now + kReconnectCheckNs : std::min(deadline_ns, now + kReconnectCheckNs);
    if (sub_) {
      const common::WaitStatus st = sub_->wait(slice);
      if (st == common::WaitStatus::kInterrupted || st == common::WaitStatus::kClosed) return st;
      if (st != common::WaitStatus::kTimeout || common::monotonic_ns() < slice) continue;
    } else {
      const int64_t ns = slice - now;
      timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
      if (nanosleep(&ts, nullptr) != 0 && errno == EINTR) return common::WaitStatus::kInterrupted;
    }
    if (gate_.closing()) return common::WaitStatus::kClosed;
    if (!connected()) connect();
  }
}

std::optional<std::vector<std::string>> Client::list_streams(const std::string& name, const ClientOptions& options) {
  check_name("server name", name);
  common::UniqueFd fd = dial(options.prefix, name);
  if (!fd) return std::nullopt;
  check_server(fd.get(), name, options);
  auto reply = std::make_unique<Reply>();
  std::vector<common::UniqueFd> fds;
  if (!ask(fd.get(), name, RequestKind::kList, "", *reply, fds) || reply->status != 0) return std::nullopt;
  std::vector<std::string> out;
  std::string cur;
  for (uint32_t i = 0; i < std::min<uint32_t>(reply->list_length, kListCapacity); i++) {
    if (reply->list[i] == '\n') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += reply->list[i];
    }
  }
  return out;
}

}  // namespace vipc::visionipc
