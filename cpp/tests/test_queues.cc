// Tests of the ordered topic (availability word, CAS loops, producers and
// readers on a real segment file) and of the lossless broadcast queue
// (writer and reader threads on a real segment file). Built plain, with
// ASan+UBSan and with TSan by tests/system/test_cpp.py.
//
// The threaded stresses never let the ring wrap (more slots than messages),
// so every payload byte is published by release/acquire alone: TSan checks
// them without the seqlock's intended race (covered by the Python tests).
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "broadcast/queue.h"
#include "check.h"
#include "check_errors.h"
#include "common/clock.h"
#include "common/wait_point.h"
#include "ordered/availability.h"
#include "ordered/topic.h"
#include "test_support.h"

using vipc::ordered::Availability;
using vipc::ordered::MakeAvailable;
using vipc::ordered::Reserve;

namespace {

uint64_t reserve_next(std::atomic<uint64_t>& w) {
  uint64_t id = 0;
  CHECK(vipc::ordered::try_reserve_next(w, &id) == Reserve::kOk);
  return id;
}

Availability snap(const std::atomic<uint64_t>& w) { return Availability::unpack(w.load()); }

// Payload of message `id`: its id, then bytes derived from it.
std::vector<uint8_t> payload_for(uint64_t id, size_t max_size) {
  std::mt19937_64 rng(id * 0x9E3779B97F4A7C15ull + 1);
  const size_t n = 8 + rng() % (max_size - 8 + 1);
  std::vector<uint8_t> out(n);
  std::memcpy(out.data(), &id, 8);
  for (size_t i = 8; i < n; i++) out[i] = static_cast<uint8_t>(rng());
  return out;
}

}  // namespace

// ---------------------------------------------------------------- availability word

TEST(availability_packs_last_and_bitmap_in_one_word) {
  std::atomic<uint64_t> w{Availability::initial(0)};
  CHECK_EQ(snap(w).end(), 0u);
  CHECK_EQ(snap(w).available_end(), 0u);
  uint64_t newest = 0;
  CHECK(!snap(w).newest_available(&newest));
  CHECK_EQ(reserve_next(w), 0u);
  CHECK_EQ(reserve_next(w), 1u);
  CHECK_EQ(snap(w).end(), 2u);
  CHECK(!snap(w).is_available(0));
  CHECK(vipc::ordered::try_make_available(w, 0) == MakeAvailable::kOk);
  CHECK(snap(w).is_available(0));
  CHECK_EQ(snap(w).available_end(), 1u);
  CHECK(vipc::ordered::try_make_available(w, 0) == MakeAvailable::kAlreadyAvailable);
  CHECK(vipc::ordered::try_make_available(w, 2) == MakeAvailable::kNotReserved);
  CHECK_EQ(snap(w).begin(16), 0u);
}

// The case a pair of counters (first, last) cannot express: B finishes N+1
// before A finishes N. Readers must see N+1 available and N not.
TEST(later_id_finished_first_does_not_make_the_earlier_one_available) {
  std::atomic<uint64_t> w{Availability::initial(0)};
  for (int i = 0; i < 5; i++) CHECK(vipc::ordered::try_make_available(w, reserve_next(w)) == MakeAvailable::kOk);
  const uint64_t a = reserve_next(w);  // N
  const uint64_t b = reserve_next(w);  // N + 1
  CHECK(vipc::ordered::try_make_available(w, b) == MakeAvailable::kOk);
  const Availability s = snap(w);
  CHECK(!s.is_available(a));
  CHECK(s.is_available(b));
  CHECK_EQ(s.available_end(), a);  // a sequential reader stops before N
  uint64_t newest = 0;
  CHECK(s.newest_available(&newest));
  CHECK_EQ(newest, b);  // a newest reader may take N + 1
  CHECK(vipc::ordered::try_make_available(w, a) == MakeAvailable::kOk);
  CHECK_EQ(snap(w).available_end(), b + 1);
}

TEST(window_bounds_the_ids_in_flight) {
  std::atomic<uint64_t> w{Availability::initial(0)};
  for (int i = 0; i < vipc::ordered::kWindow; i++) CHECK_EQ(reserve_next(w), static_cast<uint64_t>(i));
  uint64_t id = 0;
  CHECK(vipc::ordered::try_reserve_next(w, &id) == Reserve::kWindowFull);  // id 0 would leave unfinished
  CHECK(vipc::ordered::try_make_available(w, 5) == MakeAvailable::kOk);
  CHECK(vipc::ordered::try_reserve_next(w, &id) == Reserve::kWindowFull);  // still id 0
  CHECK(vipc::ordered::try_make_available(w, 0) == MakeAvailable::kOk);
  CHECK(vipc::ordered::try_reserve_next(w, &id) == Reserve::kOk);
  CHECK_EQ(id, 16u);
  CHECK(snap(w).is_available(0));  // out of the window, available for good
}

