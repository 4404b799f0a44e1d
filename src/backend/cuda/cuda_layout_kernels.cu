// Layout moves around the sequence-parallel all-to-alls: block transposes and GQA head replication.
// The copies are row gathers (cuda_row_gather.cuh); the replication's reverse sums the copies of a
// head in copy order in fp32, as the CPU does, so it is bitwise the CPU's result.
#include "cuda_bf16.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_launch.cuh"
#include "cuda_row_gather.cuh"

namespace so::cuda {

namespace {

// dst row j*d0 + i <- src row i*d1 + j.
struct TransposedRow {
  int64_t d0, d1;
  __device__ int64_t operator()(int64_t r) const { return (r % d0) * d1 + r / d0; }
};

// dst row (r*heads + h)*copies + c <- src row r*heads + h.
struct ReplicatedRow {
  int64_t copies;
  __device__ int64_t operator()(int64_t r) const { return r / copies; }
};

// out[rh][d] = sum over c in order of in[rh*copies + c][d], for rh over rows*heads; one thread per
// N-element group of an output head.
template <typename T, int N>
__global__ void sum_head_copies_kernel(T* out, const T* in, int64_t out_heads, int64_t copies, int64_t head_dim) {
  const int64_t groups_per_head = (head_dim + N - 1) / N;
  for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < out_heads * groups_per_head;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t rh = g / groups_per_head, d = (g % groups_per_head) * N;
    float acc[N], v[N];
#pragma unroll
    for (int k = 0; k < N; ++k) acc[k] = 0.0f;
    for (int64_t c = 0; c < copies; ++c) {
      load_f32<N>(v, in + (rh * copies + c) * head_dim, d, head_dim);
#pragma unroll
      for (int k = 0; k < N; ++k) acc[k] += v[k];
    }
    store_f32<N>(out + rh * head_dim, acc, d, head_dim);
  }
}

}  // namespace

void launch_transpose_blocks(cudaStream_t stream, void* dst, const void* src, int64_t d0, int64_t d1, int64_t inner,
                             DType dt) {
  launch_gather_rows(stream, dst, src, d0 * d1, static_cast<size_t>(inner) * dtype_size(dt), TransposedRow{d0, d1});
}

void launch_replicate_heads(cudaStream_t stream, void* out, const void* in, int64_t rows, int64_t heads, int64_t copies,
                            int64_t head_dim, bool reverse, DType dt) {
  if (!reverse) {
    launch_gather_rows(stream, out, in, rows * heads * copies, static_cast<size_t>(head_dim) * dtype_size(dt),
                       ReplicatedRow{copies});
    return;
  }
  const int64_t out_heads = rows * heads;
  if (out_heads == 0 || head_dim == 0) return;
  dispatch_dtype(dt, [&](auto t) {
    using X = decltype(t);
    with_vector_width<kVec16<X>>(aligned16(out) && aligned16(in) && head_dim % kVec16<X> == 0, [&](auto vw) {
      constexpr int N = decltype(vw)::value;
      const int64_t groups = out_heads * ((head_dim + N - 1) / N);
      sum_head_copies_kernel<X, N><<<grid_for_elements(groups, 1), kBlockThreads, 0, stream>>>(
          static_cast<X*>(out), static_cast<const X*>(in), out_heads, copies, head_dim);
      SO_CUDA_CHECK(cudaGetLastError());
    });
  });
}

}  // namespace so::cuda
