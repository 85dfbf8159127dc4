// VisionIpcServer: owns the frame pools of one named server, hands buffers
// to the producer, publishes frames over msgq and serves clients their fds.
//
// Topic rings: each stream's msgq segment is unlinked right after it is
// made; clients get it by fd at attach, so a server leaves nothing in the shm
// directory whatever kills it. Fork: only the process that made the server
// stops its listener (close() in a forked child only forgets its copies).
//
// Threads: each stream's get_buffer() / send() belong to one producer thread
// at a time; different streams may have producer threads of their own, all
// sending at once (a stream's state is touched by its producer only; the map
// of streams is under mutex_, and create_buffers() may add one meanwhile). The
// listener thread only reads stream geometry (under mutex_) and clears lease
// slots of clients that hung up. close() may come from any thread: it waits
// for calls in flight (gate_) before it drops the streams, and later calls
// throw kClosed; a buffer handed out keeps its pool mapped (Acquired::pool).
//
// Buffer choice (get_buffer): the least recently sent buffer that no client
// holds a lease on and the producer has not already checked out. When every
// buffer is leased, the least recently sent one is taken anyway: its
// generation moves on, so the client holding it sees valid == false (it is
// told, never handed a torn frame). get_buffer never blocks.
//
// Per-frame cost (issue 36): a camera calls get_buffer/send cold, right after a
// sleep, so each distinct cache line and page they touch costs a miss. The
// calls by handle reach the stream without a name, lock or map; acquire walks
// the buffers in send order (Stream::lru, kept by publish) instead of sorting,
// and reads only admitted clients' lease slots (Stream::slot_used): with the
// whole lease table in one page, a per-buffer lease summary would save lines
// of that page, not the page, so the slots stay the one place leases live.
// Most of a cold frame's misses are code, not data: the per-frame functions are
// [[gnu::hot]] (placed together in .text.hot, rare paths out of line), and the
// Python methods reach them without a Python frame (python/fast_method.h).
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/files.h"
#include "common/names.h"
#include "common/use_gate.h"
#include "msgq/publisher.h"
#include "visionipc/format.h"
#include "visionipc/pool.h"
#include "visionipc/protocol.h"

