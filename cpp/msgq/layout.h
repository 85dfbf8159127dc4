// The shared-memory layout of one MSGQ topic segment: [SegmentHeader][data ring].
//
// Every field states who writes it, with which ordering, and what it pairs with
// ("SYNC" comments). The protocol steps cited here (W1..W3, R1..R5, X1..X3) are
// numbered in cpp/msgq/README.md, which follows the seed spec (seeds 000/001).
//
// Rules that keep a hostile or corrupt peer from hurting us:
//  - immutable fields (sizes) are copied to process-local memory at attach and
//    never re-read; every offset read from shared memory is bounds-checked;
//  - the layout is versioned: a peer with another layout fails loudly at attach.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <sys/types.h>

#include "common/shm_file.h"

namespace vipc::msgq {

inline constexpr uint64_t kMagic = 0x474e4952'5147534dull;  // the bytes "MSGQRING" read as little-endian
inline constexpr uint32_t kLayoutVersion = 2;               // 2: handoff_pending (readers hand wake-ups on)
inline constexpr uint32_t kMaxReaders = 64;                 // one bit each in the 64-bit masks below
inline constexpr size_t kCacheLine = 64;
inline constexpr size_t kNameCapacity = common::kBasenameCapacity;  // file basename incl. NUL
inline constexpr size_t kWakeNameCapacity = 31;                     // abstract socket name incl. leading NUL
inline constexpr int64_t kWrapMarker = -1;                          // size prefix meaning "continue at offset 0"
inline constexpr size_t kPrefixBytes = 8;                           // every message: int64 size, then payload
inline constexpr size_t kSpareBytes = 8;                            // always free at the end so -1 fits

// Packed ring position: cycle in the high 32 bits, byte offset in the low 32.
inline constexpr uint64_t pack(uint32_t cycle, uint32_t offset) {
  return (static_cast<uint64_t>(cycle) << 32) | offset;
}
inline constexpr uint32_t cycle_of(uint64_t packed) { return static_cast<uint32_t>(packed >> 32); }
inline constexpr uint32_t offset_of(uint64_t packed) { return static_cast<uint32_t>(packed); }
inline constexpr size_t align8(size_t n) { return (n + 7) & ~size_t{7}; }

// One reader's slot. Two cache lines: the hot line is shared with the writer
// (it reads read_pointer on every message), the cold line is reader-private
// statistics that only msgq-top reads.
struct alignas(kCacheLine) ReaderSlot {
  // --- hot line ---
  // Writer: load(seq_cst) in W1 to decide invalidation. Reader: store(release)
  // after each message (R4); store(seq_cst) in reset X3 so a racing W1 either
  // sees it or the reader's recheck sees the writer's newer write_pointer.
  std::atomic<uint64_t> read_pointer;
  // The spec's validity flag. Writer: store(0, relaxed) in W1, followed by a
  // release fence before the payload is written. Reader: store(1) in reset X1;
  // load after an acquire fence in R2 and R5 (pairs with the writer's fence).
  std::atomic<uint32_t> valid;
  uint32_t reserved_hot;
  char pad_hot[kCacheLine - 16];

