// Shared-memory layout of one lossless broadcast queue (cpp/broadcast/README.md):
// [QueueHeader][ChunkMeta x n_chunks][chunk data x n_chunks].
// The protocol steps cited in comments (BW1..BW3, BR1..BR3) are numbered in
// cpp/broadcast/README.md. Publisher-written and reader-written fields sit
// on separate cache lines; offsets are static_asserted.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "common/shm_file.h"
#include "common/wait_point.h"

namespace vipc::broadcast {

inline constexpr uint64_t kMagic = 0x31305154'53414342ull;  // "BCASTQ01" read as little-endian
inline constexpr uint32_t kLayoutVersion = 3;               // 2: space_wanted; 3: wait points' may-sleep bit
inline constexpr uint32_t kMaxReaders = 64;                 // one bit each in ChunkMeta::read_mask
inline constexpr uint32_t kMaxChunks = 4096;
inline constexpr uint64_t kMinChunkBytes = 64;
inline constexpr uint64_t kMaxChunkBytes = uint64_t{1} << 31;
inline constexpr size_t kCacheLine = 64;

// OFD lock bytes (beyond kLockInit/kLockPresence of common/shm_file.h).
inline constexpr off_t kLockWriter = 32;      // exclusive while the writer is attached
inline constexpr off_t kLockReaderBase = 64;  // exclusive: reader r attached, byte 64 + r

struct alignas(kCacheLine) ReaderSlot {
  // Reader r: store(relaxed) at BR3 and at attach; the writer's warnings
  // read it (relaxed). Informational: the protocol itself uses read_mask.
  std::atomic<uint64_t> consumed;  // messages this reader has consumed
  std::atomic<uint32_t> pid;       // last process attached as reader r (0: never)
  uint32_t reserved;
  char pad[kCacheLine - 16];
};
static_assert(sizeof(ReaderSlot) == kCacheLine, "one cache line per reader: readers do not contend");

struct alignas(kCacheLine) QueueHeader {
  // --- line 0: identity, written once by the creator under the init lock,
  // copied to process memory at attach and never re-read.
  uint64_t magic;
  uint32_t layout_version;
  uint32_t n_readers;  // local readers known at creation, 1..64
  uint32_t n_chunks;   // 1..4096
  uint32_t creator_uid;
  uint64_t chunk_bytes;   // payload capacity of one chunk (multiple of 64)
  uint64_t header_bytes;  // offset of the chunk data (page multiple)
  uint64_t created_ns;
  char pad0[kCacheLine - 48];

  // --- line 1: writer-owned.
  // Messages written so far. Writer: store(release) after BW3; readers load
  // (relaxed) for statistics only (each chunk carries its own flag).
  std::atomic<uint64_t> written;
  // 1 once shutdown() was called (by anyone). store(seq_cst), then both wait
  // points are notified; every wait re-checks it.
  std::atomic<uint32_t> shutdown;
  std::atomic<uint32_t> writer_pid;
  char pad1[kCacheLine - 16];

  // --- line 2: readers sleep here waiting for a chunk to be written (BW3 notifies).
  common::WaitPoint data_ready;
  char pad2[kCacheLine - sizeof(common::WaitPoint)];
  // --- line 3: the writer sleeps here waiting for chunks to be consumed (BR3 notifies).
  common::WaitPoint space_free;
  // While the writer sleeps on a full ring: it waits until every reader has
  // consumed the messages before this one (BW1's hysteresis), and the last
  // reader of message m wakes it only once m + 1 >= space_wanted. Writer:
  // store(relaxed) before its seq_cst sleeper registration (the fetch_or of
  // the may-sleep bit, a release); readers: load(relaxed) only after their
  // acquire load saw that bit (a stale, lower value costs a spurious wake,
  // never a missed one).
  std::atomic<uint64_t> space_wanted;
  char pad3[kCacheLine - sizeof(common::WaitPoint) - 8];

  ReaderSlot readers[kMaxReaders];
};
static_assert(offsetof(QueueHeader, written) == 1 * kCacheLine, "writer line");
static_assert(offsetof(QueueHeader, data_ready) == 2 * kCacheLine, "reader wake line");
static_assert(offsetof(QueueHeader, space_free) == 3 * kCacheLine, "writer wake line");
static_assert(offsetof(QueueHeader, readers) == 4 * kCacheLine, "reader slots");

// The seed's per-chunk metadata: a written flag and one read flag per reader.
// The written flag is the sequence number + 1 of the message the chunk holds
// (0: never written), so a reader can tell this lap's message from the last
// lap's (the seed's 0/1 flag cannot, which is how its readers raced the writer).
struct alignas(kCacheLine) ChunkMeta {
  // Writer: store(seq + 1, release) at BW3, after the payload. Reader: load
  // (acquire) at BR1 and compares with the sequence number it expects.
  std::atomic<uint64_t> written;
  // Bit r: reader r consumed the message the chunk holds. Writer: store(0,
  // relaxed) at BW2 (ordered before readers' fetch_or by BW3's release);
  // load(acquire) at BW1. Reader r: fetch_or(bit, release) at BR3, after its copy.
  std::atomic<uint64_t> read_mask;
  char pad[kCacheLine - 16];
};
static_assert(sizeof(ChunkMeta) == kCacheLine, "one cache line per chunk");

// A chunk's payload: [ChunkFrame][u64 part_len x n_parts][parts, each 8-aligned].
struct ChunkFrame {
  uint32_t flags;    // kFlag* below
  uint32_t n_parts;  // pickle stream + out-of-band buffers, or 1 raw part
  uint64_t total;    // bytes used in the chunk, frame included
};
inline constexpr uint32_t kFlagRaw = 1;       // raw bytes, not a pickle stream
inline constexpr uint32_t kFlagOverflow = 2;  // payload travels on the ZeroMQ side channel
inline constexpr uint32_t kMaxParts = 1 << 16;

inline constexpr size_t align8(size_t n) { return (n + 7) & ~size_t{7}; }
inline constexpr size_t page_align(size_t n) { return (n + 4095) & ~size_t{4095}; }
inline constexpr size_t header_bytes(uint32_t n_chunks) {
  return page_align(sizeof(QueueHeader) + sizeof(ChunkMeta) * n_chunks);
}
// Bytes a message of these parts takes in a chunk.
inline size_t framed_size(const uint64_t* lens, size_t n_parts) {
  size_t total = sizeof(ChunkFrame) + 8 * n_parts;
  for (size_t i = 0; i < n_parts; i++) total += align8(lens[i]);
  return total;
}

}  // namespace vipc::broadcast
