// Shared-memory layout of one ordered (out-of-order submission) topic:
// [TopicHeader][SlotMeta x capacity][slot data x capacity]. Message id X
// lives in slot X % capacity. Steps O1..O5 / S1..S3 are in cpp/ordered/README.md.
#pragma once

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "common/shm_file.h"

namespace vipc::ordered {

inline constexpr uint64_t kMagic = 0x31304452'44524f51ull;  // "QORDRD01" read as little-endian
inline constexpr uint32_t kLayoutVersion = 2;               // 2: SlotMeta::owner, the reclaimed stamp state
inline constexpr uint32_t kMinCapacity = 16;                // >= the availability window: a slot is reused
                                                            // only after its previous id left the window
inline constexpr uint32_t kMaxCapacity = 1 << 16;
inline constexpr uint64_t kMaxSlotBytes = uint64_t{1} << 30;
inline constexpr size_t kCacheLine = 64;

static_assert(std::endian::native == std::endian::little,
              "readers sleep on the low 32 bits of the availability word (bitmap + low bits of last)");

struct alignas(kCacheLine) TopicHeader {
  // --- line 0: identity, written once under the init lock; copied at attach.
  uint64_t magic;
  uint32_t layout_version;
  uint32_t capacity;     // slots, kMinCapacity..kMaxCapacity
  uint64_t slot_bytes;   // payload capacity of one slot
  uint64_t slot_stride;  // distance between slots (64- or 4096-aligned)
  uint64_t data_offset;  // offset of slot 0's data (page multiple)
  uint64_t created_ns;
  uint32_t creator_uid;
  uint32_t reserved0;
  char pad0[kCacheLine - 56];

  // --- line 1: the availability word (availability.h), CASed by producers.
  // Readers load(acquire) it, and sleep on its low 32 bits (FUTEX_WAIT_BITSET,
  // bit id % 32): any change of bitmap or of last's low bits ends the sleep.
  std::atomic<uint64_t> availability;
  char pad1[kCacheLine - 8];

  // --- line 2: waiters. Readers (and producers waiting for window room):
  // fetch_add(seq_cst) before their last check, fetch_sub after. Producers:
  // load(seq_cst) after the seq_cst O3 CAS; zero means no syscall.
  std::atomic<uint32_t> sleepers;
  std::atomic<uint32_t> shutdown;  // 1 after shutdown(): store(seq_cst), then a wake of every sleeper
  char pad2[kCacheLine - 8];
};
static_assert(offsetof(TopicHeader, availability) == kCacheLine, "producers' line");
static_assert(offsetof(TopicHeader, sleepers) == 2 * kCacheLine, "waiters' line");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared atomics must be lock-free");

// Per-slot seqlock stamp: (id + 1) << 2 | state. 0 = never written.
inline constexpr uint64_t kStateReclaimed = 0;  // its producer died holding the id: a gap (never 0 as a whole stamp)
inline constexpr uint64_t kStateWriting = 1;
inline constexpr uint64_t kStateDone = 2;
inline constexpr uint64_t kStateCancelled = 3;
inline constexpr uint64_t stamp(uint64_t id, uint64_t state) { return ((id + 1) << 2) | state; }
inline constexpr uint64_t stamp_id(uint64_t s) { return (s >> 2) - 1; }  // only for s != 0
inline constexpr uint64_t stamp_state(uint64_t s) { return s & 3; }

struct alignas(kCacheLine) SlotMeta {
  // The producer of id X: store(stamp(X, writing), relaxed) + release fence
  // (S1) before any payload byte; store(stamp(X, done or cancelled), release)
  // after the last (S2). Readers: load(acquire) before copying, then an
  // acquire fence and a second load after (S3): unchanged = not torn.
  std::atomic<uint64_t> stamp;
  // Written by the producer between S1 and S2 (relaxed); read between the
  // reader's two stamp loads, so they are as good as the payload.
  std::atomic<uint64_t> size;
  std::atomic<uint64_t> t0;  // user stamps (VisionIPC: timestamp_sof, timestamp_eof)
  std::atomic<uint64_t> t1;
  // The token of the producer filling the slot: stored (relaxed) before the
  // release CAS of S1, read after an acquire load of a writing stamp. Its
  // liveness lock (producer_liveness_byte) says whether that producer lives.
  std::atomic<uint64_t> owner;
  char pad[kCacheLine - 40];
};
static_assert(sizeof(SlotMeta) == kCacheLine, "one cache line per slot: producers do not contend");

// Each producer holds an exclusive OFD lock on this byte of the topic file
// while attached; the kernel drops it when the process dies.
inline constexpr off_t kLockProducerBase = off_t{1} << 20;
inline constexpr uint64_t kProducerTokens = uint64_t{1} << 24;
inline constexpr off_t producer_liveness_byte(uint64_t token) {
  return kLockProducerBase + static_cast<off_t>(token % kProducerTokens);
}

inline constexpr uint64_t page_align(uint64_t n) { return (n + 4095) & ~uint64_t{4095}; }
inline constexpr uint64_t slot_stride_for(uint64_t slot_bytes) {
  return slot_bytes >= 4096 ? page_align(slot_bytes) : (slot_bytes + kCacheLine - 1) & ~uint64_t{kCacheLine - 1};
}
inline constexpr uint64_t data_offset_for(uint32_t capacity) {
  return page_align(sizeof(TopicHeader) + sizeof(SlotMeta) * uint64_t{capacity});
}

}  // namespace vipc::ordered
