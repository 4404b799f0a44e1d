#pragma once
// Storage dtypes and the bf16 <-> fp32 conversions every backend must agree on bit for bit.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace so {

enum class DType : uint8_t { F32, BF16 };

inline size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }
inline const char* dtype_name(DType t) { return t == DType::F32 ? "fp32" : "bf16"; }

// bf16 as a distinct storage type, so templates can dispatch on it.
struct bf16 {
  uint16_t bits;
};

inline float bf16_to_f32(bf16 h) {
  uint32_t u = static_cast<uint32_t>(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays NaN (quiet bit forced so truncation cannot make it Inf).
inline bf16 f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x0040u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}

// Uniform load/store used by templated kernels: compute in fp32 whatever the storage.
inline float to_f32(float x) { return x; }
inline float to_f32(bf16 x) { return bf16_to_f32(x); }
template <typename T>
T from_f32(float x);
template <>
inline float from_f32<float>(float x) { return x; }
template <>
inline bf16 from_f32<bf16>(float x) { return f32_to_bf16(x); }

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() { return DType::F32; }
template <>
constexpr DType dtype_of<bf16>() { return DType::BF16; }

}  // namespace so
