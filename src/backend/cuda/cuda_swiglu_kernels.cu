// SwiGLU activation, elementwise: out = silu(gate) * up, and its gradient. Each thread takes N-element
// groups (one 16-byte vector per array when aligned), grid-stride.
#include "cuda_bf16.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_launch.cuh"

namespace so::cuda {

namespace {

template <typename T, int N>
__global__ void swiglu_forward_kernel(T* out, const T* gate, const T* up, int64_t n) {
  for (int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * N; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x * N) {
    float g[N], u[N], o[N];
    load_f32<N>(g, gate, i, n);
    load_f32<N>(u, up, i, n);
#pragma unroll
    for (int k = 0; k < N; ++k) o[k] = g[k] / (1.0f + expf(-g[k])) * u[k];
    store_f32<N>(out, o, i, n);
  }
}

// sig = sigmoid(g): d silu(g)/dg = sig * (1 + g * (1 - sig)).
template <typename T, int N>
__global__ void swiglu_backward_kernel(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n) {
  for (int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * N; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x * N) {
    float g[N], u[N], dy[N], dg[N], du[N];
    load_f32<N>(g, gate, i, n);
    load_f32<N>(u, up, i, n);
    load_f32<N>(dy, dout, i, n);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float sig = 1.0f / (1.0f + expf(-g[k]));
      dg[k] = dy[k] * u[k] * sig * (1.0f + g[k] * (1.0f - sig));
      du[k] = dy[k] * g[k] * sig;
    }
    store_f32<N>(dgate, dg, i, n);
    store_f32<N>(dup, du, i, n);
  }
}

}  // namespace

void launch_swiglu_forward(cudaStream_t stream, void* out, const void* gate, const void* up, int64_t n, DType dt) {
  if (n == 0) return;
  dispatch_dtype(dt, [&](auto t) {
    using X = decltype(t);
    with_vector_width<kVec16<X>>(aligned16(out) && aligned16(gate) && aligned16(up), [&](auto vw) {
      constexpr int N = decltype(vw)::value;
      swiglu_forward_kernel<X, N><<<grid_for_elements(n, N), kBlockThreads, 0, stream>>>(
          static_cast<X*>(out), static_cast<const X*>(gate), static_cast<const X*>(up), n);
      SO_CUDA_CHECK(cudaGetLastError());
    });
  });
}

void launch_swiglu_backward(cudaStream_t stream, void* dgate, void* dup, const void* dout, const void* gate,
                            const void* up, int64_t n, DType dt) {
  if (n == 0) return;
  dispatch_dtype(dt, [&](auto t) {
    using X = decltype(t);
    const bool wide = aligned16(dgate) && aligned16(dup) && aligned16(dout) && aligned16(gate) && aligned16(up);
    with_vector_width<kVec16<X>>(wide, [&](auto vw) {
      constexpr int N = decltype(vw)::value;
      swiglu_backward_kernel<X, N><<<grid_for_elements(n, N), kBlockThreads, 0, stream>>>(
          static_cast<X*>(dgate), static_cast<X*>(dup), static_cast<const X*>(dout), static_cast<const X*>(gate),
          static_cast<const X*>(up), n);
      SO_CUDA_CHECK(cudaGetLastError());
    });
  });
}

}  // namespace so::cuda