namespace vipc::visionipc {

struct ServerOptions {
  std::string prefix;                                      // run prefix (MSGQ_PREFIX), part of every name
  std::string shm_dir = std::string(common::kSegmentDir);  // where the msgq topic segments live
  std::vector<uid_t> allowed_uids;                         // besides our own uid
  // Connections one peer process may hold to this server (pending or
  // attached, all streams together): one process cannot take every lease slot.
  uint32_t max_per_peer = kMaxClientsPerPeer;
  // How a send wakes clients asleep in recv() (msgq::WakeMode): kHandoff keeps
  // the server's cost per frame that of one client, whatever their number.
  msgq::WakeMode wake = msgq::WakeMode::kAll;
};

// A buffer checked out by checkout(): get_buffer() without its address.
struct Checkout {
  uint32_t index;
  uint64_t generation;  // odd: the producer owns the buffer until send()
};

struct Acquired {
  uint32_t index;
  uint64_t generation;  // odd: the producer owns the buffer until send()
  uint8_t* data;
  std::shared_ptr<Mapping> pool;  // keeps data mapped, even past the server's close()
};

class Server {
 public:
  Server(std::string name, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // pool_flags: Reply::pool_flags for the stream's clients (kPoolInDeviceMemory: the
  // caller keeps the frames in device memory; the pool still carries the protocol).
  void create_buffers(const std::string& stream, uint32_t count, const Geometry& geometry, uint32_t pool_flags = 0);
  Acquired get_buffer(const std::string& stream);
  // Publish a buffer from get_buffer(); throws kInvalidArgument if it is not
  // checked out under that generation (sent already, or recycled since).
  void send(const std::string& stream, uint32_t index, uint64_t generation, uint64_t frame_id, uint64_t sof,
            uint64_t eof);
  // The reference's copying send in one call (one stream lookup): throws
  // kInvalidArgument unless `size` is the stream's buffer size, checks a buffer
  // out as get_buffer() does, lets `fill` write its `size` bytes, and publishes
  // it as send() does. Returns the buffer's index.
  uint32_t send_copy(const std::string& stream, uint64_t size, uint64_t frame_id, uint64_t sof, uint64_t eof,
                     const std::function<void(uint8_t*)>& fill);
  // The per-frame calls by stream handle (handle(): the stream's ordinal, fixed for
  // the server's life): no name, no lock and no map on the way, so a producer at a
  // camera's pace touches few cold cache lines. Same checks and errors as by name;
  // an unknown handle is kInvalidArgument.
  uint32_t handle(const std::string& stream) const;
  Checkout checkout(uint32_t handle);
  void send_at(uint32_t handle, uint32_t index, uint64_t generation, uint64_t frame_id, uint64_t sof, uint64_t eof);
  uint32_t send_copy_at(uint32_t handle, uint64_t size, uint64_t frame_id, uint64_t sof, uint64_t eof,
                        const std::function<void(uint8_t*)>& fill);
  void start_listener();
  // Stop the listener and drop the pools. In a forked child (another pid than
  // the one that made the server) this is forget_after_fork(): the parent's
  // listener, socket and topics stay untouched.
  void close();
  // Drop this process's copies of the descriptors and mappings without
  // writing the stop eventfd, joining the (parent's) thread or taking any lock.
  void forget_after_fork();

  std::vector<std::string> streams() const;
  Geometry geometry(const std::string& stream) const;
  uint32_t count(const std::string& stream) const;
  std::shared_ptr<Mapping> pool(const std::string& stream) const;
  uint8_t* buffer(const std::string& stream, uint32_t index) const;
  uint64_t id() const { return id_; }
  const std::string& name() const { return name_; }
  uint32_t clients(const std::string& stream) const;
  // Sleeping clients the stream's sends woke with the server's own system
  // calls (msgq::Publisher::readers_woken): with WakeMode::kHandoff one per frame.
  uint64_t readers_woken(const std::string& stream) const;
  msgq::WakeMode wake() const { return options_.wake; }
  // The generation the server last gave the buffer (odd: checked out).
  uint64_t generation(const std::string& stream, uint32_t index) const;

 private:
  struct Stream {
    std::string name;
    uint32_t ordinal = 0;
    Geometry geometry;
    PoolLayout layout;
    uint32_t pool_flags = 0;  // Reply::pool_flags
    common::UniqueFd pool_fd, lease_fd;
    std::shared_ptr<Mapping> pool;
    std::unique_ptr<Mapping> leases;
    std::unique_ptr<msgq::Publisher> publisher;
    // The mappings' parts, resolved once (the per-frame path reads no Mapping).
    BufferMeta* metas = nullptr;
    LeaseSlot* slots = nullptr;
    uint8_t* pixels = nullptr;         // buffer 0
    std::vector<uint64_t> generation;  // our copy of each buffer's generation
    // Buffer indices from least to most recently sent (never sent first, by index):
    // publish() moves the sent one to the back, so acquire() needs no sort.
    std::vector<uint16_t> lru;
    // Lease slots given to live connections: written by the listener under mutex_,
    // read by the producer without it. SYNC: a bit is set (seq_cst RMW) before the
    // admission reply goes out, so before the client's first lease store (L1), and
    // cleared after L3 zeroed the slot; the producer's leased() reads only the slots
    // set here (seq_cst), after its probe (G1a): see leased() for why that is enough.
    std::atomic<uint64_t> slot_used{0};
    BufferMeta& meta(uint32_t i) const { return metas[i]; }
    LeaseSlot& lease(uint32_t slot) const { return slots[slot]; }
    uint8_t* buffer(uint32_t i) const { return pixels + uint64_t{i} * layout.slot_size; }
  };
  struct Connection {
    common::UniqueFd fd;
    pid_t peer = 0;            // SO_PEERCRED pid: admission is counted per peer
    int64_t accepted_ns = 0;   // monotonic: a connection still pending kPendingTimeoutNs later is dropped
    Stream* stream = nullptr;  // set once attached
    uint32_t slot = 0;
  };

  void check_open() const;  // kClosed after close() and in a forked child
  // One call that uses the streams (close() waits for it: gate_), or kClosed.
  common::UseOrClosed use() const { return common::UseOrClosed(gate_, "VisionIPC server is closed"); }
  Stream& find(const std::string& stream) const;
  Stream& at(uint32_t handle) const;  // by handle(), or kInvalidArgument (the caller holds use())
  [[gnu::cold]] [[gnu::noinline]] Stream& at_slowly(uint32_t handle) const;  // at() past kFastStreams, or none
  // get_buffer(), send() and send_copy() on a stream already found (the caller holds use()).
  Checkout acquire(Stream& s);
  void publish(Stream& s, uint32_t index, uint64_t generation, uint64_t frame_id, uint64_t sof, uint64_t eof);
  uint32_t send_copy_on(Stream& s, uint64_t size, uint64_t frame_id, uint64_t sof, uint64_t eof,
                        const std::function<void(uint8_t*)>& fill);
  bool leased(const Stream& s, uint32_t index, uint64_t generation) const;
  static constexpr int64_t kPendingTimeoutNs = 2'000'000'000;  // a client asks right after it connects
  void listen_loop();
  void accept_client();
  bool serve_request(Connection& c);  // false: drop the connection
  void hang_up(Connection& c);
  bool peer_allowed(const ucred& cred) const;
  void refuse(int fd, ReplyStatus status);
  uint32_t list_streams(Reply& reply) const;               // names into reply.list (mutex_ held); its length
  uint32_t peer_slots(pid_t peer, const Stream& s) const;  // s's slots held by that peer (listener thread)

  std::string name_;
  ServerOptions options_;
  pid_t owner_ = 0;  // the process that made the server: the only one that may stop its listener
  uint64_t id_;
  mutable std::mutex mutex_;      // streams_ (structure), Stream::slot_used's writers
  mutable common::UseGate gate_;  // calls in flight that use streams_ (see use())
  std::map<std::string, std::unique_ptr<Stream>> streams_;
  // streams_ by ordinal, for at(): the first kFastStreams without a lock. SYNC: set
  // (release) by create_buffers() once the stream is complete, read (acquire) by
  // at(); cleared by close() and forget_after_fork() before streams_ goes.
  static constexpr uint32_t kFastStreams = 64;
  std::array<std::atomic<Stream*>, kFastStreams> by_ordinal_{};
  common::UniqueFd listen_fd_, stop_fd_;
  std::vector<Connection> connections_;  // listener thread only
  std::thread listener_;
};

}  // namespace vipc::visionipc
