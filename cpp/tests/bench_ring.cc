// Ring micro-benchmark, two processes pinned to CPUs 0 and 1 when allowed:
//   (a) the floor: one-way latency of a bare cache-line ping-pong (an atomic
//       in shared memory);
//   (b) MSGQ: one-way latency of 64-byte messages, ping-pong over two topics
//       with busy-polling receivers (round trip / 2);
//   (c) 1 MiB messages: publish + receive throughput across the two processes
//       (flow-controlled so nothing is dropped) against a plain memcpy of
//       1 MiB in the same run.
// Results are reported as ratios to the baselines measured alongside them.
// Timings include one clock_gettime per round trip (vDSO, tens of ns).
//
// usage: bench_ring [--iters N] [--json]
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/clock.h"
#include "msgq/publisher.h"
#include "msgq/subscriber.h"
#include "test_support.h"

namespace {

constexpr size_t kSmall = 64;
constexpr size_t kLarge = size_t{1} << 20;
constexpr size_t kLargeRing = 8 * kLarge;  // room for the flow-control window below
constexpr uint64_t kWindow = 3;            // 1 MiB messages in flight: well under what the ring holds

struct alignas(64) Line {
  std::atomic<uint64_t> value{0};
  char pad[64 - sizeof(std::atomic<uint64_t>)];
};
static_assert(sizeof(Line) == 64, "one cache line each, so ping and pong do not share one");

// In an anonymous shared mapping, inherited by the forked child.
struct Shared {
  Line ping;      // parent writes (release), child spins on it (acquire)
  Line pong;      // child writes, parent spins
  Line received;  // throughput: messages the child has consumed (release)
  std::atomic<uint32_t> ready{0};
};

struct Percentiles {
  double p50 = 0, p99 = 0, p999 = 0;
};

Percentiles percentiles(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))]; };
  return {at(0.50), at(0.99), at(0.999)};
}

// The other process of the current measurement: the parent's spin loops watch it,
// so a child that died is a message and exit status, never a parent spinning forever.
pid_t g_peer = 0;
const char* g_phase = "start";
bool g_in_child = false;

// A run that cannot go on. The parent unwinds to main (so the segments'
// TempDir is removed) after killing the child; a child only exits: it must not
// run the destructors of what it shares with the parent.
struct GiveUp {};

[[noreturn]] void give_up(const std::string& why) {
  std::fprintf(stderr, "bench_ring: %s\n", why.c_str());
  if (g_in_child) std::exit(1);
  if (g_peer > 0) {
    kill(g_peer, SIGKILL);
    waitpid(g_peer, nullptr, 0);
    g_peer = 0;
  }
  throw GiveUp{};
}

// Pinning only when both CPUs are ours to use; decided once, before the parent
// pins itself (its children inherit that narrower mask).
bool can_pin() {
  cpu_set_t allowed;
  return sched_getaffinity(0, sizeof(allowed), &allowed) == 0 && CPU_ISSET(0, &allowed) && CPU_ISSET(1, &allowed);
}
const bool kCanPin = can_pin();

bool pin(int cpu) {
  if (!kCanPin) return false;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  return sched_setaffinity(0, sizeof(one), &one) == 0;
}

// Runs `child` in a forked process pinned to CPU 1 (the caller is on CPU 0).
template <class F>
pid_t fork_child(F child) {
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) give_up(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);   // never outlive a parent that gave up
    if (getppid() == 1) std::_Exit(1);  // it gave up before the line above took effect
    g_peer = 0;                         // the child's loops watch only their deadline
    g_in_child = true;
    pin(1);
    child();
    std::exit(0);
  }
  g_peer = pid;
  return pid;
}

void join(pid_t pid) {
  g_peer = 0;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    give_up("child process failed (status " + std::to_string(status) + ")");
  }
}

// Every 64k spins (well under a millisecond): is the child still there, and is
// the measurement within kSpinLimitNs? A child that stopped answering (killed,
// crashed, or starved of its CPU by other work) ends the run with a reason.
constexpr int64_t kSpinLimitNs = int64_t{60} * 1000 * 1000 * 1000;