TEST(reserve_id_skips_ids_as_available_gaps_and_refuses_old_ones) {
  std::atomic<uint64_t> w{Availability::initial(0)};
  CHECK(vipc::ordered::try_reserve_id(w, 3) == Reserve::kOk);
  const Availability s = snap(w);
  CHECK_EQ(s.end(), 4u);
  CHECK(s.is_available(0) && s.is_available(1) && s.is_available(2));
  CHECK(!s.is_available(3));
  CHECK_EQ(s.available_end(), 3u);
  CHECK(vipc::ordered::try_reserve_id(w, 2) == Reserve::kTooOld);
  CHECK(vipc::ordered::try_reserve_id(w, 100) == Reserve::kWindowFull);  // 3 would leave the window unfinished
  CHECK(vipc::ordered::try_make_available(w, 3) == MakeAvailable::kOk);
  CHECK(vipc::ordered::try_reserve_id(w, 100) == Reserve::kOk);
  CHECK_EQ(snap(w).available_end(), 100u);
  CHECK_EQ(reserve_next(w), 101u);
}

// Many threads run the three CAS loops on one word; a watcher checks that
// last and the sequential frontier only ever grow. At the end every id is
// reserved exactly once and available.
TEST(cas_stress_many_producers_reserve_each_id_once) {
  constexpr int kThreads = 8;
  constexpr int kEach = 3000;
  std::atomic<uint64_t> w{Availability::initial(0)};
  std::vector<std::atomic<uint8_t>> seen(kThreads * kEach);
  std::atomic<bool> done{false};
  std::atomic<uint64_t> watcher_errors{0};
  std::thread watcher([&] {
    Availability prev = snap(w);
    while (!done.load()) {
      const Availability a = snap(w);
      if (a.last < prev.last || a.available_end() < prev.available_end() || a.available_end() > a.last) {
        watcher_errors++;
      }
      prev = a;
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; t++) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<uint64_t> held;
      for (int i = 0; i < kEach; i++) {
        uint64_t id = 0;
        while (vipc::ordered::try_reserve_next(w, &id) != Reserve::kOk) {
          // Window full: finish our own first (others may wait on them), else yield.
          if (!held.empty()) {
            CHECK(vipc::ordered::try_make_available(w, held.back()) == MakeAvailable::kOk);
            held.pop_back();
          } else {
            std::this_thread::yield();
          }
        }
        CHECK(id < seen.size());
        CHECK_EQ(seen[id].fetch_add(1), 0);
        held.push_back(id);
        // Finish in a random order, sometimes several at once.
        while (!held.empty() && rng() % 3 != 0) {
          const size_t k = rng() % held.size();
          CHECK(vipc::ordered::try_make_available(w, held[k]) == MakeAvailable::kOk);
          held.erase(held.begin() + static_cast<long>(k));
        }
      }
      for (uint64_t id : held) CHECK(vipc::ordered::try_make_available(w, id) == MakeAvailable::kOk);
    });
  }
  for (auto& t : threads) t.join();
  done = true;
  watcher.join();
  CHECK_EQ(watcher_errors.load(), 0u);
  const Availability end = snap(w);
  CHECK_EQ(end.last, static_cast<uint64_t>(kThreads * kEach));
  CHECK_EQ(end.available_end(), end.last);
  for (auto& s : seen) CHECK_EQ(s.load(), 1);
}

// ---------------------------------------------------------------- ordered topic

