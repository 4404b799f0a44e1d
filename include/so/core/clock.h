#pragma once
// One clock for every timestamp the engine takes (host spans, CPU-backend events, traces).
#include <chrono>

namespace so {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace so
