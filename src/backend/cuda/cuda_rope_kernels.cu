// Rotary position embedding, Hugging Face "rotate_half" convention, in place on x[T, heads, head_dim]:
//   x1' = x1 cos - x2 sin,  x2' = x2 cos + x1 sin   (x1 = first half, x2 = second half; inverse: -sin).
// Pair i turns by position * inv_freq[i] (the model's fp64 frequency table), cos and sin scaled by
// attention_scale. A block per few tokens: their cos/sin tables are computed once into shared
// memory (angles in double, as the CPU computes them, then rounded to float), then applied to
// every head. The rotation uses explicitly rounded multiplies and adds (no FMA contraction), the
// CPU's operation order.
#include "cuda_bf16.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_launch.cuh"

namespace so::cuda {

namespace {

// A block takes `tokens` tokens at a time (blockDim.x / half of them, at least one): all its threads
// compute their cos/sin tables into shared memory at once, then rotate every head of them. One token
// per block left most threads idle while a few computed the table, and paid two barriers per token.
// Dynamic shared memory: per token, cos[half] then sin[half].
template <typename T, int N>
__global__ void rope_kernel(T* x, const int32_t* positions, int64_t T_, int64_t heads, int64_t head_dim,
                            const double* inv_freq, double attention_scale, bool inverse, int64_t tokens) {
  extern __shared__ float table[];
  const int64_t half = head_dim / 2;
  const int64_t groups = half / N;  // N divides half
  for (int64_t t0 = blockIdx.x * tokens; t0 < T_; t0 += static_cast<int64_t>(gridDim.x) * tokens) {
    const int64_t here = T_ - t0 < tokens ? T_ - t0 : tokens;
    __syncthreads();  // the previous tokens' rotations have read the table
    for (int64_t e = threadIdx.x; e < here * half; e += blockDim.x) {
      const int64_t k = e / half, i = e % half;
      const double pos = static_cast<double>(positions[t0 + k]);
      double s, c;
      ::sincos(pos * inv_freq[i], &s, &c);
      table[k * head_dim + i] = static_cast<float>(attention_scale * c);
      table[k * head_dim + half + i] = static_cast<float>(inverse ? -attention_scale * s : attention_scale * s);
    }
    __syncthreads();
    for (int64_t j = threadIdx.x; j < here * heads * groups; j += blockDim.x) {
      const int64_t k = j / (heads * groups), h = (j / groups) % heads, i = (j % groups) * N;
      const float* cs = table + k * head_dim;
      const float* sn = cs + half;
      T* v = x + ((t0 + k) * heads + h) * head_dim;
      float x1[N], x2[N], y1[N], y2[N];
      load_f32<N>(x1, v, i, half);
      load_f32<N>(x2, v + half, i, half);
#pragma unroll
      for (int q = 0; q < N; ++q) {
        const float c = cs[i + q], s = sn[i + q];
        y1[q] = __fsub_rn(__fmul_rn(x1[q], c), __fmul_rn(x2[q], s));
        y2[q] = __fadd_rn(__fmul_rn(x2[q], c), __fmul_rn(x1[q], s));
      }
      store_f32<N>(v, y1, i, half);
      store_f32<N>(v + half, y2, i, half);
    }
  }
}

}  // namespace

void launch_rope(cudaStream_t stream, void* x, const int32_t* positions, int64_t T, int64_t heads, int64_t head_dim,
                 const double* inv_freq, float attention_scale, bool inverse, DType dt) {
  SO_CHECK(head_dim % 2 == 0, "rope: head_dim ", head_dim, " must be even");
  // The cos/sin table must fit the default 48 KiB of dynamic shared memory.
  SO_CHECK(head_dim <= 8192, "rope: head_dim ", head_dim, " above the supported 8192");
  if (T == 0 || heads == 0 || head_dim == 0) return;
  const int64_t half = head_dim / 2;
  const int64_t tokens = std::max<int64_t>(1, kBlockThreads / half);
  const size_t smem = static_cast<size_t>(tokens * head_dim) * sizeof(float);
  dispatch_dtype(dt, [&](auto t) {
    using X = decltype(t);
    with_vector_width<kVec16<X>>(aligned16(x) && half % kVec16<X> == 0, [&](auto vw) {
      constexpr int N = decltype(vw)::value;
      rope_kernel<X, N><<<grid_for((T + tokens - 1) / tokens), kBlockThreads, smem, stream>>>(
          static_cast<X*>(x), positions, T, heads, head_dim, inv_freq, attention_scale, inverse, tokens);
      SO_CUDA_CHECK(cudaGetLastError());
    });
  });
}

}  // namespace so::cuda
