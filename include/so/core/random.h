#pragma once
// Counter-based random numbers: value i of stream s under seed k is a pure function of (k, s, i),
// so initialisation and sampling do not depend on how work is split across ranks or threads.
#include <cmath>
#include <cstdint>

namespace so {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline uint64_t random_u64(uint64_t seed, uint64_t stream, uint64_t i) {
  return splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ i);
}

// Uniform in (0, 1): never 0, so log() is safe.
inline double random_uniform(uint64_t seed, uint64_t stream, uint64_t i) {
  return (static_cast<double>(random_u64(seed, stream, i) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Standard normal (Box-Muller on two independent counters).
inline double random_normal(uint64_t seed, uint64_t stream, uint64_t i) {
  const double u1 = random_uniform(seed, stream, 2 * i);
  const double u2 = random_uniform(seed, stream, 2 * i + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace so
