// Deterministic, single-threaded tests of the MSGQ ring (writer W1..W3, reader
// R1..R5, reset X1..X3): every wrap-around boundary, lapped and corrupt
// readers, interleavings forced from inside the reader's copy, conflate, and
// 64 independent reader slots. Expected positions are derived from the layout
// constants, never pasted. The second half drives Publisher / Subscriber on
// real segment files in a private directory.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "check_errors.h"
#include "msgq/publisher.h"
#include "msgq/subscriber.h"
#include "test_support.h"

using testing::HeapRing;
using testing::VecSink;
using vipc::msgq::align8;
using vipc::msgq::cycle_of;
using vipc::msgq::kPrefixBytes;
using vipc::msgq::kSpareBytes;
using vipc::msgq::offset_of;
using vipc::msgq::pack;
using vipc::msgq::ReadStatus;
using vipc::msgq::RingReader;
using vipc::msgq::RingWriter;

namespace {

constexpr uint32_t kRing = 4096;
// The largest payload the ring itself can hold (footprint data_size - 8). The
// publisher caps messages lower (max_message_size); RingWriter does not, so
// these tests also cover what the cap protects against.
constexpr size_t kRingFit = kRing - kSpareBytes - kPrefixBytes;

// Bytes that differ between messages, so a stale or torn copy cannot pass.
std::string payload(size_t n, uint32_t tag) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; i++) s[i] = static_cast<char>((tag * 131 + i * 7 + (i >> 8)) & 0xff);
  return s;
}

void write_msg(RingWriter& w, size_t n, uint32_t tag) {
  const std::string p = payload(n, tag);
  w.write(p.data(), p.size());
}

uint32_t footprint(size_t n) { return static_cast<uint32_t>(kPrefixBytes + align8(n)); }

void expect_msg(RingReader& r, size_t n, uint32_t tag, bool conflate = false) {
  VecSink sink;
  CHECK(r.read(sink, conflate) == ReadStatus::kMessage);
  CHECK_EQ(sink.size, n);
  CHECK(sink.str() == payload(n, tag));
  CHECK_EQ(sink.discarded, 0);
}

void expect_empty(RingReader& r, bool conflate = false) {
  VecSink sink;
  CHECK(r.read(sink, conflate) == ReadStatus::kEmpty);
  CHECK_EQ(sink.prepared, 0);
}

// A sink whose first prepare() runs `during_copy`: the writer acts between the
// reader's validity check (R2) and its copy (R3), as a concurrent writer may.
template <class F>
struct InterleavingSink : VecSink {
  F during_copy;
  explicit InterleavingSink(F f) : during_copy(f) {}
  char* prepare(size_t n) {
    if (prepared == 0) during_copy();
    return VecSink::prepare(n);
  }
};

}  // namespace

TEST(fresh_reader_receives_messages_in_order_then_nothing) {
  HeapRing ring(kRing);
  RingWriter w(ring.view());
  RingReader r = ring.add_reader(0);
  expect_empty(r);
  for (uint32_t i = 0; i < 5; i++) write_msg(w, 10 * i + 1, i);
  for (uint32_t i = 0; i < 5; i++) expect_msg(r, 10 * i + 1, i);
  expect_empty(r);
  CHECK_EQ(r.position(), w.position());
  CHECK_EQ(r.resets(), 0u);
  CHECK_EQ(ring.slot(0).messages.load(std::memory_order_relaxed), 5u);
}

// A message whose footprint ends exactly at data_size - 8 fits; one byte more
// wraps (padding rounds it up by 8); one to seven bytes less pads to the same
// end. Each case on a fresh ring with the writer at a fixed offset, far enough
// along that a wrapped message ends before the marker (see the parked test).
TEST(wrap_happens_exactly_when_a_message_would_touch_the_spare_bytes) {
  constexpr uint32_t kStart = 3072;
  const size_t filler = kStart - kPrefixBytes;
  const size_t boundary = kRing - kSpareBytes - kStart - kPrefixBytes;  // footprint ends at data_size - 8
  for (const int delta : {-8, -7, -1, 0, 1, 7, 8}) {
    HeapRing ring(kRing);
    RingWriter w(ring.view());
    RingReader r = ring.add_reader(0);
    write_msg(w, filler, 1);
    CHECK_EQ(w.position(), pack(0, kStart));
    expect_msg(r, filler, 1);
    const size_t n = boundary + delta;
    write_msg(w, n, 2);
    const bool wraps = kStart + footprint(n) > kRing - kSpareBytes;
    CHECK_EQ(wraps, delta > 0);
    if (wraps) {
      CHECK(footprint(n) <= kStart);
      CHECK_EQ(ring.prefix_at(kStart), vipc::msgq::kWrapMarker);
      CHECK_EQ(w.position(), pack(1, footprint(n)));
    } else {
      CHECK_EQ(w.position(), pack(0, kStart + footprint(n)));
    }
    expect_msg(r, n, 2);
    expect_empty(r);
    CHECK_EQ(r.position(), w.position());
    CHECK_EQ(r.resets(), 0u);
  }
}

