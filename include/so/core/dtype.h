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

// IEEE binary16 (a source dtype of imported weights) widened exactly: every fp16 value,
// subnormals included, is an fp32 value; Inf stays Inf and NaN keeps its payload.
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (mant << 13);  // rebias 15 -> 127
  } else if (mant == 0) {
    u = sign;
  } else {
    // Subnormal mant * 2^-24: shift the leading one into the implicit bit, lowering the exponent.
    uint32_t e = 113;  // biased fp32 exponent of 2^-14
    while (!(mant & 0x400u)) {
      mant <<= 1;
      --e;
    }
    u = sign | (e << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Uniform load/store used by templated kernels: compute in fp32 whatever the storage.
inline float to_f32(float x) { return x; }
inline float to_f32(bf16 x) { return bf16_to_f32(x); }
template <typename T>
T from_f32(float x);
template <>
inline float from_f32<float>(float x) {
  return x;
}
template <>
inline bf16 from_f32<bf16>(float x) {
  return f32_to_bf16(x);
}

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::F32;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::BF16;
}

}  // namespace so
