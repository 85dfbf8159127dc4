// The compatibility and public-API tests' additions to the one harness (../check.h,
// standard headers only: these tests build against the installed headers alone).
#pragma once

#include <cstdlib>
#include <string>

#include "../check.h"

inline int run_compat_tests() { return check::run_all(0, nullptr); }

// A topic name no other test uses (the run prefix, MSGQ_PREFIX, isolates runs).
inline std::string random_sock() {
  static unsigned n = 0;
  return "compat_" + std::to_string(std::rand() % 100000) + "_" + std::to_string(n++);
}