// Producers in threads publish out of order into a segment file; a
// sequential reader gets every id in order with its own bytes, a newest
// reader gets strictly increasing ids.
TEST(ordered_topic_threads_sequential_reader_gets_every_id_in_order) {
  testing::TempDir dir;
  constexpr int kProducers = 4;
  constexpr int kEach = 500;
  constexpr uint64_t kTotal = kProducers * kEach;
  vipc::ordered::TopicSpec spec;
  spec.dir = dir.path();
  spec.basename = "ordered-stress";
  spec.capacity = 4096;  // > kTotal: no slot is reused (see the file comment)
  spec.slot_bytes = 96;
  auto creator = std::make_unique<vipc::ordered::Producer>(spec);
  spec.capacity = 0;
  spec.slot_bytes = 0;
  vipc::ordered::Reader sequential(spec, vipc::ordered::Mode::kSequential);
  vipc::ordered::Reader newest(spec, vipc::ordered::Mode::kNewest);

  std::atomic<uint64_t> bad{0};
  std::thread seq_thread([&] {
    uint64_t expect = 0;
    const int64_t deadline = vipc::common::monotonic_ns() + 60'000'000'000;
    while (expect < kTotal && vipc::common::monotonic_ns() < deadline) {
      vipc::ordered::Message m;
      if (!sequential.next(&m)) {
        sequential.wait(vipc::common::monotonic_ns() + 100'000'000);
        continue;
      }
      std::vector<uint8_t> got(m.data, m.data + m.size);
      if (!sequential.still_valid(m) || m.id != expect || got != payload_for(m.id, 96)) bad++;
      expect = m.id + 1;
    }
    if (expect != kTotal) bad++;
  });
  std::thread newest_thread([&] {
    int64_t last = -1;
    const int64_t deadline = vipc::common::monotonic_ns() + 60'000'000'000;
    while (last + 1 < static_cast<int64_t>(kTotal) && vipc::common::monotonic_ns() < deadline) {
      vipc::ordered::Message m;
      if (!newest.next(&m)) {
        newest.wait(vipc::common::monotonic_ns() + 100'000'000);
        continue;
      }
      std::vector<uint8_t> got(m.data, m.data + m.size);
      if (static_cast<int64_t>(m.id) <= last || got != payload_for(m.id, 96)) bad++;
      last = static_cast<int64_t>(m.id);
    }
  });
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; p++) {
    producers.emplace_back([&, p] {
      vipc::ordered::Producer prod(spec);
      std::mt19937 rng(p + 100);
      for (int i = 0; i < kEach; i++) {
        uint64_t id = 0;
        CHECK(prod.reserve_next(vipc::common::monotonic_ns() + 30'000'000'000, &id) ==
              vipc::common::WaitStatus::kReady);
        if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
        const std::vector<uint8_t> data = payload_for(id, 96);
        std::memcpy(prod.slot(id), data.data(), data.size());
        prod.publish(id, data.size());
      }
    });
  }
  for (auto& t : producers) t.join();
  seq_thread.join();
  newest_thread.join();
  CHECK_EQ(bad.load(), 0u);
  CHECK_EQ(sequential.dropped(), 0u);
  CHECK_EQ(sequential.gaps(), 0u);
}

