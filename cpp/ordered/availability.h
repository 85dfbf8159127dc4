// Which message ids of an ordered topic are available (cpp/ordered/README.md): the id the
// next reservation gets ("last", 48 bits) and a 16-bit bitmap of the newest
// ids, packed in ONE 64-bit atomic so both change together. Bit k of the
// bitmap is id last-1-k; ids older than the window (< last - 16) are always
// available (the window only moves past an id once it is available), and so
// are ids below 0 (their bits start set).
//
// Pure functions on the packed word plus the three CAS loops; steps O1..O3
// are numbered in cpp/ordered/README.md. No syscalls here: the topic adds the
// wake-ups, so this can be driven by the threaded CAS stress under TSan.
#pragma once

#include <atomic>
#include <bit>
#include <cstdint>

namespace vipc::ordered {

inline constexpr int kWindow = 16;
inline constexpr uint64_t kBitmapMask = (uint64_t{1} << kWindow) - 1;
inline constexpr uint64_t kMaxId = (uint64_t{1} << 48) - 1;  // ~9 years at 1 M messages/s

struct Availability {
  uint64_t last;    // ids < last have been reserved
  uint16_t bitmap;  // bit k: id last-1-k is available

  static constexpr Availability unpack(uint64_t w) { return {w >> kWindow, static_cast<uint16_t>(w & kBitmapMask)}; }
  constexpr uint64_t pack() const { return (last << kWindow) | bitmap; }
  // The initial word: nothing reserved; the window's ids (all < 0) count as available.
  static constexpr uint64_t initial(uint64_t first_id) { return (first_id << kWindow) | kBitmapMask; }

  // Half-open [begin, end): the ids that have been reserved, as far back as a
  // ring of `capacity` slots still holds them.
  constexpr uint64_t end() const { return last; }
  constexpr uint64_t begin(uint64_t capacity) const { return last > capacity ? last - capacity : 0; }

  constexpr bool is_available(uint64_t id) const {
    if (id >= last) return false;
    const uint64_t age = last - 1 - id;
    return age >= kWindow || ((bitmap >> age) & 1) != 0;
  }
  // The first id that is not available: a sequential reader may deliver
  // everything below it. (Leading ones of the bitmap = available oldest ids.)
  constexpr uint64_t available_end() const {
    const int ones = std::countl_one(bitmap);
    return last + ones - kWindow;  // ids below 0 have their bits set, so this is >= 0
  }
  // True with *id = the newest available id, if any id >= 0 is available.
  constexpr bool newest_available(uint64_t* id) const {
    if (bitmap != 0) {
      const uint64_t age = static_cast<uint64_t>(std::countr_zero(bitmap));
      if (age < last) {
        *id = last - 1 - age;
        return true;
      }
      return false;  // only the bits of ids below 0 are set
    }
    if (last <= kWindow) return false;
    *id = last - 1 - kWindow;  // out of the window, hence available
    return true;
  }
  // Reserving `last` would push id last-16 out of the window while it is still
  // being filled: at most 16 ids are in flight.
  constexpr bool window_full() const { return ((bitmap >> (kWindow - 1)) & 1) == 0; }
};

enum class Reserve { kOk, kWindowFull, kTooOld, kTooLarge };

// O1 reserve-next: the id `last`, shifting the window by one.
// SYNC: acq_rel CAS. Acquire: the make-available (release) of every id whose
// slot we may reuse happens-before our writes to the slot. Release: nothing
// to publish yet, but the chain of RMWs must stay one release sequence.
inline Reserve try_reserve_next(std::atomic<uint64_t>& word, uint64_t* id) {
  uint64_t cur = word.load(std::memory_order_acquire);
  for (;;) {
    const Availability a = Availability::unpack(cur);
    if (a.window_full()) return Reserve::kWindowFull;
    if (a.last >= kMaxId) return Reserve::kTooLarge;
    const Availability next{a.last + 1, static_cast<uint16_t>(a.bitmap << 1)};
    if (word.compare_exchange_weak(cur, next.pack(), std::memory_order_acq_rel, std::memory_order_acquire)) {
      *id = a.last;
      return Reserve::kOk;
    }
  }
}

// O2 reserve-id: exactly `id` (>= last); ids skipped over are marked
// available at once (they never come: readers see them as gaps).
inline Reserve try_reserve_id(std::atomic<uint64_t>& word, uint64_t id) {
  uint64_t cur = word.load(std::memory_order_acquire);
  for (;;) {
    const Availability a = Availability::unpack(cur);
    if (id < a.last) return Reserve::kTooOld;
    if (id >= kMaxId) return Reserve::kTooLarge;
    const uint64_t shift = id + 1 - a.last;
    // Every id pushed out of the window must be available.
    const uint64_t leaving = shift >= kWindow ? kBitmapMask : (kBitmapMask << (kWindow - shift)) & kBitmapMask;
    if ((a.bitmap & leaving) != leaving) return Reserve::kWindowFull;
    const uint64_t kept = shift >= kWindow ? 0 : (uint64_t{a.bitmap} << shift) & kBitmapMask;
    const uint64_t skipped =
        shift >= kWindow ? kBitmapMask & ~uint64_t{1} : ((uint64_t{1} << shift) - 1) & ~uint64_t{1};
    const Availability next{id + 1, static_cast<uint16_t>(kept | skipped)};
    if (word.compare_exchange_weak(cur, next.pack(), std::memory_order_acq_rel, std::memory_order_acquire)) {
      return Reserve::kOk;
    }
  }
}

enum class MakeAvailable { kOk, kNotReserved, kAlreadyAvailable };

// O3 make-available: set the id's bit.
// SYNC: seq_cst CAS. Release: the slot's payload and stamp (written before)
// are visible to a reader whose acquire load sees the bit. seq_cst: the
// following load of the sleeper count cannot move before it (Dekker pair
// with a reader's sleeper increment and re-check).
inline MakeAvailable try_make_available(std::atomic<uint64_t>& word, uint64_t id) {
  uint64_t cur = word.load(std::memory_order_relaxed);
  for (;;) {
    const Availability a = Availability::unpack(cur);
    if (id >= a.last) return MakeAvailable::kNotReserved;
    const uint64_t age = a.last - 1 - id;
    if (age >= kWindow || ((a.bitmap >> age) & 1) != 0) return MakeAvailable::kAlreadyAvailable;
    const Availability next{a.last, static_cast<uint16_t>(a.bitmap | (1u << age))};
    if (word.compare_exchange_weak(cur, next.pack(), std::memory_order_seq_cst, std::memory_order_relaxed)) {
      return MakeAvailable::kOk;
    }
  }
}

}  // namespace vipc::ordered