TEST(writer_ending_at_the_spare_bytes_puts_the_marker_in_them) {
  HeapRing ring(kRing);
  RingWriter w(ring.view());
  RingReader r = ring.add_reader(0);
  const size_t exact = kRingFit;
  write_msg(w, exact, 1);
  CHECK_EQ(w.position(), pack(0, kRing - kSpareBytes));
  expect_msg(r, exact, 1);
  write_msg(w, 0, 2);  // even an empty message needs its prefix: wrap
  CHECK_EQ(ring.prefix_at(kRing - kSpareBytes), vipc::msgq::kWrapMarker);
  CHECK_EQ(w.position(), pack(1, kPrefixBytes));
  expect_msg(r, 0, 2);
  CHECK_EQ(r.position(), pack(1, kPrefixBytes));
}

// Exact-fit (largest) messages back to back: each wraps, and a reader that
// keeps up loses none; one that falls a message behind is lapped.
TEST(exact_fit_messages_reach_a_caught_up_reader_and_lap_a_slow_one) {
  HeapRing ring(kRing);
  RingWriter w(ring.view());
  RingReader fast = ring.add_reader(0);
  RingReader slow = ring.add_reader(1);
  const size_t exact = kRingFit;
  for (uint32_t i = 0; i < 4; i++) {
    write_msg(w, exact, i);
    CHECK_EQ(w.position(), pack(i, kRing - kSpareBytes));
    expect_msg(fast, exact, i);
  }
  CHECK_EQ(fast.resets(), 0u);
  expect_empty(slow);  // lapped: reset to the writer, nothing stale
  CHECK_EQ(slow.resets(), 1u);
  write_msg(w, exact, 9);
  expect_msg(slow, exact, 9);
  expect_msg(fast, exact, 9);
}

TEST(zero_byte_messages_fill_whole_cycles) {
  HeapRing ring(kRing);
  RingWriter w(ring.view());
  RingReader r = ring.add_reader(0);
  const uint32_t per_cycle = (kRing - kSpareBytes) / kPrefixBytes;
  for (uint32_t i = 0; i < 2 * per_cycle + 3; i++) {
    write_msg(w, 0, i);
    expect_msg(r, 0, i);
  }
  CHECK_EQ(w.position(), pack(2, 3 * kPrefixBytes));
  CHECK_EQ(r.position(), w.position());
  CHECK_EQ(r.resets(), 0u);
  CHECK_EQ(ring.prefix_at(per_cycle * kPrefixBytes), vipc::msgq::kWrapMarker);
}

// An empty std::vector's data() is nullptr: a natural Sink for 0 bytes, and
// send(nullptr, 0) is a natural empty message. Neither may reach memcpy (UBSan).
TEST(zero_byte_messages_may_come_from_and_go_to_null_pointers) {
  struct NullForEmptySink {
    std::vector<char> buf;
    int got = 0;
    char* prepare(size_t n) {
      buf.resize(n);
      got++;
      return buf.data();
    }
    void discard() { buf.clear(); }
  } sink;
  HeapRing ring(kRing);
  RingWriter w(ring.view());
  RingReader r = ring.add_reader(0);
  w.write(nullptr, 0);
  CHECK(r.read(sink, false) == ReadStatus::kMessage);
  CHECK(sink.buf.empty() && sink.got == 1);
}

