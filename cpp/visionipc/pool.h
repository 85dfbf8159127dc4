// The shared memory of one stream: a frame pool and a lease table, each one
// sealed memfd (nothing on disk, nothing left in /dev/shm after a crash; the
// kernel frees it when the last fd and mapping go).
//
// Pool memfd: [BufferMeta x count, padded to 4096][buffer 0][buffer 1]...
// Each buffer starts on a 4096-byte boundary (slot_size = align4096(size)).
// Lease memfd: LeaseSlot x kMaxClients.
//
// Both are sealed against shrinking and growing before any client sees them,
// so a mapping can never turn into SIGBUS under a reader.
//
// Generation protocol (a seqlock per buffer, server = the only writer):
//   G1 acquire (get_buffer), for a candidate with even generation g:
//      a. probe: generation = g | kProbeBit (seq_cst), then re-read the lease
//         table (seq_cst): Dekker pair with L1. Leased: restore g, next
//         candidate. The pixels are untouched while probing, so readers
//         count g | kProbeBit as still g.
//      b. commit: generation = g + 1 (odd: the producer owns it), then a
//         release fence: every pixel write is ordered after the odd value.
//   G2 the producer writes pixels.
//   G3 publish (send): frame_id / timestamps (relaxed), then generation =
//      g + 2 (release), then the msgq packet names (index, g + 2).
// Lease protocol (client = the one writer of its slot):
//   L1 take: slot = pack(index, g) (seq_cst store), then re-read the buffer's
//      generation (seq_cst): g -> the lease holds (the server's G1a re-read
//      will see it); g | kProbeBit -> a probe is in flight, wait (bounded)
//      for it to resolve; anything else -> clear the slot, frame invalid.
//   L2 drop: slot = 0 (release).
//   L3 the server's listener stores 0 when the client's socket hangs up.
// V  validity after reading pixels: acquire fence, then load the generation:
//    g or g | kProbeBit means no pixel of the frame was overwritten.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/files.h"

namespace vipc::visionipc {

inline constexpr uint32_t kMaxBuffers = 256;
inline constexpr uint32_t kMaxClients = 64;  // lease slots (client connections) per stream
// Admission is fair per peer: one process holds at most this many of a
// stream's lease slots, and at most this many connections that have not asked
// for anything yet (ServerOptions::max_per_peer overrides it).
inline constexpr uint32_t kMaxClientsPerPeer = kMaxClients / 4;
// Connections that have not asked for anything yet, all peers together.
inline constexpr uint32_t kMaxPending = 2 * kMaxClients;
inline constexpr uint64_t kProbeBit = 1ull << 63;  // G1a; real generations never get near it

struct alignas(64) BufferMeta {
  // SYNC: server stores the probe (G1a) and odd (G1b) seq_cst, even at G3
  // (release); clients load after an acquire fence (V) and seq_cst (L1).
  // 0 = never published.
  std::atomic<uint64_t> generation;
  // Server writes (relaxed) before the G3 release; clients read between two
  // generation loads. Informational copies of the packet's metadata.
  std::atomic<uint64_t> frame_id;
  std::atomic<uint64_t> timestamp_sof;
  std::atomic<uint64_t> timestamp_eof;
};
static_assert(sizeof(BufferMeta) == 64, "one cache line per buffer: the server's G1/G3 stores stay apart");

struct alignas(64) LeaseSlot {
  // SYNC: client stores at L1 (seq_cst) / L2 (release); server loads (seq_cst)
  // at G1 and stores 0 at L3. 0 = no lease; else lease_word(index, generation).
  std::atomic<uint64_t> word;
};
static_assert(sizeof(LeaseSlot) == 64, "a slot per cache line: clients do not contend");
inline constexpr size_t kLeaseTableSize = sizeof(LeaseSlot) * kMaxClients;

// Generations are even and >= 2 once published, so a packed word is never 0;
// 48 bits of generation outlast any camera.
inline uint64_t lease_word(uint32_t index, uint64_t generation) { return (generation << 16) | (index & 0xffff); }

struct PoolLayout {
  uint32_t count = 0;
  uint64_t buffer_size = 0;
  uint64_t slot_size = 0;    // align4096(buffer_size)
  uint64_t data_offset = 0;  // align4096(count * sizeof(BufferMeta))
  uint64_t total_size = 0;   // data_offset + count * slot_size
};
PoolLayout make_layout(uint32_t count, uint64_t buffer_size);

// A mapping, unmapped when the last owner (server, client, numpy view) goes.
class Mapping {
 public:
  // writable: PROT_READ|PROT_WRITE, except the first read_only_prefix bytes
  // (a page multiple), which stay PROT_READ.
  Mapping(int fd, size_t size, bool writable, size_t read_only_prefix = 0);
  ~Mapping();
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// A new sealed memfd of `size` zero bytes, reserved now. Refused first with
// kNoSpace (nothing allocated) when `size` exceeds pool_memory_limit().
common::UniqueFd create_sealed_memfd(const char* name, size_t size);

// What one shared-memory allocation of this process may take: the least of
// MemAvailable (/proc/meminfo), the room left under our cgroup's limit (v2
// memory.max - memory.current, or v1 limit_in_bytes - usage_in_bytes) and
// VIPC_MAX_POOL_BYTES (a cap the user sets; a bad value is kInvalidArgument).
// `why` names the binding constraint. Without any of them: UINT64_MAX.
uint64_t pool_memory_limit(std::string* why);
// Empty if fd is a memfd of exactly `size` bytes sealed against shrink and grow.
std::string sealed_memfd_problem(int fd, size_t size);

}  // namespace vipc::visionipc
