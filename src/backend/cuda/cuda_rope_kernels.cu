// Rotary position embedding, Hugging Face "rotate_half" convention, in place on x[T, heads, head_dim]:
//   x1' = x1 cos - x2 sin,  x2' = x2 cos + x1 sin   (x1 = first half, x2 = second half; inverse: -sin).
// One block per token: its cos/sin table is computed once into shared memory (angles in double,
// as the CPU computes them, then rounded to float), then applied to every head. The rotation uses
// explicitly rounded multiplies and adds (no FMA contraction), the CPU's operation order.
#include "cuda_bf16.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_launch.cuh"

namespace so::cuda {

namespace {

// Dynamic shared memory: cos[half] then sin[half].
template <typename T, int N>
__global__ void rope_kernel(T* x, const int32_t* positions, int64_t T_, int64_t heads, int64_t head_dim, float theta,
                            bool inverse) {
  extern __shared__ float table[];
  const int64_t half = head_dim / 2;
  float* cs = table;
  float* sn = table + half;
  const int64_t groups = half / N;  // N divides half
  for (int64_t t = blockIdx.x; t < T_; t += gridDim.x) {
    __syncthreads();  // the previous token's rotations have read the table
    const double pos = static_cast<double>(positions[t]);
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
      const double inv_freq =
          1.0 / ::pow(static_cast<double>(theta), static_cast<double>(2 * i) / static_cast<double>(head_dim));
      double s, c;
      ::sincos(pos * inv_freq, &s, &c);
      cs[i] = static_cast<float>(c);
      sn[i] = static_cast<float>(inverse ? -s : s);
    }
    __syncthreads();
    for (int64_t j = threadIdx.x; j < heads * groups; j += blockDim.x) {
      const int64_t h = j / groups, i = (j % groups) * N;
      T* v = x + (t * heads + h) * head_dim;
      float x1[N], x2[N], y1[N], y2[N];
      load_f32<N>(x1, v, i, half);
      load_f32<N>(x2, v + half, i, half);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const float c = cs[i + k], s = sn[i + k];
        y1[k] = __fsub_rn(__fmul_rn(x1[k], c), __fmul_rn(x2[k], s));
        y2[k] = __fadd_rn(__fmul_rn(x2[k], c), __fmul_rn(x1[k], s));
      }
      store_f32<N>(v, y1, i, half);
      store_f32<N>(v + half, y2, i, half);
    }
  }
}

}  // namespace

void launch_rope(cudaStream_t stream, void* x, const int32_t* positions, int64_t T, int64_t heads, int64_t head_dim,
                 float theta, bool inverse, DType dt) {
  SO_CHECK(head_dim % 2 == 0, "rope: head_dim ", head_dim, " must be even");
  // The cos/sin table must fit the default 48 KiB of dynamic shared memory.
  SO_CHECK(head_dim <= 8192, "rope: head_dim ", head_dim, " above the supported 8192");
  if (T == 0 || heads == 0 || head_dim == 0) return;
  const int64_t half = head_dim / 2;
  const size_t smem = static_cast<size_t>(head_dim) * sizeof(float);
  dispatch_dtype(dt, [&](auto t) {
    using X = decltype(t);
    with_vector_width<kVec16<X>>(aligned16(x) && half % kVec16<X> == 0, [&](auto vw) {
      constexpr int N = decltype(vw)::value;
      rope_kernel<X, N><<<grid_for(T), kBlockThreads, smem, stream>>>(static_cast<X*>(x), positions, T, heads,
                                                                      head_dim, theta, inverse);
      SO_CUDA_CHECK(cudaGetLastError());
    });
  });
}

}  // namespace so::cuda
