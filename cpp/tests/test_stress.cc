// Concurrency stress for the MSGQ ring, with self-checking messages
// (stress_payload.h): random sizes from 0 to the largest message, every byte
// verified, sequence numbers strictly increasing, every drop explained by a
// counted reset. Two layers:
//
//   threads    one writer thread and several reader threads on ONE mapping
//              (RingWriter / RingReader), so ThreadSanitizer sees every access;
//   processes  fork()ed writer and reader processes on a real segment file via
//              Publisher / Subscriber, waiting on futexes and file descriptors,
//              one reader SIGKILLed mid-run. Not under TSan (fork + TSan).
//
// In both, one deliberately slow reader waits until the writer has written
// twice the ring after each message it reads, so it must be lapped and reset.
//
// usage: test_stress [threads|processes|all] [--seconds S] [--seed N] [--ring BYTES]
// A watchdog (alarm) kills any run that outlives its budget by 60 s.
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "common/clock.h"
#include "msgq/publisher.h"
#include "msgq/subscriber.h"
#include "stress_payload.h"
#include "test_support.h"

namespace {

using stress::Payloads;
using stress::StreamChecker;

#if defined(__SANITIZE_THREAD__)
constexpr size_t kDefaultRing = 16 * 1024;  // TSan copies byte by byte (ring_copy): keep messages small
#else
constexpr size_t kDefaultRing = 64 * 1024;
#endif

struct Options {
  std::string mode = "all";
  double seconds = 3.0;
  uint64_t seed = 0;
  size_t ring = kDefaultRing;
};

enum class Role { kFast, kFastPoller, kConflate, kSlow, kVictim };

const char* role_name(Role r) {
  switch (r) {
    case Role::kFast:
      return "fast";
    case Role::kFastPoller:
      return "fast-fd";
    case Role::kConflate:
      return "conflate";
    case Role::kSlow:
      return "slow";
    case Role::kVictim:
      return "killed";
  }
  return "?";
}

// Shared by the writer and the readers: in process memory for threads, in an
// anonymous shared mapping for processes (lock-free atomics work in both).
struct Control {
  std::atomic<uint64_t> bytes_sent{0};  // writer: release after each send; slow reader: acquire
  std::atomic<uint64_t> sent{0};
  std::atomic<uint32_t> ready{0};  // readers attached
  std::atomic<uint32_t> done{0};   // writer finished: release; readers drain, then stop
};

struct ReaderResult {
  std::atomic<uint64_t> delivered{0}, bytes{0}, in_order{0}, tiny{0}, resets{0};
};

void record(ReaderResult& out, const StreamChecker& chk, uint64_t resets) {
  out.delivered.store(chk.delivered(), std::memory_order_relaxed);
  out.bytes.store(chk.bytes(), std::memory_order_relaxed);
  out.in_order.store(chk.in_order(), std::memory_order_relaxed);
  out.tiny.store(chk.tiny(), std::memory_order_relaxed);
  out.resets.store(resets, std::memory_order_relaxed);
}

// The slow reader's pause: until the writer has written twice the ring past
// the message just read (so its position is certainly overwritten), or is done.
void lag_behind(const Control& ctl, size_t ring) {
  const uint64_t mark = ctl.bytes_sent.load(std::memory_order_acquire);
  while (ctl.bytes_sent.load(std::memory_order_acquire) < mark + 2 * ring &&
         ctl.done.load(std::memory_order_acquire) == 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void report(const char* mode, const std::vector<Role>& roles, const std::vector<ReaderResult*>& results,
            uint64_t sent) {
  std::printf("%s: writer sent %llu messages\n", mode, static_cast<unsigned long long>(sent));
  for (size_t i = 0; i < roles.size(); i++) {
    const ReaderResult& r = *results[i];
    std::printf("  reader %zu %-9s delivered %8llu (%llu in order, %llu short) %6.1f MB, resets %llu\n", i,
                role_name(roles[i]), static_cast<unsigned long long>(r.delivered.load()),
                static_cast<unsigned long long>(r.in_order.load()), static_cast<unsigned long long>(r.tiny.load()),
                r.bytes.load() / 1e6, static_cast<unsigned long long>(r.resets.load()));
  }
  std::fflush(stdout);
}

// Outcome checks common to both layers; the per-message invariants were
// checked as the messages arrived.
void check_outcome(const std::vector<Role>& roles, const std::vector<ReaderResult*>& results, uint64_t sent) {
  CHECK(sent > 0);
  for (size_t i = 0; i < roles.size(); i++) {
    const ReaderResult& r = *results[i];
    CHECK(r.delivered.load() <= sent);
    if (roles[i] == Role::kVictim) continue;
    CHECK(r.delivered.load() > 0);
    if (roles[i] == Role::kSlow) CHECK(r.resets.load() > 0);
  }
}

// ---- threads: one mapping, RingWriter / RingReader ----

// Reuses its buffer, so the hot loop does not allocate per message; hands out
// nullptr for a 0-byte first message (allowed by the Sink contract).
struct VecSinkReuse {
  std::vector<char> buf;
  char* prepare(size_t n) {
    buf.resize(n);
    return buf.data();
  }
  void discard() { buf.clear(); }
};

void thread_reader(testing::HeapRing& ring, uint32_t slot, Role role, const Payloads& payloads, const Control& ctl,
                   ReaderResult& out) {
  vipc::msgq::RingReader reader(ring.view(), slot);
  reader.reset();
  const bool conflate = role == Role::kConflate;
  StreamChecker chk(payloads, conflate, role_name(role));
  VecSinkReuse sink;
  for (;;) {
    // done first: an empty read after seeing it means everything was read.
    const bool done = ctl.done.load(std::memory_order_acquire) != 0;
    if (reader.read(sink, conflate) == vipc::msgq::ReadStatus::kMessage) {
      chk.on_message(sink.buf.data(), sink.buf.size(), reader.resets());
      if (role == Role::kSlow) lag_behind(ctl, ring.data_size());
      continue;
    }
    if (done) break;
    std::this_thread::yield();
  }
  record(out, chk, reader.resets());
}

// Lets fast readers catch up now and then, so the run alternates between
// lapping everyone and lossless delivery; never waits for the slow reader.
void wait_for_fast_readers(testing::HeapRing& ring, const std::vector<Role>& roles) {
  const int64_t give_up = vipc::common::monotonic_ns() + 20'000'000;
  for (uint32_t i = 0; i < roles.size(); i++) {
    if (roles[i] == Role::kSlow) continue;
    const vipc::msgq::ReaderSlot& slot = ring.slot(i);
    while (vipc::common::monotonic_ns() < give_up &&
           slot.read_pointer.load(std::memory_order_acquire) !=
               ring.header()->write_pointer.load(std::memory_order_acquire) &&
           slot.valid.load(std::memory_order_acquire) != 0) {
      std::this_thread::yield();
    }
  }
}

void run_threads(const Options& opt) {
  testing::HeapRing ring(static_cast<uint32_t>(opt.ring));
  const Payloads payloads(opt.seed, vipc::msgq::max_message_size(opt.ring));
  const std::vector<Role> roles = {Role::kFast, Role::kFast, Role::kConflate, Role::kSlow};
  Control ctl;
  std::vector<ReaderResult> results(roles.size());

  for (uint32_t i = 0; i < roles.size(); i++) {
    ring.header()->reader_mask.fetch_or(uint64_t{1} << i, std::memory_order_seq_cst);
  }
  std::vector<std::thread> threads;
  for (uint32_t i = 0; i < roles.size(); i++) {
    threads.emplace_back(thread_reader, std::ref(ring), i, roles[i], std::cref(payloads), std::cref(ctl),
                         std::ref(results[i]));
  }

  vipc::msgq::RingWriter writer(ring.view());
  std::vector<char> msg(payloads.max_size());
  const int64_t end = vipc::common::monotonic_ns() + static_cast<int64_t>(opt.seconds * 1e9);
  uint64_t seq = 0;
  while (vipc::common::monotonic_ns() < end) {
    const size_t n = payloads.size_of(seq);
    payloads.fill(seq, msg.data(), n);
    writer.write(msg.data(), n);
    ctl.bytes_sent.fetch_add(n, std::memory_order_release);
    seq++;
    if (seq % 256 == 0) wait_for_fast_readers(ring, roles);
    if (seq % 4 == 0) std::this_thread::yield();  // two cores, five threads: give readers a turn
  }
  ctl.sent.store(seq, std::memory_order_relaxed);
  ctl.done.store(1, std::memory_order_release);
  for (auto& t : threads) t.join();

  std::vector<ReaderResult*> ptrs;
  for (auto& r : results) ptrs.push_back(&r);
  report("threads", roles, ptrs, seq);
  check_outcome(roles, ptrs, seq);
}

// ---- processes: a segment file, Publisher / Subscriber ----

struct SharedState {
  Control ctl;
  ReaderResult results[8];
};

vipc::msgq::SegmentSpec segment_spec(const testing::TempDir& dir, size_t ring) {
  vipc::msgq::SegmentSpec spec;
  spec.dir = dir.path();
  spec.basename = "msgq@stress";
  spec.data_size = ring;  // readers pass it too, so whoever creates the file picks the same size
  return spec;
}

void process_reader(const vipc::msgq::SegmentSpec& spec, Role role, const Payloads& payloads, SharedState& shared,
                    ReaderResult& out) {
  const bool conflate = role == Role::kConflate;
  auto sub = std::make_shared<vipc::msgq::Subscriber>(spec, conflate);
  std::unique_ptr<vipc::msgq::Poller> poller;
  if (role == Role::kFastPoller) {
    poller = std::make_unique<vipc::msgq::Poller>();
    poller->add(sub);
  }
  shared.ctl.ready.fetch_add(1, std::memory_order_release);
  StreamChecker chk(payloads, conflate, role_name(role));
  VecSinkReuse sink;
  std::vector<size_t> ready;
  for (;;) {
    const bool done = shared.ctl.done.load(std::memory_order_acquire) != 0;
    if (sub->try_read(sink)) {
      chk.on_message(sink.buf.data(), sink.buf.size(), sub->resets());
      if (role == Role::kSlow) lag_behind(shared.ctl, spec.data_size);
      if (role == Role::kVictim) record(out, chk, sub->resets());  // it will not get to report at the end
      continue;
    }
    if (done) break;
    if (poller) {
      poller->poll(20'000'000, ready);
    } else {
      sub->wait(vipc::common::deadline_after(20'000'000));
    }
  }
  record(out, chk, sub->resets());
}

void process_writer(const vipc::msgq::SegmentSpec& spec, const Payloads& payloads, SharedState& shared, size_t readers,
                    double seconds) {
  vipc::msgq::Publisher pub(spec);
  const int64_t attach_deadline = vipc::common::monotonic_ns() + 10'000'000'000;
  while (shared.ctl.ready.load(std::memory_order_acquire) < readers && vipc::common::monotonic_ns() < attach_deadline) {
    usleep(1000);
  }
  CHECK_EQ(shared.ctl.ready.load(std::memory_order_acquire), readers);
  std::vector<char> msg(payloads.max_size());
  const int64_t end = vipc::common::monotonic_ns() + static_cast<int64_t>(seconds * 1e9);
  uint64_t seq = 0;
  while (vipc::common::monotonic_ns() < end) {
    const size_t n = payloads.size_of(seq);
    if (seq % 2 == 0) {
      payloads.fill(seq, msg.data(), n);
      pub.send(msg.data(), n);
    } else {  // zero-copy path: fill the ring in place
      payloads.fill(seq, reinterpret_cast<char*>(pub.loan(n)), n);
      pub.commit(n);
    }
    shared.ctl.bytes_sent.fetch_add(n, std::memory_order_release);
    seq++;
    if (seq % 256 == 0) usleep(2000);  // let the fast readers catch up now and then
    if (seq % 1024 == 0) {             // both wake modes, switched while readers sleep and wake
      pub.set_wake_mode(pub.wake_mode() == vipc::msgq::WakeMode::kAll ? vipc::msgq::WakeMode::kHandoff
                                                                      : vipc::msgq::WakeMode::kAll);
    }
  }
  shared.ctl.sent.store(seq, std::memory_order_relaxed);
  shared.ctl.done.store(1, std::memory_order_release);
}

template <class F>
pid_t spawn(F body, unsigned watchdog_s) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    // Die with the parent (a failed check there aborts it) instead of
    // lingering on the driver's output pipe until the watchdog fires.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) std::_Exit(1);
    alarm(watchdog_s);
    body();
    std::exit(0);  // after body's objects are gone: they detach from the segment
  }
  return pid;
}

void expect_clean_exit(pid_t pid, const char* who) {
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    check::failed(__FILE__, __LINE__,
                  std::string(who) + " process failed: " +
                      (WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                                           : "exit " + std::to_string(WEXITSTATUS(status))));
  }
}

