#include "common/process.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>

namespace vipc::common {
namespace {

// 0 until the first use. Relaxed is enough: every thread that reads it stores
// the same value (its own process's pid), and the fork handler runs in the
// child while it has a single thread.
std::atomic<pid_t> g_pid{0};

void refresh() { g_pid.store(getpid(), std::memory_order_relaxed); }

struct Registered {
  Registered() { pthread_atfork(nullptr, nullptr, refresh); }
};

}  // namespace

pid_t current_pid() {
  static Registered registered;  // the atfork handler, once, before the first read
  pid_t pid = g_pid.load(std::memory_order_relaxed);
  if (pid == 0) {
    refresh();
    pid = g_pid.load(std::memory_order_relaxed);
  }
  return pid;
}

}  // namespace vipc::common