// The wrap marker is consumed lazily: a reader that caught up is parked on
// the spot where the marker goes. It is safe as long as the first message of
// the next cycle ends at or before the marker; a larger one (e.g. an exact-fit
// message after a small one) overwrites the marker, so that reader must be
// reset, a counted drop, rather than read the new payload as a size prefix.
// The seed protocol has no way to move a parked reader past the marker.
TEST(reader_parked_on_the_wrap_marker_is_reset_only_if_the_marker_is_overwritten) {
  const size_t exact = kRingFit;
  const struct {
    size_t first, next;
  } cases[] = {{3000, 1080}, {3000, 3000}, {2040, 2040}, {2040, 2041}, {3000, 2000}, {0, exact}, {8, exact}};
  for (const auto& c : cases) {
    HeapRing ring(kRing);
    RingWriter w(ring.view());
    RingReader r = ring.add_reader(0);
    RingReader behind = ring.add_reader(1);  // never read: lapped by the wrap in every case
    write_msg(w, c.first, 1);
    expect_msg(r, c.first, 1);
    const uint32_t marker = footprint(c.first);
    CHECK(marker + footprint(c.next) > kRing - kSpareBytes);  // the case must wrap
    write_msg(w, c.next, 2);
    CHECK_EQ(w.position(), pack(1, footprint(c.next)));
    VecSink sink;
    const ReadStatus st = r.read(sink, false);
    if (footprint(c.next) <= marker) {
      CHECK(st == ReadStatus::kMessage);
      CHECK(sink.str() == payload(c.next, 2));
      CHECK_EQ(r.resets(), 0u);
    } else {
      CHECK(st == ReadStatus::kEmpty);
      CHECK_EQ(sink.prepared, 0);
      CHECK_EQ(r.resets(), 1u);
    }
    CHECK_EQ(r.position(), w.position());
    expect_empty(behind);
    CHECK_EQ(behind.resets(), 1u);
  }
}

// Why the publisher caps messages at max_message_size(): then a message that
// has to wrap always ends before the marker, wherever the writer wrapped, so a
// reader that keeps up never loses one. Checked for every aligned write
// position and size, and by running the ring at the tightest combinations.
TEST(messages_up_to_the_publisher_cap_never_overwrite_a_parked_readers_marker) {
  const size_t cap = vipc::msgq::max_message_size(kRing);
  CHECK(cap > 0 && footprint(cap) <= kRing - kSpareBytes);
  for (uint32_t marker = kPrefixBytes; marker <= kRing - kSpareBytes; marker += 8) {
    for (size_t n = 0; n <= cap; n += 8) {
      if (marker + footprint(n) > kRing - kSpareBytes) CHECK(footprint(n) <= marker);
    }
  }
  HeapRing ring(kRing);
  RingWriter w(ring.view());
  RingReader r = ring.add_reader(0);
  uint32_t tag = 0;
  for (const size_t first : {size_t{0}, cap / 2, cap - 8, cap}) {
    for (const size_t next : {cap - 8, cap}) {
      write_msg(w, first, ++tag);
      expect_msg(r, first, tag);
      write_msg(w, next, ++tag);
      expect_msg(r, next, tag);
    }
  }
  CHECK(cycle_of(w.position()) > 0);
  CHECK_EQ(r.resets(), 0u);
}

TEST(lapped_reader_is_reset_before_copying_anything) {
  HeapRing ring(kRing);
  RingWriter w(ring.view());
  RingReader r = ring.add_reader(0);
  // 0xff payload bytes: the reader's old position now holds what would read
  // as a -1 marker or a huge size, if the validity check (R2) came too late.
  const std::string ones(100, '\xff');
  const uint32_t per_cycle = (kRing - kSpareBytes) / footprint(ones.size());
  for (uint32_t i = 0; i < per_cycle + 2; i++) w.write(ones.data(), ones.size());
  CHECK_EQ(ring.slot(0).valid.load(std::memory_order_relaxed), 0u);
  expect_empty(r);
  CHECK_EQ(r.resets(), 1u);
  CHECK_EQ(r.position(), w.position());
  CHECK_EQ(ring.slot(0).resets.load(std::memory_order_relaxed), 1u);
  write_msg(w, 33, 7);
  expect_msg(r, 33, 7);
  CHECK_EQ(r.resets(), 1u);
}