void run_processes(const Options& opt) {
  testing::TempDir dir;
  const vipc::msgq::SegmentSpec spec = segment_spec(dir, opt.ring);
  const Payloads payloads(opt.seed, vipc::msgq::max_message_size(opt.ring));
  const std::vector<Role> roles = {Role::kFast, Role::kFastPoller, Role::kConflate, Role::kSlow, Role::kVictim};
  void* mem = mmap(nullptr, sizeof(SharedState), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  CHECK(mem != MAP_FAILED);
  auto* shared = new (mem) SharedState();
  const unsigned watchdog = static_cast<unsigned>(opt.seconds) + 60;

  std::vector<pid_t> readers;
  for (size_t i = 0; i < roles.size(); i++) {
    readers.push_back(
        spawn([&, i] { process_reader(spec, roles[i], payloads, *shared, shared->results[i]); }, watchdog));
  }
  const pid_t writer = spawn([&] { process_writer(spec, payloads, *shared, roles.size(), opt.seconds); }, watchdog);

  // Kill the victim a third of the way in, without letting it detach: the
  // writer must not care, and its slot and presence die with it.
  const int64_t attach_deadline = vipc::common::monotonic_ns() + 10'000'000'000;
  while (shared->ctl.ready.load(std::memory_order_acquire) < roles.size() &&
         vipc::common::monotonic_ns() < attach_deadline) {
    usleep(1000);
  }
  usleep(static_cast<useconds_t>(opt.seconds * 1e6 / 3));
  const size_t victim = roles.size() - 1;
  CHECK(kill(readers[victim], SIGKILL) == 0);
  int status = 0;
  CHECK(waitpid(readers[victim], &status, 0) == readers[victim]);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

  expect_clean_exit(writer, "writer");
  for (size_t i = 0; i < victim; i++) expect_clean_exit(readers[i], role_name(roles[i]));

  std::vector<ReaderResult*> ptrs;
  for (size_t i = 0; i < roles.size(); i++) ptrs.push_back(&shared->results[i]);
  const uint64_t sent = shared->ctl.sent.load();
  report("processes", roles, ptrs, sent);
  check_outcome(roles, ptrs, sent);
  CHECK(dir.entries().empty());  // the last process out unlinked the segment, the killed one included
  shared->~SharedState();
  munmap(mem, sizeof(SharedState));
}

Options parse(int argc, char** argv) {
  Options opt;
  opt.seed = static_cast<uint64_t>(vipc::common::realtime_ns());
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) check::failed(__FILE__, __LINE__, a + " needs a value");
      return argv[++i];
    };
    if (a == "threads" || a == "processes" || a == "all") {
      opt.mode = a;
    } else if (a == "--seconds") {
      opt.seconds = std::atof(value());
    } else if (a == "--seed") {
      opt.seed = std::strtoull(value(), nullptr, 0);
    } else if (a == "--ring") {
      opt.ring = std::strtoull(value(), nullptr, 0);
    } else {
      std::fprintf(stderr, "usage: %s [threads|processes|all] [--seconds S] [--seed N] [--ring BYTES]\n", argv[0]);
      std::exit(2);
    }
  }
  CHECK(opt.seconds > 0 && opt.seconds < 600);
  CHECK(opt.ring >= vipc::msgq::kMinDataSize && opt.ring % vipc::msgq::kCacheLine == 0);
  return opt;
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  const bool both = opt.mode == "all";
  alarm(static_cast<unsigned>(opt.seconds * (both ? 2 : 1)) + 60);  // watchdog: never hang the suite
  std::printf("seed %llu, ring %zu bytes, %.1f s per mode (rerun: --seed %llu)\n",
              static_cast<unsigned long long>(opt.seed), opt.ring, opt.seconds,
              static_cast<unsigned long long>(opt.seed));
  if (both || opt.mode == "threads") run_threads(opt);
  if (both || opt.mode == "processes") run_processes(opt);
  std::printf("stress passed\n");
  return 0;
}
