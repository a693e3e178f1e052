// What the native fuzz targets share: how an oracle fails, and error kinds by name.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "common.h"

namespace fuzz {

// Reports a failed oracle and aborts: libFuzzer then keeps the input as a crash.
[[noreturn]] inline void Fail(const std::string& why) {
  std::fprintf(stderr, "ORACLE FAILED: %s\n", why.c_str());
  std::abort();
}

// The name of an error kind ("protocol", "peer_lost", ...), as rdmadev/errors.py knows it.
inline std::string KindName(rdmadev::ErrorKind kind) {
  for (const auto& row : rdmadev::ErrorKindTable()) {
    if (row.second == static_cast<int>(kind)) return row.first;
  }
  return "?";
}

}  // namespace fuzz