  // --- cold line (reader-written, relaxed; informational only) ---
  std::atomic<uint32_t> pid;       // owner process, for diagnostics
  std::atomic<uint32_t> conflate;  // 1 if the reader only wants the newest message
  std::atomic<uint64_t> messages;  // messages delivered
  std::atomic<uint64_t> bytes;     // payload bytes delivered
  std::atomic<uint64_t> resets;    // times the reader was lapped and reset (drops)
  // Abstract AF_UNIX datagram address the writer pokes when this reader armed a
  // file-descriptor wait (see armed_mask). Reader-written before arming;
  // the writer copies it with a length bound, so garbage only costs a failed sendto.
  char wake_name[kWakeNameCapacity];
  uint8_t wake_name_len;
};
static_assert(sizeof(ReaderSlot) == 2 * kCacheLine, "a reader slot is exactly two cache lines");
static_assert(offsetof(ReaderSlot, pid) == kCacheLine, "statistics live on the second line");

struct alignas(kCacheLine) SegmentHeader {
  // --- line 0: identity. Written once by the creator while it holds the
  // segment's init lock (an OFD lock), read by attachers under the same lock;
  // the kernel lock orders them. Copied locally at attach, never trusted later.
  uint64_t magic;
  uint32_t layout_version;
  uint32_t header_size;  // bytes before the data ring (page multiple)
  uint64_t data_size;    // bytes in the data ring (multiple of 64)
  uint32_t max_readers;  // kMaxReaders
  uint32_t creator_uid;
  uint64_t created_ns;  // CLOCK_REALTIME at creation, for msgq-top
  char pad0[kCacheLine - 40];

  // --- line 1: writer-owned.
  // The spec's write pointer + writer cycle, packed. Writer: store(seq_cst) in
  // W3 (release for the payload; seq_cst so the following sleeping_mask load
  // and the next W1 cannot move before it). Readers: load(acquire) to test for
  // data, load(seq_cst) when about to sleep and in the reset recheck (X3).
  std::atomic<uint64_t> write_pointer;
  // Publisher ownership: (token << 1) | busy. The owning publisher CASes busy
  // on for the span of one send or loan, and stores it off (release) after W3.
  // A new publisher CASes in its own token ("last publisher wins"); the old
  // one's next CAS fails and it raises MultiplePublishersError.
  std::atomic<uint64_t> publisher;
  std::atomic<uint32_t> publisher_pid;  // diagnostics only
  // kStateReady, or kStateSuperseded once a publisher replaced this segment by
  // a new one of another size: readers reattach by name (store release,
  // load acquire, followed by a futex wake).
  std::atomic<uint32_t> state;
  std::atomic<uint64_t> messages_written;  // relaxed, writer-only
  std::atomic<uint64_t> bytes_written;     // relaxed, writer-only
  // Packed position (cycle, offset) of the newest committed message, so a
  // lapped conflating reader can reset onto it instead of losing it. Writer:
  // store(relaxed) in W3 before the write_pointer store, which releases it.
  // Reader: load(relaxed) after its seq_cst load of write_pointer, so it is at
  // least that new; then the usual X3 recheck of the writer's cycle.
  std::atomic<uint64_t> last_message;
  char pad1[kCacheLine - 48];

  // --- line 2: wake-ups (written by sleeping readers, read by the writer).
  // Futex word. Writer: fetch_add(1) then FUTEX_WAKE, only when sleeping_mask
  // is non-zero. Readers: load before checking for data, then FUTEX_WAIT on
  // the loaded value, so a wake between check and sleep is never lost.
  std::atomic<uint32_t> futex_seq;
  // 1 while a wake-up the writer handed to one reader is still to be passed on
  // (WakeMode::kHandoff, several sleepers). Writer: store(1, release) AFTER its
  // fetch_add of futex_seq and before FUTEX_WAKE(1). A reader that comes out of
  // FUTEX_WAIT with data: exchange(0, acq_rel); if it took the 1, FUTEX_WAKE(all).
  // Whoever takes it wakes, after the bump, every reader that slept on the old
  // futex_seq (later sleepers see the bump or the data). Model: model/wake.pml.
  std::atomic<uint32_t> handoff_pending;
  // Bit i set while reader slot i sleeps on futex_seq. Readers: fetch_or(seq_cst)
  // before their final data check; fetch_and after waking. Writer: load(seq_cst)
  // after W3; zero means no syscall at all. A bitmask rather than a counter, so
  // clearing a dead reader's bit is idempotent.
  std::atomic<uint64_t> sleeping_mask;
  // Bit i set while reader slot i waits on its file descriptor (Poller, select,
  // asyncio). Writer: if non-zero after W3, exchange(0) and poke each reader's
  // wake_name once; readers re-arm before every wait.
  std::atomic<uint64_t> armed_mask;
  char pad2[kCacheLine - 24];