// What the kernel says the process is doing: its state and where it sleeps.
std::string describe(pid_t pid) {
  auto slurp = [](const std::string& path) {
    std::string text;
    if (FILE* f = std::fopen(path.c_str(), "r")) {
      char buf[512];
      const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
      text.assign(buf, n);
      std::fclose(f);
    }
    return text;
  };
  const std::string base = "/proc/" + std::to_string(pid);
  const std::string stat = slurp(base + "/stat");
  const size_t paren = stat.rfind(')');
  const std::string state = paren != std::string::npos && paren + 2 < stat.size() ? stat.substr(paren + 2, 1) : "?";
  return "pid " + std::to_string(pid) + " state " + state + ", waiting in " + slurp(base + "/wchan");
}

template <class Done>
void spin_until(Done done) {
  const int64_t deadline = vipc::common::monotonic_ns() + kSpinLimitNs;
  for (uint32_t spins = 1; !done(); spins++) {
    vipc::common::cpu_relax();
    if (spins % 65536 != 0) continue;
    if (g_peer > 0) {
      int status = 0;
      if (waitpid(g_peer, &status, WNOHANG) == g_peer) {
        g_peer = 0;  // reaped
        give_up(std::string(g_phase) + ": the child process ended early (" +
                (WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                                     : "exit status " + std::to_string(WEXITSTATUS(status))) +
                ")");
      }
    }
    if (vipc::common::monotonic_ns() > deadline) {
      give_up(std::string(g_phase) + ": no progress from the " + (g_peer > 0 ? "child" : "parent") + " process for " +
              std::to_string(kSpinLimitNs / 1000000000) + " s" + (g_peer > 0 ? " (" + describe(g_peer) + ")" : ""));
    }
  }
}

void wait_until(const std::atomic<uint32_t>& a, uint32_t value) {
  spin_until([&] { return a.load(std::memory_order_acquire) >= value; });
}

// Receives into a fixed buffer: nothing allocated in the timed loop.
struct FixedSink {
  std::vector<char> buf;
  explicit FixedSink(size_t capacity) : buf(capacity) {}
  size_t size = 0;
  char* prepare(size_t n) {
    size = n;
    return buf.data();
  }
  void discard() { size = 0; }
};

vipc::msgq::SegmentSpec topic(const testing::TempDir& dir, const char* name, size_t ring) {
  vipc::msgq::SegmentSpec spec;
  spec.dir = dir.path();
  spec.basename = name;
  spec.data_size = ring;
  return spec;
}

// (a) one-way latency of a cache line bouncing between the two CPUs.
Percentiles cacheline_pingpong(Shared& sh, uint64_t iters, uint64_t warmup) {
  g_phase = "cache-line ping-pong";
  sh.ping.value.store(0, std::memory_order_relaxed);
  sh.pong.value.store(0, std::memory_order_relaxed);
  const uint64_t total = warmup + iters;
  const pid_t child = fork_child([&] {
    for (uint64_t i = 1; i <= total; i++) {
      spin_until([&] { return sh.ping.value.load(std::memory_order_acquire) == i; });
      sh.pong.value.store(i, std::memory_order_release);
    }
  });
  std::vector<double> samples;
  samples.reserve(iters);
  for (uint64_t i = 1; i <= total; i++) {
    const int64_t t0 = vipc::common::monotonic_ns();
    sh.ping.value.store(i, std::memory_order_release);
    spin_until([&] { return sh.pong.value.load(std::memory_order_acquire) == i; });
    const int64_t t1 = vipc::common::monotonic_ns();
    if (i > warmup) samples.push_back((t1 - t0) / 2.0);
  }
  join(child);
  return percentiles(samples);
}

