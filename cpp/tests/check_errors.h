// CHECK_THROWS_KIND for the core's tests (check.h stays free of the core's headers).
#pragma once

#include <string>

#include "check.h"
#include "common/errors.h"

// The statement must throw vipc::common::Error of the given kind.
#define CHECK_THROWS_KIND(stmt, error_kind)                                                           \
  do {                                                                                                \
    bool check_threw_ = false;                                                                        \
    try {                                                                                             \
      stmt;                                                                                           \
    } catch (const vipc::common::Error& e) {                                                          \
      check_threw_ = true;                                                                            \
      if (e.kind() != (error_kind))                                                                   \
        ::check::failed(__FILE__, __LINE__, #stmt " threw the wrong kind: " + std::string(e.what())); \
    }                                                                                                 \
    if (!check_threw_) ::check::failed(__FILE__, __LINE__, #stmt " did not throw " #error_kind);      \
  } while (0)