  // --- line 3: reader registry.
  // Bit i set while slot i belongs to a live (or not yet reclaimed) reader; its
  // popcount is the spec's "number of active readers". Reader: fetch_or(seq_cst)
  // when claiming (before its reset), fetch_and when leaving. Writer: load(seq_cst)
  // at the start of W1. Slot ownership itself is an OFD write lock on byte
  // kLockSlotBase + i of the segment file, so a dead reader's slot is reclaimed
  // by whoever next takes that lock.
  std::atomic<uint64_t> reader_mask;
  char pad3[kCacheLine - 8];

  // --- lines 4..7: names, written once at creation.
  char name[kNameCapacity];  // file basename, e.g. "msgq@prefix@topic"

  ReaderSlot readers[kMaxReaders];
};

inline constexpr uint32_t kStateReady = 1;
inline constexpr uint32_t kStateSuperseded = 2;

// Byte-range OFD locks on the segment file (never touching data; locks may
// lie beyond EOF). Released by the kernel when the holder dies.
inline constexpr off_t kLockInit = common::kLockInit;          // exclusive: attach/detach (common/shm_file.h)
inline constexpr off_t kLockPresence = common::kLockPresence;  // shared while attached; detach probes exclusive
inline constexpr off_t kLockSlotBase = 16;                     // exclusive: reader slot i owner
// exclusive: publisher with token t is alive, byte kLockPublisherBase + t % span
inline constexpr off_t kLockPublisherBase = 4096;
inline constexpr off_t kPublisherLockSpan = off_t{1} << 30;
inline constexpr off_t publisher_liveness_byte(uint64_t token) {
  return kLockPublisherBase + static_cast<off_t>(token % kPublisherLockSpan);
}

inline constexpr size_t kHeaderSize = 16384;  // page multiple, room to grow without moving data
static_assert(sizeof(SegmentHeader) <= kHeaderSize, "header must fit before the data ring");
static_assert(offsetof(SegmentHeader, write_pointer) == 1 * kCacheLine, "writer line");
static_assert(offsetof(SegmentHeader, futex_seq) == 2 * kCacheLine, "wake line");
// tests/msgq/test_wake_modes.py (WAKE_LINE) scribbles on these two words by offset.
static_assert(offsetof(SegmentHeader, handoff_pending) == 2 * kCacheLine + 4, "handoff flag beside futex_seq");
static_assert(offsetof(SegmentHeader, reader_mask) == 3 * kCacheLine, "registry line");
static_assert(offsetof(SegmentHeader, readers) % kCacheLine == 0, "slots on their own lines");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared atomics must be lock-free");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex word must be a plain 32-bit atomic");
static_assert(sizeof(std::atomic<uint32_t>) == 4, "futex word must be exactly 32 bits");

inline constexpr size_t kMinDataSize = 4096;
inline constexpr size_t kMaxDataSize = size_t{1} << 31;  // offsets must fit in 32 bits
inline constexpr size_t kDefaultDataSize = size_t{1} << 20;

// Largest payload a publisher may send in a ring of data_size bytes. The ring
// itself could hold data_size - 16, but a message that does not fit after the
// write position wraps to offset 0, and if it reaches the position of a reader
// that has read everything, it overwrites the -1 marker that reader still has
// to follow: the reader is lapped and loses a message it was keeping up with.
// Capping the message (prefix included) at half the usable ring means a wrapped
// message always ends before such a reader, so a subscriber that keeps up
// receives every message. (The reference caps at a third, with an assert.)
inline constexpr size_t max_message_size(size_t data_size) {
  return ((data_size - kSpareBytes) / 2 - kPrefixBytes) & ~size_t{7};
}
static_assert(max_message_size(4096) == 2032, "half of the usable ring, prefix included");

}  // namespace vipc::msgq
