// The compatibility tests' harness: they build against the installed headers
// only (no internals), so they carry their own CHECK and TEST.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CHECK(cond)                                                                  \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

struct CompatTest {
  const char* name;
  void (*fn)();
};

inline std::vector<CompatTest>& compat_tests() {
  static std::vector<CompatTest> all;
  return all;
}

#define TEST(name)                                                    \
  static void name();                                                 \
  static const bool name##_registered = [] {                          \
    compat_tests().push_back({#name, name});                          \
    return true;                                                      \
  }();                                                                \
  static void name()

inline int run_compat_tests() {
  for (const CompatTest& t : compat_tests()) {
    std::printf("[ RUN  ] %s\n", t.name);
    std::fflush(stdout);
    t.fn();
    std::printf("[  OK  ] %s\n", t.name);
  }
  std::printf("%zu test(s) passed\n", compat_tests().size());
  return 0;
}

// A topic name no other test uses (the run prefix, MSGQ_PREFIX, isolates runs).
inline std::string random_sock() {
  static unsigned n = 0;
  return "compat_" + std::to_string(std::rand() % 100000) + "_" + std::to_string(n++);
}