// R5: the writer laps the reader after R2 passed but before the copy; the copy
// is torn, so it must be discarded and the reader reset. A conflating reader
// then gets the newest message, intact; a normal one waits for the next.
TEST(copy_torn_by_a_lapping_writer_is_discarded_and_the_reader_reset) {
  for (const bool conflate : {false, true}) {
    HeapRing ring(kRing);
    RingWriter w(ring.view());
    RingReader r = ring.add_reader(0);
    write_msg(w, 500, 1);
    write_msg(w, 500, 2);
    const uint32_t per_cycle = (kRing - kSpareBytes) / footprint(500);
    InterleavingSink sink([&] {
      for (uint32_t i = 0; i < per_cycle; i++) write_msg(w, 500, 100 + i);
    });
    const ReadStatus st = r.read(sink, conflate);
    CHECK_EQ(sink.discarded, 1);
    CHECK_EQ(r.resets(), 1u);
    if (conflate) {
      CHECK(st == ReadStatus::kMessage);
      CHECK_EQ(sink.prepared, 2);
      CHECK(sink.str() == payload(500, 100 + per_cycle - 1));
    } else {
      CHECK(st == ReadStatus::kEmpty);
      CHECK_EQ(sink.prepared, 1);
      CHECK_EQ(ring.slot(0).messages.load(std::memory_order_relaxed), 0u);
    }
    CHECK_EQ(r.position(), w.position());
  }
}

TEST(writer_active_during_the_copy_without_reaching_the_reader_changes_nothing) {
  HeapRing ring(kRing);
  RingWriter w(ring.view());
  RingReader r = ring.add_reader(0);
  write_msg(w, 500, 1);
  InterleavingSink sink([&] { write_msg(w, 500, 2); });
  CHECK(r.read(sink, false) == ReadStatus::kMessage);
  CHECK(sink.str() == payload(500, 1));
  CHECK_EQ(sink.discarded, 0);
  expect_msg(r, 500, 2);
  CHECK_EQ(r.resets(), 0u);
}

TEST(conflate_returns_only_the_newest_message) {
  HeapRing ring(kRing);
  RingWriter w(ring.view());
  RingReader r = ring.add_reader(0);
  for (uint32_t i = 0; i < 10; i++) write_msg(w, 40, i);
  expect_msg(r, 40, 9, true);
  expect_empty(r, true);
  // Across a wrap: more than a cycle's worth, the newest is in the next cycle.
  const uint32_t per_cycle = (kRing - kSpareBytes) / footprint(40);
  for (uint32_t i = 0; i < per_cycle + 5; i++) write_msg(w, 40, 1000 + i);
  expect_msg(r, 40, 1000 + per_cycle + 4, true);
  CHECK_EQ(r.resets(), 1u);  // lapped, and still handed the newest message
  expect_empty(r, true);
}

// W1 may clear a reader's flag from a read pointer it loaded before that
// reader's last R4 became visible: a spurious lap, after the reader already
// delivered the newest message. A conflating reader resets onto the newest
// message, and must not hand that one out a second time.
TEST(conflating_reader_spuriously_invalidated_never_gets_a_message_twice) {
  HeapRing ring(kRing);
  RingWriter w(ring.view());
  RingReader r = ring.add_reader(0);
  for (uint32_t i = 0; i < 3; i++) write_msg(w, 40, i);
  expect_msg(r, 40, 2, true);
  ring.slot(0).valid.store(0, std::memory_order_relaxed);  // what the late W1 does
  expect_empty(r, true);
  CHECK_EQ(r.resets(), 1u);
  write_msg(w, 40, 3);
  expect_msg(r, 40, 3, true);
}

// The same late W1, landing during the copy: the copy is discarded (it cannot
// be told from a torn one), but the message was never delivered, so a
// conflating reader gets it after its reset; a normal one resets past it.
TEST(spurious_invalidation_during_the_copy_costs_a_conflating_reader_nothing) {
  for (const bool conflate : {false, true}) {
    HeapRing ring(kRing);
    RingWriter w(ring.view());
    RingReader r = ring.add_reader(0);
    write_msg(w, 40, 1);
    InterleavingSink sink([&] { ring.slot(0).valid.store(0, std::memory_order_relaxed); });
    const ReadStatus st = r.read(sink, conflate);
    CHECK_EQ(sink.discarded, 1);
    CHECK_EQ(r.resets(), 1u);
    CHECK(st == (conflate ? ReadStatus::kMessage : ReadStatus::kEmpty));
    if (conflate) CHECK(sink.str() == payload(40, 1));
    expect_empty(r, conflate);
  }
}