TEST(ordered_topic_bad_input) {
  testing::TempDir dir;
  vipc::ordered::TopicSpec spec;
  spec.dir = dir.path();
  spec.basename = "ordered-bad";
  CHECK_THROWS_KIND(vipc::ordered::Reader(spec, vipc::ordered::Mode::kSequential),
                    vipc::common::ErrorKind::kInvalidArgument);
  spec.capacity = 8;  // below the window
  spec.slot_bytes = 16;
  CHECK_THROWS_KIND(vipc::ordered::Producer p(spec), vipc::common::ErrorKind::kInvalidArgument);
  spec.capacity = 16;
  vipc::ordered::Producer prod(spec);
  spec.capacity = 32;  // another size while it is in use
  CHECK_THROWS_KIND(vipc::ordered::Producer p(spec), vipc::common::ErrorKind::kInvalidArgument);
  uint64_t id = 0;
  CHECK(prod.reserve_next(vipc::common::kNever, &id) == vipc::common::WaitStatus::kReady);
  CHECK_THROWS_KIND(prod.publish(id, 17), vipc::common::ErrorKind::kMessageTooLarge);
  CHECK_THROWS_KIND(prod.publish(id + 1, 1), vipc::common::ErrorKind::kInvalidArgument);
  CHECK_THROWS_KIND(prod.reserve_id(id, vipc::common::kNever), vipc::common::ErrorKind::kInvalidArgument);
  prod.cancel(id);
  CHECK_THROWS_KIND(prod.publish(id, 1), vipc::common::ErrorKind::kInvalidArgument);
  // 16 in flight: the 17th reservation times out instead of overwriting.
  std::vector<uint64_t> held;
  for (int i = 0; i < vipc::ordered::kWindow; i++) {
    CHECK(prod.reserve_next(vipc::common::kNever, &id) == vipc::common::WaitStatus::kReady);
    held.push_back(id);
  }
  CHECK(prod.reserve_next(vipc::common::monotonic_ns() + 20'000'000, &id) == vipc::common::WaitStatus::kTimeout);
  // shutdown wakes a reader that waits.
  spec.capacity = 0;
  vipc::ordered::Reader reader(spec, vipc::ordered::Mode::kSequential);
  std::thread waker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    prod.shutdown();
  });
  CHECK(reader.wait(vipc::common::monotonic_ns() + 10'000'000'000) == vipc::common::WaitStatus::kShutdown);
  waker.join();
}

// ---------------------------------------------------------------- wait points

TEST(wait_point_notifier_clears_the_sleep_bit_and_skips_syscalls_until_a_waiter_returns) {
  vipc::common::WaitPoint wp{};
  std::atomic<bool> flag{false};
  std::atomic<int> woke{0};
  std::thread waiter([&] {
    auto ready = [&] { return flag.load(std::memory_order_acquire); };
    CHECK(vipc::common::wait_until(wp, ready, vipc::common::monotonic_ns() + 10'000'000'000) ==
          vipc::common::WaitStatus::kReady);
    woke.store(1);
  });
  // The waiter registers (bit 0 set) before it sleeps.
  const int64_t give_up = vipc::common::monotonic_ns() + 5'000'000'000;
  while ((wp.word.load() & vipc::common::kMaySleep) == 0 && vipc::common::monotonic_ns() < give_up)
    std::this_thread::yield();
  CHECK((wp.word.load() & vipc::common::kMaySleep) != 0);
  const uint32_t before = wp.word.load();
  vipc::common::notify_all(wp);  // condition still false: the waiter wakes, re-registers and sleeps again
  CHECK(wp.word.load() != before);
  while ((wp.word.load() & vipc::common::kMaySleep) == 0 && vipc::common::monotonic_ns() < give_up)
    std::this_thread::yield();
  flag.store(true, std::memory_order_release);
  const uint32_t registered = wp.word.load();
  CHECK((registered & vipc::common::kMaySleep) != 0);
  vipc::common::notify_all(wp);
  const uint32_t cleared = wp.word.load();
  CHECK(cleared == (registered & ~vipc::common::kMaySleep) + 2);
  vipc::common::notify_all(wp);  // nobody registered since: no change to the word, no wake
  vipc::common::notify_all_if(wp, [] { return true; });
  CHECK(wp.word.load() == cleared);
  waiter.join();
  CHECK(woke.load() == 1);
  // notify_all_if leaves the bit for sleepers that do not care yet.
  wp.word.fetch_or(vipc::common::kMaySleep);
  const uint32_t set = wp.word.load();
  vipc::common::notify_all_if(wp, [] { return false; });
  CHECK(wp.word.load() == set);
}

TEST(wait_point_ping_pong_never_loses_a_wake) {
  // Two threads hand a token back and forth through two wait points without
  // polling; a lost wake-up would leave both asleep until the 10 s deadline.
  vipc::common::WaitPoint to_b{}, to_a{};
  std::atomic<uint64_t> token{0};
  constexpr uint64_t kRounds = 20000;
  std::thread b([&] {
    for (uint64_t i = 0; i < kRounds; i++) {
      auto mine = [&] { return token.load(std::memory_order_acquire) == 2 * i + 1; };
      CHECK(vipc::common::wait_until(to_b, mine, vipc::common::monotonic_ns() + 10'000'000'000) ==
            vipc::common::WaitStatus::kReady);
      token.store(2 * i + 2, std::memory_order_release);
      vipc::common::notify_all(to_a);
    }
  });
  for (uint64_t i = 0; i < kRounds; i++) {
    auto mine = [&] { return token.load(std::memory_order_acquire) == 2 * i; };
    CHECK(vipc::common::wait_until(to_a, mine, vipc::common::monotonic_ns() + 10'000'000'000) ==
          vipc::common::WaitStatus::kReady);
    token.store(2 * i + 1, std::memory_order_release);
    vipc::common::notify_all(to_b);
  }
  b.join();
  CHECK(token.load() == 2 * kRounds);
}

// ---------------------------------------------------------------- broadcast queue

TEST(broadcast_threads_every_reader_gets_every_message_exactly) {
  testing::TempDir dir;
  constexpr uint32_t kReaders = 3;
  constexpr uint64_t kMessages = 3000;
  constexpr size_t kChunk = 512;
  vipc::broadcast::QueueSpec spec;
  spec.dir = dir.path();
  spec.basename = "bcast-stress";
  spec.n_readers = kReaders;
  spec.n_chunks = 8;
  spec.chunk_bytes = kChunk;
  vipc::broadcast::Writer writer(spec);
  std::atomic<uint64_t> bad{0};
  std::atomic<int> reader_status{static_cast<int>(vipc::common::WaitStatus::kReady)};  // a reader's failed wait
  std::vector<std::thread> readers;
  for (uint32_t r = 0; r < kReaders; r++) {
    readers.emplace_back([&, r] {
      vipc::broadcast::Reader reader(spec, r);
      const int64_t deadline = vipc::common::monotonic_ns() + 60'000'000'000;
      for (uint64_t seq = 0; seq < kMessages;) {
        vipc::broadcast::ChunkView view;
        if (!reader.peek(view)) {
          const vipc::common::WaitStatus st = reader.wait_readable(deadline);
          if (st != vipc::common::WaitStatus::kReady) {
            reader_status.store(static_cast<int>(st));
            bad++;
            return;
          }
          continue;
        }
        const std::vector<uint8_t> want = payload_for(seq, kChunk - 32);
        const bool ok = view.parts.size() == 1 && view.parts[0].size == want.size() &&
                        std::memcmp(view.parts[0].data, want.data(), want.size()) == 0;
        if (!ok) bad++;
        if (r == 0 && seq % 64 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a slow reader
        reader.consume();
        seq++;
      }
    });
  }
  for (uint64_t seq = 0; seq < kMessages; seq++) {
    const std::vector<uint8_t> data = payload_for(seq, kChunk - 32);
    const vipc::broadcast::Part part{data.data(), data.size()};
    const vipc::common::WaitStatus st = writer.wait_writable(vipc::common::monotonic_ns() + 30'000'000'000);
    CHECK_EQ(reader_status.load(), static_cast<int>(vipc::common::WaitStatus::kReady));
    CHECK_EQ(static_cast<int>(st), static_cast<int>(vipc::common::WaitStatus::kReady));
    writer.write(0, &part, 1);
  }
  for (auto& t : readers) t.join();
  CHECK_EQ(bad.load(), 0u);
  CHECK_EQ(writer.written(), kMessages);
}

TEST(broadcast_writer_waits_for_the_slowest_reader_and_shutdown_wakes_it) {
  testing::TempDir dir;
  vipc::broadcast::QueueSpec spec;
  spec.dir = dir.path();
  spec.basename = "bcast-wait";
  spec.n_readers = 2;
  spec.n_chunks = 2;
  spec.chunk_bytes = 128;
  vipc::broadcast::Writer writer(spec);
  vipc::broadcast::Reader fast(spec, 0);
  CHECK_THROWS_KIND(vipc::broadcast::Reader(spec, 0), vipc::common::ErrorKind::kInvalidArgument);  // rank taken
  CHECK_THROWS_KIND(vipc::broadcast::Reader(spec, 2), vipc::common::ErrorKind::kInvalidArgument);  // no such rank
  const char msg[] = "hello";
  const vipc::broadcast::Part part{msg, sizeof(msg)};
  for (int i = 0; i < 2; i++) {
    CHECK(writer.wait_writable(vipc::common::kNever) == vipc::common::WaitStatus::kReady);
    writer.write(0, &part, 1);
  }
  for (int i = 0; i < 2; i++) {
    vipc::broadcast::ChunkView v;
    CHECK(fast.peek(v));
    fast.consume();
  }
  // Reader 1 never attached: the third message must wait for it.
  CHECK(writer.wait_writable(vipc::common::monotonic_ns() + 20'000'000) == vipc::common::WaitStatus::kTimeout);
  CHECK_EQ(writer.pending_readers(), uint64_t{2});
  std::vector<uint8_t> big(200);
  const vipc::broadcast::Part too_big{big.data(), big.size()};
  CHECK(!writer.fits(&too_big, 1));
  std::thread waker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    fast.shutdown();
  });
  CHECK(writer.wait_writable(vipc::common::monotonic_ns() + 10'000'000'000) == vipc::common::WaitStatus::kShutdown);
  waker.join();
  // The late reader still drains what was written before the shutdown.
  vipc::broadcast::Reader late(spec, 1);
  for (int i = 0; i < 2; i++) {
    CHECK(late.wait_readable(vipc::common::kNever) == vipc::common::WaitStatus::kReady);
    vipc::broadcast::ChunkView v;
    CHECK(late.peek(v));
    CHECK(v.parts.size() == 1 && std::memcmp(v.parts[0].data, msg, sizeof(msg)) == 0);
    late.consume();
  }
  CHECK(late.wait_readable(vipc::common::kNever) == vipc::common::WaitStatus::kShutdown);
}

int main(int argc, char** argv) { return check::run_all(argc, argv); }
