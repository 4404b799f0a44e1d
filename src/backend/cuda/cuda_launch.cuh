#pragma once
// Host-side launch helpers shared by the kernel files: storage-dtype dispatch, the vector width a
// launch may use, and grid sizes for grid-stride loops.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "so/core/dtype.h"

namespace so::cuda {

// Threads per block of the elementwise and row kernels (a multiple of the warp size).
constexpr int kBlockThreads = 256;

// Calls f(T{}) with T the storage type of dt (float or so::bf16).
template <typename F>
void dispatch_dtype(DType dt, F&& f) {
  if (dt == DType::F32)
    f(float{});
  else
    f(bf16{});
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Calls f(std::integral_constant<int, N>) with N = kWide when `wide` (every pointer of the launch is
// 16-byte aligned and the row strides keep it so), else N = 1: the kernel's group width.
template <int kWide, typename F>
void with_vector_width(bool wide, F&& f) {
  if (wide)
    f(std::integral_constant<int, kWide>{});
  else
    f(std::integral_constant<int, 1>{});
}

// Elements of T in one 16-byte vector.
template <typename T>
constexpr int kVec16 = static_cast<int>(16 / sizeof(T));

// Blocks for a grid-stride loop over `items` units of work: one block per unit up to a cap that
// fills an H100 many times over and stays far inside gridDim.x's limit.
inline unsigned grid_for(int64_t items) {
  constexpr int64_t kMaxBlocks = 65535;
  return static_cast<unsigned>(std::clamp<int64_t>(items, 1, kMaxBlocks));
}

// Blocks of kBlockThreads threads, each thread taking groups of n_per_thread elements, over n.
inline unsigned grid_for_elements(int64_t n, int n_per_thread) {
  const int64_t per_block = static_cast<int64_t>(kBlockThreads) * n_per_thread;
  return grid_for((n + per_block - 1) / per_block);
}

}  // namespace so::cuda