// A writer that has wrapped but not yet committed (a loan in progress) leaves
// write_pointer at (cycle + 1, 0): the message before the marker is newest.
TEST(conflate_delivers_the_message_before_a_wrap_in_progress) {
  HeapRing ring(kRing);
  RingWriter w(ring.view());
  RingReader r = ring.add_reader(0);
  write_msg(w, 1000, 1);
  write_msg(w, 1000, 2);
  write_msg(w, 1000, 3);
  expect_msg(r, 1000, 1);  // out of the way of the wrapped message
  expect_msg(r, 1000, 2);
  const std::string big = payload(2000, 4);
  std::memcpy(w.reserve(big.size()), big.data(), big.size());
  CHECK_EQ(ring.header()->write_pointer.load(std::memory_order_relaxed), pack(1, 0));
  expect_msg(r, 1000, 3, true);
  w.commit(big.size());
  expect_msg(r, 2000, 4, true);
  expect_empty(r, true);
}

// All 64 slots at staggered positions: the writer's next cycle invalidates
// exactly the readers whose unread data it overwrites, one by one.
TEST(sixty_four_readers_are_invalidated_independently) {
  HeapRing ring(kRing);
  RingWriter w(ring.view());
  std::vector<RingReader> readers;
  for (uint32_t i = 0; i < vipc::msgq::kMaxReaders; i++) readers.push_back(ring.add_reader(i));
  CHECK_EQ(ring.header()->reader_mask.load(std::memory_order_relaxed), ~uint64_t{0});

  constexpr size_t kSize = 56;
  const uint32_t per_cycle = (kRing - kSpareBytes) / footprint(kSize);
  for (uint32_t seq = 0; seq < per_cycle; seq++) write_msg(w, kSize, seq);
  for (uint32_t i = 0; i < vipc::msgq::kMaxReaders; i++) {
    for (uint32_t seq = 0; seq < std::min(i, per_cycle); seq++) expect_msg(readers[i], kSize, seq);
  }
  // Message j of cycle 1 lands on reader j's position (both are j * footprint).
  const uint32_t lapping = 20;
  for (uint32_t j = 0; j < lapping; j++) write_msg(w, kSize, per_cycle + j);
  const uint32_t total = per_cycle + lapping;

  for (uint32_t i = 0; i < vipc::msgq::kMaxReaders; i++) {
    const bool lapped = i < lapping;
    CHECK_EQ(ring.slot(i).valid.load(std::memory_order_relaxed), lapped ? 0u : 1u);
  }
  for (uint32_t i = 0; i < vipc::msgq::kMaxReaders; i++) {
    if (i < lapping) {
      expect_empty(readers[i]);
      CHECK_EQ(readers[i].resets(), 1u);
      continue;
    }
    for (uint32_t seq = std::min(i, per_cycle); seq < total; seq++) expect_msg(readers[i], kSize, seq);
    expect_empty(readers[i]);
    CHECK_EQ(readers[i].resets(), 0u);
  }
}

TEST(reader_that_left_its_slot_is_not_invalidated_or_tracked) {
  HeapRing ring(kRing);
  RingWriter w(ring.view());
  ring.add_reader(3);
  ring.header()->reader_mask.fetch_and(~(uint64_t{1} << 3), std::memory_order_seq_cst);
  for (uint32_t i = 0; i < 100; i++) write_msg(w, 100, i);
  CHECK_EQ(ring.slot(3).valid.load(std::memory_order_relaxed), 1u);  // the writer skips unused slots
}

TEST(corrupt_size_prefix_is_reset_and_counted_without_reading_out_of_bounds) {
  const int64_t max = static_cast<int64_t>(kRingFit);
  for (const int64_t bad :
       {int64_t{-2}, int64_t{-4096}, INT64_MIN, max + 1, int64_t{kRing}, int64_t{1} << 40, INT64_MAX}) {
    HeapRing ring(kRing);
    RingWriter w(ring.view());
    RingReader r = ring.add_reader(0);
    write_msg(w, 100, 1);
    ring.set_prefix_at(0, bad);
    expect_empty(r);
    CHECK_EQ(r.corrupt(), 1u);
    CHECK_EQ(r.resets(), 1u);
    write_msg(w, 100, 2);
    expect_msg(r, 100, 2);
  }
}

