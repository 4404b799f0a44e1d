#pragma once
// Device side of the storage dtypes: fp32 <-> bf16 exactly as so::f32_to_bf16 / bf16_to_f32 (round
// to nearest even, NaN kept with its quiet bit forced), and loads/stores of N consecutive elements
// converted to/from fp32, as one vector access (16 bytes at most) where the whole group is in range.
// Kernels are templated on the storage type T (float or so::bf16) and on N; the host launches the
// N > 1 flavour only when every pointer is 16-byte aligned (vector_width in cuda_launch.cuh).
//
// The names differ from so::to_f32/from_f32 on purpose: those are host functions in namespace so,
// which argument-dependent lookup on so::bf16 would otherwise make ambiguous with these.
#include <cuda_runtime.h>

#include <cstdint>

#include "so/core/dtype.h"

namespace so::cuda {

__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __uint_as_float(static_cast<uint32_t>(x.bits) << 16); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float x) {
  return bf16{f32_to_bf16_bits(x)};
}

// N elements of T as one aligned object, so a group load/store compiles to vector instructions.
template <typename T, int N>
struct alignas(N * sizeof(T) >= 16 ? 16 : N * sizeof(T)) Pack {
  T v[N];
};

// dst[k] = src[i + k] for i + k < n, 0 beyond n. The group is one vector access when it lies wholly
// inside [0, n) (src + i is then N-element aligned: callers step i by N from an aligned base).
template <int N, typename T>
__device__ __forceinline__ void load_f32(float (&dst)[N], const T* src, int64_t i, int64_t n) {
  if (i + N <= n) {
    const Pack<T, N> p = *reinterpret_cast<const Pack<T, N>*>(src + i);
#pragma unroll
    for (int k = 0; k < N; ++k) dst[k] = to_float(p.v[k]);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) dst[k] = i + k < n ? to_float(src[i + k]) : 0.0f;
  }
}

// dst[i + k] = val[k] rounded to T, for i + k < n only.
template <int N, typename T>
__device__ __forceinline__ void store_f32(T* dst, const float (&val)[N], int64_t i, int64_t n) {
  if (i + N <= n) {
    Pack<T, N> p;
#pragma unroll
    for (int k = 0; k < N; ++k) p.v[k] = from_float<T>(val[k]);
    *reinterpret_cast<Pack<T, N>*>(dst + i) = p;
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k)
      if (i + k < n) dst[i + k] = from_float<T>(val[k]);
  }
}

}  // namespace so::cuda