// (b) one-way latency of 64-byte messages: ping on one topic, echoed on another.
Percentiles msgq_pingpong(Shared& sh, const testing::TempDir& dir, uint64_t iters, uint64_t warmup) {
  g_phase = "msgq 64 B ping-pong";
  const vipc::msgq::SegmentSpec ping = topic(dir, "msgq@bench-ping", 64 * 1024);
  const vipc::msgq::SegmentSpec pong = topic(dir, "msgq@bench-pong", 64 * 1024);
  const uint64_t total = warmup + iters;
  sh.ready.store(0, std::memory_order_relaxed);
  const pid_t child = fork_child([&] {
    vipc::msgq::Subscriber in(ping, false);
    sh.ready.fetch_add(1, std::memory_order_release);
    wait_until(sh.ready, 2);  // both subscribers exist: nothing published is missed
    vipc::msgq::Publisher out(pong);
    FixedSink sink(kSmall);
    for (uint64_t i = 0; i < total; i++) {
      spin_until([&] { return in.try_read(sink); });
      out.send(sink.buf.data(), sink.size);
    }
  });
  std::vector<double> samples;
  samples.reserve(iters);
  {
    vipc::msgq::Subscriber in(pong, false);
    sh.ready.fetch_add(1, std::memory_order_release);
    wait_until(sh.ready, 2);
    vipc::msgq::Publisher out(ping);
    FixedSink sink(kSmall);
    char msg[kSmall] = {};
    for (uint64_t i = 0; i < total; i++) {
      std::memcpy(msg, &i, sizeof(i));
      const int64_t t0 = vipc::common::monotonic_ns();
      out.send(msg, sizeof(msg));
      spin_until([&] { return in.try_read(sink); });
      const int64_t t1 = vipc::common::monotonic_ns();
      uint64_t echoed = 0;
      std::memcpy(&echoed, sink.buf.data(), sizeof(echoed));
      if (sink.size != kSmall || echoed != i) {
        give_up("echo " + std::to_string(i) + " came back wrong");
      }
      if (i >= warmup) samples.push_back((t1 - t0) / 2.0);
    }
  }
  join(child);
  return percentiles(samples);
}

struct Throughput {
  uint64_t messages = 0;
  double msgq_gbps = 0, memcpy_gbps = 0;
};

// (c) 1 MiB publish + receive across the processes, at most kWindow messages
// ahead of the receiver so none is lapped; then memcpy of the same size.
Throughput large_messages(Shared& sh, const testing::TempDir& dir, uint64_t messages) {
  g_phase = "1 MiB throughput";
  const vipc::msgq::SegmentSpec spec = topic(dir, "msgq@bench-large", kLargeRing);
  sh.ready.store(0, std::memory_order_relaxed);
  sh.received.value.store(0, std::memory_order_relaxed);
  const pid_t child = fork_child([&] {
    vipc::msgq::Subscriber in(spec, false);
    sh.ready.fetch_add(1, std::memory_order_release);
    FixedSink sink(kLarge);
    for (uint64_t i = 1; i <= messages; i++) {
      spin_until([&] { return in.try_read(sink); });
      if (sink.size != kLarge || in.resets() != 0) {  // flow control failed: not a valid run
        std::fprintf(stderr, "bench_ring: 1 MiB message %llu: size %zu, %llu resets\n",
                     static_cast<unsigned long long>(i), sink.size, static_cast<unsigned long long>(in.resets()));
        std::exit(3);
      }
      sh.received.value.store(i, std::memory_order_release);
    }
  });
  Throughput t;
  t.messages = messages;
  std::vector<char> src(kLarge, 'x');
  {
    wait_until(sh.ready, 1);
    vipc::msgq::Publisher out(spec);
    const int64_t t0 = vipc::common::monotonic_ns();
    for (uint64_t i = 0; i < messages; i++) {
      spin_until([&] { return i < sh.received.value.load(std::memory_order_acquire) + kWindow; });
      src[0] = static_cast<char>(i);
      out.send(src.data(), src.size());
    }
    spin_until([&] { return sh.received.value.load(std::memory_order_acquire) >= messages; });
    t.msgq_gbps = static_cast<double>(messages * kLarge) / static_cast<double>(vipc::common::monotonic_ns() - t0);
  }
  join(child);

  std::vector<char> dst(kLarge);
  const uint64_t copies = std::max<uint64_t>(messages, 100);
  const int64_t t0 = vipc::common::monotonic_ns();
  for (uint64_t i = 0; i < copies; i++) {
    src[0] = static_cast<char>(i);  // a different copy each time, so none can be elided
    std::memcpy(dst.data(), src.data(), kLarge);
    asm volatile("" : : "r"(dst.data()) : "memory");
  }
  t.memcpy_gbps = static_cast<double>(copies * kLarge) / static_cast<double>(vipc::common::monotonic_ns() - t0);
  return t;
}