// A reader can only get an impossible position from a corrupt write pointer
// (a reset adopts whatever is there). It must refuse to read while the write
// pointer is insane, and once the writer is sane again notice its own position
// is impossible and reset again. The bad position is placed where the writer's
// W1 considers it safe, so only the reader's own bounds check can catch it.
TEST(corrupt_positions_are_reset_and_counted_without_reading_out_of_bounds) {
  for (const uint32_t bad_offset : {uint32_t{12}, kRing - 4, kRing, kRing + 64, uint32_t{0xfffffff8}}) {
    HeapRing ring(kRing);
    RingWriter w(ring.view());
    RingReader r = ring.add_reader(0);
    write_msg(w, 100, 1);
    expect_msg(r, 100, 1);
    std::atomic<uint64_t>& wp = ring.header()->write_pointer;
    const uint64_t good = wp.load(std::memory_order_relaxed);
    const uint32_t bad_cycle = bad_offset <= offset_of(good) ? cycle_of(good) : cycle_of(good) - 1;

    wp.store(pack(bad_cycle, bad_offset), std::memory_order_relaxed);
    CHECK_THROWS_KIND(RingWriter{ring.view()}, vipc::common::ErrorKind::kSegment);
    VecSink sink;
    CHECK_THROWS_KIND(r.read(sink, false), vipc::common::ErrorKind::kSegment);
    CHECK_EQ(sink.prepared, 0);

    ring.slot(0).valid.store(0, std::memory_order_relaxed);  // force a reset onto the bad pointer
    expect_empty(r);
    CHECK_EQ(r.position(), pack(bad_cycle, bad_offset));
    CHECK_EQ(r.resets(), 1u);

    wp.store(good, std::memory_order_relaxed);
    write_msg(w, 100, 2);
    CHECK_EQ(ring.slot(0).valid.load(std::memory_order_relaxed), 1u);
    expect_empty(r);
    CHECK_EQ(r.corrupt(), 1u);
    CHECK_EQ(r.resets(), 2u);
    CHECK_EQ(r.position(), w.position());
    write_msg(w, 100, 3);
    expect_msg(r, 100, 3);
  }
}

// ---- Publisher / Subscriber on segment files in a private directory ----

namespace {

using vipc::msgq::Publisher;
using vipc::msgq::SegmentSpec;
using vipc::msgq::Subscriber;

constexpr size_t kSegment = 64 * 1024;

SegmentSpec spec_in(const testing::TempDir& dir, size_t data_size = 0, const char* name = "msgq@topic") {
  SegmentSpec spec;
  spec.dir = dir.path();
  spec.basename = name;
  spec.data_size = data_size;
  return spec;
}

void send_msg(Publisher& pub, size_t n, uint32_t tag) {
  const std::string p = payload(n, tag);
  pub.send(p.data(), p.size());
}

void expect_received(Subscriber& sub, size_t n, uint32_t tag) {
  VecSink sink;
  CHECK(sub.try_read(sink));
  CHECK(sink.str() == payload(n, tag));
}

void expect_nothing(Subscriber& sub) {
  VecSink sink;
  CHECK(!sub.try_read(sink));
}

}  // namespace

TEST(sixty_four_subscribers_receive_a_sixty_fifth_is_refused_and_closing_one_frees_a_slot) {
  testing::TempDir dir;
  {
    Publisher pub(spec_in(dir, kSegment));
    std::vector<std::unique_ptr<Subscriber>> subs;
    for (uint32_t i = 0; i < vipc::msgq::kMaxReaders; i++)
      subs.push_back(std::make_unique<Subscriber>(spec_in(dir), false));
    CHECK_EQ(pub.num_readers(), vipc::msgq::kMaxReaders);
    CHECK_THROWS_KIND(Subscriber(spec_in(dir), false), vipc::common::ErrorKind::kTooManyReaders);

    send_msg(pub, 300, 1);
    for (auto& s : subs) expect_received(*s, 300, 1);

    const uint32_t freed = subs[17]->slot();
    subs[17].reset();
    CHECK_EQ(pub.num_readers(), vipc::msgq::kMaxReaders - 1);
    Subscriber late(spec_in(dir), false);
    CHECK_EQ(late.slot(), freed);
    send_msg(pub, 10, 2);
    expect_received(late, 10, 2);
    for (auto& s : subs) {
      if (s) expect_received(*s, 10, 2);
    }
  }
  CHECK(dir.entries().empty());  // the last one out unlinks the segment
}

