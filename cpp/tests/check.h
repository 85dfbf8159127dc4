// The one C++ test harness (the core's tests, and the compatibility and public-API
// tests through compat/compat_check.h): CHECK macros that report file:line and abort
// (so a failure is a non-zero exit the driver sees, also inside forked children),
// TEST() registration, and a main that runs all tests or those named in argv. Standard
// headers only, so tests built against the installed headers alone can use it too;
// check_errors.h adds CHECK_THROWS_KIND for the core's error type.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace check {

[[noreturn]] inline void failed(const char* file, int line, const std::string& what) {
  std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", file, line, what.c_str());
  std::fflush(stderr);
  std::abort();
}

struct Test {
  const char* name;
  void (*fn)();
};

inline std::vector<Test>& registry() {
  static std::vector<Test> tests;
  return tests;
}

struct Register {
  Register(const char* name, void (*fn)()) { registry().push_back({name, fn}); }
};

// Runs every registered test, or only those whose names contain an argv filter.
inline int run_all(int argc, char** argv) {
  int ran = 0;
  for (const Test& t : registry()) {
    bool selected = argc < 2;
    for (int i = 1; i < argc; i++) selected = selected || std::strstr(t.name, argv[i]) != nullptr;
    if (!selected) continue;
    std::printf("[ RUN  ] %s\n", t.name);
    std::fflush(stdout);
    try {
      t.fn();
    } catch (const std::exception& e) {
      failed(__FILE__, __LINE__, std::string(t.name) + " threw: " + e.what());
    }
    std::printf("[  OK  ] %s\n", t.name);
    ran++;
  }
  if (ran == 0) failed(__FILE__, __LINE__, "no test matched the filter");
  std::printf("%d test(s) passed\n", ran);
  return 0;
}

}  // namespace check

#define CHECK(cond)                                          \
  do {                                                       \
    if (!(cond)) ::check::failed(__FILE__, __LINE__, #cond); \
  } while (0)

#define CHECK_EQ(a, b)                                                                                          \
  do {                                                                                                          \
    const auto check_a_ = (a);                                                                                  \
    const auto check_b_ = (b);                                                                                  \
    if (!(check_a_ == check_b_)) {                                                                              \
      ::check::failed(                                                                                          \
          __FILE__, __LINE__,                                                                                   \
          std::string(#a " == " #b " (") + std::to_string(check_a_) + " vs " + std::to_string(check_b_) + ")"); \
    }                                                                                                           \
  } while (0)

#define TEST(name)                                               \
  static void name();                                            \
  static const ::check::Register name##_registered(#name, name); \
  static void name()
