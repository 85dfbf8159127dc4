// The MSGQ ring protocol over one mapped segment: RingWriter (W1..W3) and
// RingReader (R1..R5, reset X1..X3), exactly the steps of cpp/msgq/README.md.
// Pure memory operations: no syscalls, no files, no wake-ups (the socket layer
// adds those), so the protocol can be driven step by step in tests and run
// under ThreadSanitizer with threads sharing one mapping.
#pragma once

#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include "common/errors.h"
#include "msgq/layout.h"

namespace vipc::msgq {

// Payload bytes race with a lapping writer by design (a seqlock): the validity
// re-check (R5) discards anything torn. Under ThreadSanitizer we copy with
// relaxed atomic words so the intended race is not reported; otherwise memcpy.
#if defined(__SANITIZE_THREAD__)
inline void ring_copy(void* dst, const void* src, size_t n) {
  auto* d = static_cast<unsigned char*>(dst);
  auto* s = static_cast<const unsigned char*>(src);
  for (size_t i = 0; i < n; i++) {
    __atomic_store_n(d + i, __atomic_load_n(s + i, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
  }
}
#else
inline void ring_copy(void* dst, const void* src, size_t n) {
  if (n != 0) std::memcpy(dst, src, n);  // a 0-byte sink or send may pass nullptr: memcpy must not see it
}
#endif

inline int64_t load_prefix(const uint8_t* at) {
  return std::atomic_ref<const int64_t>(*reinterpret_cast<const int64_t*>(at)).load(std::memory_order_relaxed);
}
inline void store_prefix(uint8_t* at, int64_t value) {
  std::atomic_ref<int64_t>(*reinterpret_cast<int64_t*>(at)).store(value, std::memory_order_relaxed);
}

struct RingView {
  SegmentHeader* header;
  uint8_t* data;
  uint32_t data_size;  // local copy taken at attach; never re-read from shared memory
};

class RingWriter {
 public:
  explicit RingWriter(RingView view) : v_(view) { sync_position(); }

  // Re-read the shared write pointer (a new publisher continues where the old
  // one stopped). A pointer that cannot be ours is a corrupt segment.
  void sync_position() {
    const uint64_t wp = v_.header->write_pointer.load(std::memory_order_acquire);
    if (offset_of(wp) > v_.data_size - kSpareBytes || offset_of(wp) % 8 != 0) {
      common::fail(common::ErrorKind::kSegment, "corrupt segment: write pointer outside the ring");
    }
    wp_ = wp;
  }

  size_t max_message() const { return max_message_size(v_.data_size); }

  // W1 for a message of n payload bytes, wrapping first if it does not fit
  // before the spare bytes. Returns where the payload goes; commit() publishes.
  uint8_t* reserve(size_t n) {
    const size_t total = kPrefixBytes + align8(n);
    uint32_t cycle = cycle_of(wp_);
    uint32_t offset = offset_of(wp_);
    if (offset + total > v_.data_size - kSpareBytes) {
      // Wrap: W1 over the remainder, the -1 marker, bump the cycle, publish.
      invalidate_readers(cycle, offset, v_.data_size - offset);
      store_prefix(v_.data + offset, kWrapMarker);
      cycle += 1;
      offset = 0;
      wp_ = pack(cycle, 0);
      v_.header->write_pointer.store(wp_, std::memory_order_seq_cst);
    }
    invalidate_readers(cycle, offset, total);  // W1
    return v_.data + offset + kPrefixBytes;    // W2 is the caller's copy
  }

  // W3: write the size prefix of the reserved message (n <= reserved size)
  // and advance the write pointer past it.
  void commit(size_t n) {
    const uint32_t offset = offset_of(wp_);
    store_prefix(v_.data + offset, static_cast<int64_t>(n));
    v_.header->last_message.store(wp_, std::memory_order_relaxed);  // released by W3 below
    wp_ = pack(cycle_of(wp_), static_cast<uint32_t>(offset + kPrefixBytes + align8(n)));
    // SYNC: release for the payload and prefix (pairs with the reader's acquire
    // load of write_pointer); seq_cst so the caller's sleeping_mask load and the
    // next W1's read_pointer loads stay after it (pairs with reader sleep / X3).
    v_.header->write_pointer.store(wp_, std::memory_order_seq_cst);
    auto& h = *v_.header;
    h.messages_written.store(h.messages_written.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    h.bytes_written.store(h.bytes_written.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }

  void write(const void* src, size_t n) {
    ring_copy(reserve(n), src, n);
    commit(n);
  }

  uint64_t position() const { return wp_; }

 private:
  // W1: clear the validity flag of every reader whose unread data lies in
  // [offset, offset + len) of this cycle. A reader is safe only if it is in the
  // writer's cycle at or behind the writer, or exactly one cycle behind and at
  // or past the end of the area; anything else (including a lapped or garbage
  // pointer) is invalidated.
  void invalidate_readers(uint32_t cycle, uint32_t offset, size_t len) {
    const uint64_t end = uint64_t{offset} + len;
    uint64_t mask = v_.header->reader_mask.load(std::memory_order_seq_cst);
    while (mask != 0) {
      const int i = std::countr_zero(mask);
      mask &= mask - 1;
      ReaderSlot& slot = v_.header->readers[i];
      // SYNC: pairs with the reader's read_pointer stores (R4 release, X3 seq_cst).
      const uint64_t rp = slot.read_pointer.load(std::memory_order_seq_cst);
      const uint32_t rc = cycle_of(rp);
      const uint32_t ro = offset_of(rp);
      const bool same_cycle_behind = rc == cycle && ro <= offset;
      const bool one_cycle_behind_clear = rc == cycle - 1 && ro >= end;
      if (!same_cycle_behind && !one_cycle_behind_clear) {
        slot.valid.store(0, std::memory_order_relaxed);
      }
    }
    // SYNC: the cleared flags become visible before any payload byte written
    // after this fence (pairs with the reader's acquire fence before R2 / R5).
    std::atomic_thread_fence(std::memory_order_release);
  }

  RingView v_;
  uint64_t wp_ = 0;
};

enum class ReadStatus { kMessage, kEmpty };

// A Sink receives one message: prepare(n) returns n writable bytes (nullptr
// is fine for n = 0; it may throw, e.g. out of memory); discard() drops what
// prepare() gave when the copy turned out torn. The ring never allocates.
class RingReader {
 public:
  RingReader(RingView view, uint32_t slot) : v_(view), slot_(&view.header->readers[slot]) {}

  // X1..X3, then our recheck: if the writer changed cycle while we were
  // publishing our position, it may have overwritten that position without
  // seeing it, so reset again. Gives up (staying invalid, so the next read
  // retries) only if the writer laps the whole ring on every attempt.
  void reset() {
    for (int attempt = 0; attempt < 1000; attempt++) {
      slot_->valid.store(1, std::memory_order_seq_cst);  // X1
      const uint64_t wp = v_.header->write_pointer.load(std::memory_order_seq_cst);
      publish_position(wp);  // X2 + X3
      if (cycle_of(v_.header->write_pointer.load(std::memory_order_seq_cst)) == cycle_of(wp)) return;
    }
    slot_->valid.store(0, std::memory_order_relaxed);
  }

  // Conflate mode: like reset(), but onto the newest committed message, so a
  // reader that was lapped still gets the latest one. Falls back to reset()
  // if that message lies in an older cycle than the writer's (it may be gone).
  void reset_to_newest() {
    const uint64_t consumed = rp_;  // everything before it was delivered or skipped
    for (int attempt = 0; attempt < 1000; attempt++) {
      slot_->valid.store(1, std::memory_order_seq_cst);
      const uint64_t wp = v_.header->write_pointer.load(std::memory_order_seq_cst);
      // SYNC: at least as new as wp (the writer stores it before wp, release).
      const uint64_t last = v_.header->last_message.load(std::memory_order_relaxed);
      if (cycle_of(last) < cycle_of(wp) || !in_ring(last)) break;  // nothing committed in this cycle yet
      if (cycle_of(last) != cycle_of(wp) || offset_of(last) >= offset_of(wp)) continue;  // newer than wp: again
      // W1 may clear our flag from a read pointer it loaded before our last R4
      // was visible (a spurious lap): the newest message may be one we already
      // delivered. Never hand it out twice.
      if (precedes(last, consumed)) break;
      publish_position(last);
      if (cycle_of(v_.header->write_pointer.load(std::memory_order_seq_cst)) == cycle_of(last)) return;
    }
    reset();
  }

  // Start at the very beginning of the ring if the writer has not wrapped yet
  // (used when following a publisher into a fresh segment, so nothing it sent
  // before we registered is lost); otherwise an ordinary reset.
  void reset_to_start() {
    slot_->valid.store(1, std::memory_order_seq_cst);
    publish_position(pack(0, 0));
    if (cycle_of(v_.header->write_pointer.load(std::memory_order_seq_cst)) != 0) reset();
  }

  // Data to read, or a pending reset (which a read will perform).
  bool has_data(std::memory_order order = std::memory_order_acquire) const {
    return v_.header->write_pointer.load(order) != rp_ || slot_->valid.load(std::memory_order_relaxed) == 0;
  }

  uint64_t position() const { return rp_; }
  uint64_t resets() const { return resets_; }
  uint64_t corrupt() const { return corrupt_; }

  template <class Sink>
  ReadStatus read(Sink& sink, bool conflate) {
    for (;;) {
      if (slot_->valid.load(std::memory_order_acquire) == 0) {
        lapped(conflate);
        continue;
      }
      const uint64_t wp = v_.header->write_pointer.load(std::memory_order_acquire);
      if (wp == rp_) return ReadStatus::kEmpty;
      if (!in_ring(wp)) common::fail(common::ErrorKind::kSegment, "corrupt segment: write pointer outside the ring");
      const uint32_t rc = cycle_of(rp_);
      const uint32_t ro = offset_of(rp_);
      if (!in_ring(rp_)) {  // only a corrupt peer can put us here
        corrupted();
        continue;
      }
      // R0b: where we stand against the writer. Ahead of it is impossible.
      // More than a ring behind means it lapped us: an honest writer cleared
      // our flag before publishing wp (W1), so R2 would reset us anyway; a
      // corrupt one did not, and following its -1 markers or (in conflate
      // mode) skipping its messages would take up to 2^32 cycles. Found by
      // cpp/fuzz/fuzz_ring.cc.
      const auto behind = static_cast<int32_t>(cycle_of(wp) - rc);
      if (behind < 0 || (behind == 0 && offset_of(wp) < ro)) {
        corrupted();
        continue;
      }
      if (behind > 1 || (behind == 1 && offset_of(wp) > ro)) {
        lapped(conflate);
        continue;
      }
      const int64_t size = load_prefix(v_.data + ro);  // R1
      // SYNC: the size load happens before the validity load (the spec's "do not
      // reorder 1 and 2"); pairs with the writer's release fence after W1.
      std::atomic_thread_fence(std::memory_order_acquire);
      if (slot_->valid.load(std::memory_order_relaxed) == 0) continue;  // R2
      if (size == kWrapMarker) {
        advance(pack(rc + 1, 0));
        continue;
      }
      if (size < 0 || ro + kPrefixBytes + align8(static_cast<uint64_t>(size)) > v_.data_size - kSpareBytes) {
        corrupted();
        continue;
      }
      const uint64_t next = pack(rc, static_cast<uint32_t>(ro + kPrefixBytes + align8(size)));
      if (conflate && !is_newest(next, wp)) {
        advance(next);  // skip without copying; the next R2 re-checks validity
        continue;
      }
      char* dst = sink.prepare(static_cast<size_t>(size));
      ring_copy(dst, v_.data + ro + kPrefixBytes, static_cast<size_t>(size));  // R3
      advance(next);                                                           // R4
      std::atomic_thread_fence(std::memory_order_acquire);                     // SYNC: copy before re-check
      if (slot_->valid.load(std::memory_order_relaxed) == 0) {                 // R5
        sink.discard();
        rp_ = pack(rc, ro);  // not delivered: the reset that follows may come back to it
        continue;
      }
      auto& s = *slot_;
      s.messages.store(s.messages.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      s.bytes.store(s.bytes.load(std::memory_order_relaxed) + size, std::memory_order_relaxed);
      return ReadStatus::kMessage;
    }
  }

 private:
  bool in_ring(uint64_t pos) const { return offset_of(pos) <= v_.data_size - kSpareBytes && offset_of(pos) % 8 == 0; }

  // Ring order of two positions, tolerant of the 32-bit cycle counter wrapping.
  static bool precedes(uint64_t a, uint64_t b) {
    const auto cycles = static_cast<int32_t>(cycle_of(a) - cycle_of(b));
    return cycles < 0 || (cycles == 0 && offset_of(a) < offset_of(b));
  }

  void publish_position(uint64_t pos) {
    rp_ = pos;
    slot_->read_pointer.store(pos, std::memory_order_seq_cst);
  }

  void advance(uint64_t pos) {
    rp_ = pos;
    slot_->read_pointer.store(pos, std::memory_order_release);  // R4
  }

  void lapped(bool conflate) {
    resets_++;
    slot_->resets.store(resets_, std::memory_order_relaxed);
    if (conflate) {
      reset_to_newest();
    } else {
      reset();
    }
  }

  void corrupted() {
    corrupt_++;
    lapped(false);
  }

  // Conflate: is the message ending at `next` the newest one? Either the writer
  // is exactly there, or it wrapped right after it (a -1 marker at `next`).
  bool is_newest(uint64_t next, uint64_t wp) const {
    if (next == wp) return true;
    if (wp != pack(cycle_of(next) + 1, 0)) return false;
    const int64_t marker = load_prefix(v_.data + offset_of(next));
    std::atomic_thread_fence(std::memory_order_acquire);
    return marker == kWrapMarker && slot_->valid.load(std::memory_order_relaxed) != 0;
  }

  RingView v_;
  ReaderSlot* slot_;
  uint64_t rp_ = 0;
  uint64_t resets_ = 0;
  uint64_t corrupt_ = 0;
};

}  // namespace vipc::msgq