TEST(message_larger_than_the_ring_can_hold_is_refused) {
  testing::TempDir dir;
  {
    Publisher pub(spec_in(dir, kSegment));
    Subscriber sub(spec_in(dir), false);
    const size_t max = pub.max_message_size();
    CHECK_EQ(max, vipc::msgq::max_message_size(kSegment));
    CHECK_THROWS_KIND(send_msg(pub, max + 1, 1), vipc::common::ErrorKind::kMessageTooLarge);
    CHECK_THROWS_KIND(pub.loan(max + 1), vipc::common::ErrorKind::kMessageTooLarge);
    expect_nothing(sub);
    send_msg(pub, max, 2);
    expect_received(sub, max, 2);
    // Zero-copy: loan, fill in place, commit fewer bytes than loaned.
    const std::string p = payload(max / 2, 3);
    std::memcpy(pub.loan(max), p.data(), p.size());
    pub.commit(p.size());
    expect_received(sub, p.size(), 3);
  }
  CHECK(dir.entries().empty());
}

TEST(subscriber_created_before_its_publisher_receives_from_the_first_message) {
  testing::TempDir dir;
  for (const size_t size : {size_t{0}, kSegment}) {  // adopt the segment, or replace it with another size
    Subscriber sub(spec_in(dir), false);
    Publisher pub(spec_in(dir, size));
    send_msg(pub, 100, 1);
    send_msg(pub, 200, 2);
    expect_received(sub, 100, 1);
    expect_received(sub, 200, 2);
    expect_nothing(sub);
    CHECK_EQ(sub.segment_size(), size == 0 ? vipc::msgq::kDefaultDataSize : size);
    CHECK_EQ(sub.resets(), 0u);
  }
  CHECK(dir.entries().empty());
}

TEST(last_publisher_wins_and_the_old_one_fails_on_send) {
  testing::TempDir dir;
  {
    Publisher first(spec_in(dir));
    Subscriber sub(spec_in(dir), false);
    send_msg(first, 10, 1);
    Publisher second(spec_in(dir));
    CHECK_THROWS_KIND(send_msg(first, 10, 2), vipc::common::ErrorKind::kMultiplePublishers);
    CHECK_THROWS_KIND(first.loan(10), vipc::common::ErrorKind::kMultiplePublishers);
    send_msg(second, 10, 3);
    expect_received(sub, 10, 1);  // the new publisher continues where the old one stopped
    expect_received(sub, 10, 3);
    expect_nothing(sub);
  }
  CHECK(dir.entries().empty());
}

TEST(publisher_with_another_size_supersedes_the_segment_and_subscribers_follow) {
  testing::TempDir dir;
  {
    Publisher old_pub(spec_in(dir, kSegment));
    Subscriber sub(spec_in(dir), false);
    Subscriber conflated(spec_in(dir), true);
    send_msg(old_pub, 100, 1);
    Publisher new_pub(spec_in(dir, 2 * kSegment));
    CHECK_EQ(new_pub.segment_size(), 2 * kSegment);
    send_msg(new_pub, 100, 2);
    send_msg(new_pub, 100, 3);
    CHECK_THROWS_KIND(send_msg(old_pub, 100, 4), vipc::common::ErrorKind::kMultiplePublishers);

    expect_received(sub, 100, 1);  // drains the old ring first
    expect_received(sub, 100, 2);
    expect_received(sub, 100, 3);
    expect_nothing(sub);
    CHECK_EQ(sub.segment_size(), 2 * kSegment);
    expect_received(conflated, 100, 1);
    expect_received(conflated, 100, 3);
    CHECK_EQ(new_pub.num_readers(), 2u);
    CHECK_EQ(dir.entries().size(), 1u);  // the old file is unlinked, the old publisher's mapping lives on
  }
  CHECK(dir.entries().empty());
}

int main(int argc, char** argv) { return check::run_all(argc, argv); }