void print_json(uint64_t iters, bool pinned, const Percentiles& line, const Percentiles& ring, const Throughput& tp) {
  auto pct = [](const Percentiles& p) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), "{\"p50\": %.1f, \"p99\": %.1f, \"p999\": %.1f}", p.p50, p.p99, p.p999);
    return std::string(buf);
  };
  std::printf("{\"iters\": %llu, \"pinned\": %s,\n", static_cast<unsigned long long>(iters), pinned ? "true" : "false");
  std::printf(" \"cacheline_oneway_ns\": %s,\n", pct(line).c_str());
  std::printf(" \"msgq_64B_oneway_ns\": %s,\n", pct(ring).c_str());
  std::printf(" \"latency_ratio_p50\": %.3f,\n", ring.p50 / line.p50);
  std::printf(
      " \"throughput_1MiB\": {\"messages\": %llu, \"msgq_GBps\": %.3f, \"memcpy_GBps\": %.3f, \"ratio\": %.3f}}\n",
      static_cast<unsigned long long>(tp.messages), tp.msgq_gbps, tp.memcpy_gbps, tp.msgq_gbps / tp.memcpy_gbps);
}

void print_table(uint64_t iters, bool pinned, const Percentiles& line, const Percentiles& ring, const Throughput& tp) {
  std::printf("bench_ring: %llu round trips, %s\n\n", static_cast<unsigned long long>(iters),
              pinned ? "processes pinned to CPUs 0 and 1" : "not pinned (CPUs 0 and 1 not both allowed)");
  std::printf("%-36s %9s %9s %9s\n", "one-way latency", "p50 ns", "p99 ns", "p99.9 ns");
  std::printf("%-36s %9.1f %9.1f %9.1f\n", "cache-line ping-pong", line.p50, line.p99, line.p999);
  std::printf("%-36s %9.1f %9.1f %9.1f\n", "msgq 64 B, busy-poll receive", ring.p50, ring.p99, ring.p999);
  std::printf("%-36s %9.2f %9.2f %9.2f\n\n", "ratio msgq / cache line", ring.p50 / line.p50, ring.p99 / line.p99,
              ring.p999 / line.p999);
  std::printf("%-36s %9s\n", "1 MiB messages", "GB/s");
  std::printf("%-36s %9.2f\n", "msgq publish + receive (2 copies)", tp.msgq_gbps);
  std::printf("%-36s %9.2f\n", "memcpy", tp.memcpy_gbps);
  std::printf("%-36s %9.2f\n", "ratio msgq / memcpy", tp.msgq_gbps / tp.memcpy_gbps);
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t iters = 100000;
  bool json = false;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc) {
      iters = std::strtoull(argv[++i], nullptr, 0);
    } else if (a == "--json") {
      json = true;
    } else {
      std::fprintf(stderr, "usage: %s [--iters N] [--json]\n", argv[0]);
      return 2;
    }
  }
  if (iters == 0) iters = 1;
  alarm(600);  // a child that dies mid-handshake must not leave us spinning forever

  void* mem = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  auto* sh = new (mem) Shared();
  const bool pinned = pin(0);
  const uint64_t warmup = std::max<uint64_t>(iters / 10, 10);

  Percentiles line, ring;
  Throughput tp;
  try {
    testing::TempDir dir;  // removed on the way out, also when a measurement gives up
    line = cacheline_pingpong(*sh, iters, warmup);
    ring = msgq_pingpong(*sh, dir, iters, warmup);
    tp = large_messages(*sh, dir, std::max<uint64_t>(iters / 50, 10));
  } catch (const GiveUp&) {
    return 1;
  }
  if (json) {
    print_json(iters, pinned, line, ring, tp);
  } else {
    print_table(iters, pinned, line, ring, tp);
  }
  sh->~Shared();
  munmap(mem, sizeof(Shared));
  return 0;
}
