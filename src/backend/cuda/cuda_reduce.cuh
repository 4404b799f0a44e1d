#pragma once
// Warp and block reductions in a fixed tree order, so a reduction gives the same bits on every run
// (the determinism the trainer promises; no atomics anywhere). Blocks must be a multiple of 32 threads.
#include <cuda_runtime.h>

namespace so::cuda {

struct SumOp {
  template <typename V>
  __device__ __forceinline__ V operator()(V a, V b) const {
    return a + b;
  }
};

// fmaxf ignores a NaN operand, as the CPU's std::max(mx, z) does (the NaN still reaches the sum).
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Butterfly over the warp: every lane ends with the reduction of all 32 values. V is float or double
// (what __shfl_xor_sync moves).
template <typename V, typename Op>
__device__ __forceinline__ V warp_reduce(V v, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Reduction over the block, returned to every thread. Every thread of the block must call it
// (it synchronises); it may be called repeatedly in one kernel.
template <typename V, typename Op>
__device__ V block_reduce(V v, Op op, V identity) {
  __shared__ V warp_results[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_reduce(v, op);
  if (lane == 0) warp_results[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = warp_reduce(lane < warps ? warp_results[lane] : identity, op);
    if (lane == 0) warp_results[0] = v;
  }
  __syncthreads();
  const V result = warp_results[0];
  __syncthreads();  // the next call may overwrite warp_results
  return result;
}

template <typename V>
__device__ __forceinline__ V block_sum(V v) {
  return block_reduce(v, SumOp{}, V(0));
}

}  // namespace so::cuda
