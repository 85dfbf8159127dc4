// Self-checking stress messages. Message `seq` has a size and content that are
// pure functions of (seed, seq): its byte stream is the 64-bit words
// [seq, check(seq, size), mix(seq, 2), mix(seq, 3), ...], cut to the size.
// A reader that knows the seed can tell any torn, stale or misplaced byte.
// Messages of at least 8 bytes name their sequence number; shorter ones are
// only checkable when the reader knows which one comes next.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "check.h"

namespace stress {

inline uint64_t mix(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class Payloads {
 public:
  Payloads(uint64_t seed, size_t max_size) : seed_(seed), max_(max_size) {}

  size_t max_size() const { return max_; }

  // A quarter tiny (0..23 bytes, below and around the 16-byte record), half up
  // to an eighth of the maximum, a quarter up to the maximum, which itself
  // comes up once in 64: lots of wrap-arounds at every kind of offset.
  size_t size_of(uint64_t seq) const {
    const uint64_t r = mix(seed_ ^ mix(seq));
    switch (r & 3) {
      case 0:
        return (r >> 8) % 24;
      case 1:
      case 2:
        return (r >> 8) % (max_ / 8 + 1);
      default:
        return ((r >> 2) & 63) == 0 ? max_ : (r >> 8) % (max_ + 1);
    }
  }

  void fill(uint64_t seq, char* out, size_t n) const {
    for (size_t at = 0, k = 0; at < n; at += 8, k++) {
      const uint64_t w = word(seq, n, k);
      std::memcpy(out + at, &w, std::min<size_t>(8, n - at));
    }
  }

  bool intact(uint64_t seq, const char* p, size_t n) const {
    if (n != size_of(seq)) return false;
    for (size_t at = 0, k = 0; at < n; at += 8, k++) {
      const uint64_t w = word(seq, n, k);
      if (std::memcmp(p + at, &w, std::min<size_t>(8, n - at)) != 0) return false;
    }
    return true;
  }

 private:
  uint64_t word(uint64_t seq, size_t n, size_t k) const {
    if (k == 0) return seq;
    if (k == 1) return mix(seed_ ^ seq ^ (uint64_t{n} << 32));
    return mix(seed_ + seq * 0x100000001b3ull + k);
  }

  uint64_t seed_;
  size_t max_;
};

// One reader's view of the stream. Invariants checked per message:
//  - intact: size and every byte are those of its sequence number;
//  - strictly increasing sequence numbers;
//  - no silent drop: a normal reader that was not reset since its last
//    message gets exactly the next one (a conflating reader may skip).
// A message under 8 bytes carries no number: after a reset (or for a
// conflating reader) it only moves the lower bound.
class StreamChecker {
 public:
  StreamChecker(const Payloads& payloads, bool conflate, std::string name)
      : p_(payloads), conflate_(conflate), name_(std::move(name)) {}

  void on_message(const char* data, size_t n, uint64_t resets_now) {
    const bool reset_since = resets_now != resets_seen_;
    resets_seen_ = resets_now;
    const bool next_is_known = have_last_ && exact_ && !reset_since && !conflate_;
    delivered_++;
    bytes_ += n;
    if (n >= 8) {
      uint64_t seq;
      std::memcpy(&seq, data, 8);
      if (!p_.intact(seq, data, n)) fail("torn or foreign message", seq, n);
      if (have_last_ && seq <= last_) fail("sequence number went backwards", seq, n);
      if (next_is_known && seq != last_ + 1) fail("message dropped without a reset", seq, n);
      if (have_last_ && seq == last_ + 1) in_order_++;
      last_ = seq;
      have_last_ = true;
      exact_ = true;
      return;
    }
    tiny_++;
    if (next_is_known) {
      if (!p_.intact(last_ + 1, data, n)) fail("torn or misplaced short message", last_ + 1, n);
      last_++;
      in_order_++;
    } else {
      exact_ = false;  // its number is above last_, but unknown
    }
  }

  uint64_t delivered() const { return delivered_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t in_order() const { return in_order_; }
  uint64_t tiny() const { return tiny_; }

 private:
  [[noreturn]] void fail(const char* what, uint64_t seq, size_t n) const {
    check::failed(__FILE__, __LINE__,
                  name_ + ": " + what + ": seq " + std::to_string(seq) + ", " + std::to_string(n) +
                      " bytes, last seq " + (have_last_ ? std::to_string(last_) : std::string("none")));
  }

  const Payloads& p_;
  bool conflate_;
  std::string name_;
  bool have_last_ = false;
  bool exact_ = false;
  uint64_t last_ = 0;
  uint64_t resets_seen_ = 0;
  uint64_t delivered_ = 0, bytes_ = 0, in_order_ = 0, tiny_ = 0;
};

}  // namespace stress
