// VisionIpcClient: connects to a server's socket, maps one stream's pool
// read-only, receives frame packets over msgq, and holds at most one read
// lease at a time (the frame it is looking at).
//
// Server restarts: a hang-up of the socket (checked when a wait slice of
// recv() passes without a frame) makes the client reconnect, remap and move
// to the new server's topic ring (rings are unnamed, passed by fd); views
// of the old mapping stay readable (they own it) until dropped.
//
// Fork: only the process that made the client writes its lease slot or
// touches the segment's locks; in a forked child close() only forgets.
//
// Threads: one recv() at a time (a second one throws kIpc). close() may come
// from any thread while another one is in recv() or the lease and buffer
// calls: it ends a wait on the ring (Subscriber::interrupt), waits for every
// call in flight to leave (gate_), then drops the mapping and the connection.
// From then on recv() returns kClosed, buffer()/connect() throw kClosed,
// pool() is null, and the lease calls do nothing (is_valid() is false).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <sys/types.h>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/files.h"
#include "common/names.h"
#include "common/use_gate.h"
#include "common/wait_status.h"
#include "msgq/subscriber.h"
#include "visionipc/format.h"
#include "visionipc/pool.h"
#include "visionipc/protocol.h"

namespace vipc::visionipc {

struct ClientOptions {
  std::string prefix;
  std::string shm_dir = std::string(common::kSegmentDir);
  // Server uids this client trusts besides its own and root's (checked with
  // SO_PEERCRED: anyone can bind a server's abstract socket name first).
  std::vector<uid_t> trusted_uids;
};

struct Frame {
  uint32_t index = 0;
  uint64_t generation = 0;
  uint64_t frame_id = 0, timestamp_sof = 0, timestamp_eof = 0;
  uint64_t publish_ns = 0, receive_ns = 0;  // CLOCK_MONOTONIC at the server's send / our receive
  bool valid = false;                       // the buffer still holds this frame and we lease it
};

class Client {
 public:
  Client(std::string name, std::string stream, bool conflate, ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // One attempt, never waits: true once connected and mapped. False when the
  // server or the stream does not exist (yet), or refused us: last_refusal()
  // and last_error() then say why (a refusal by uid throws kPermission).
  bool connect();
  enum class Refusal { kNone, kNoServer, kUnknownStream, kFull, kPeerLimit };
  Refusal last_refusal() const { return refusal_; }
  const std::string& last_error() const { return error_; }
  bool connected();
  // Wait for the next frame until deadline (monotonic ns, common::kNever). A
  // returned frame is leased (the previous lease is dropped) when still valid.
  // One recv() at a time: a second thread's call while one waits throws kIpc
  // (the client's read position and lease belong to one reader: use a client
  // per thread) rather than handing both threads parts of one stream.
  common::WaitStatus recv(int64_t deadline_ns, Frame& out);

  bool take_lease(uint32_t index, uint64_t generation);
  void release_lease();
  bool is_valid(uint32_t index, uint64_t generation) const;

  const Geometry& geometry() const { return geometry_; }
  uint32_t count() const { return layout_.count; }
  // Reply::pool_flags of the pool mapped now (kPoolInDeviceMemory: frames in GPU memory).
  uint32_t pool_flags() const { return pool_flags_; }
  // For readers of host frames (the C++ API): throws kInvalidArgument, in one line,
  // when the mapped pool keeps its frames in device memory.
  void require_host_frames() const;
  std::shared_ptr<Mapping> pool() const;
  const uint8_t* buffer(uint32_t index) const;
  uint64_t server_id() const { return server_id_; }
  // Bumped each time a (re)connect maps a pool: views made under an older
  // epoch belong to a mapping the client no longer uses (caches key on it).
  uint64_t epoch() const { return epoch_; }
  uint64_t dropped() const { return dropped_; }  // packets that failed validation
  // The frame topic's wake descriptor for event loops (msgq::Subscriber::fileno / arm); once connected.
  int fileno();
  bool arm();
  // Drop the lease and the connection. In a forked child (another pid than
  // the one that made the client) this is forget_after_fork().
  void close();
  // Drop this process's copies of the descriptors and mappings without
  // touching the lease slot or any segment lock (the parent still uses them).
  void forget_after_fork();

  // Stream names a server offers (one attempt); nullopt if no server answers.
  static std::optional<std::vector<std::string>> list_streams(const std::string& name, const ClientOptions& options);

 private:
  void disconnect();
  bool refused(Refusal why, std::string message);  // records why connect() failed; false
  bool accept_reply(const Reply& r, std::vector<common::UniqueFd>& fds);
  bool handle(const Packet& p, Frame& out);
  msgq::Subscriber& connected_subscriber() {
    if (!sub_)
      common::fail(common::ErrorKind::kInvalidArgument, "connect() first: the frame topic comes with the connection");
    return *sub_;
  }
  void adopt_topic(bool same_server);
  void check_owner() const;  // kClosed in a forked child that did not close() the client first
  // A call that uses the connection's state (close() waits for it), or kClosed.
  common::UseOrClosed use() const { return common::UseOrClosed(gate_, "VisionIPC client is closed"); }
  // How long recv() waits on the ring before it checks that the server is
  // still there (and reconnects to a restarted one).
  static constexpr int64_t kReconnectCheckNs = 50'000'000;
  const BufferMeta& meta(uint32_t i) const { return reinterpret_cast<const BufferMeta*>(pool_->data())[i]; }

  std::string name_, stream_;
  bool conflate_;
  ClientOptions options_;
  common::UniqueFd sock_;
  common::UniqueFd topic_fd_;  // the topic segment the server passed (attach reply), until adopt_topic() takes it
  std::shared_ptr<Mapping> pool_;
  std::unique_ptr<Mapping> leases_;
  LeaseSlot* lease_ = nullptr;
  Geometry geometry_;
  PoolLayout layout_;
  uint32_t pool_flags_ = 0;
  uint64_t server_id_ = 0;
  uint64_t epoch_ = 0;
  uint64_t retired_id_ = 0;  // the server we left: its late packets are dropped, not chased
  uint32_t ordinal_ = 0;
  uint64_t dropped_ = 0;
  // Set while a recv() runs (exchange on entry, cleared on every exit), so a
  // second thread's recv() is refused. acquire/release: a recv() that follows
  // another one in a different thread sees everything the first one did.
  std::atomic<bool> receiving_{false};
  std::unique_ptr<msgq::Subscriber> sub_;  // replaced (adopt_topic) only under sub_mutex_
  std::mutex sub_mutex_;                   // sub_'s replacement vs close()'s interrupt of the old one
  // Calls in flight (recv, leases, buffer, pool, connect): close() waits for them.
  // SYNC: UseGate's enter/begin_close pairing; a call's leave (release) before
  // close()'s idle check (seq_cst) orders its writes before the teardown.
  mutable common::UseGate gate_;
  pid_t owner_ = 0;  // the process that made the client: the only one that writes its lease or locks
  Refusal refusal_ = Refusal::kNone;
  std::string error_;
};

}  // namespace vipc::visionipc
