// SwiGLU activation: out = silu(gate) * up, and its gradient, over rows of cols values whose gate
// and up rows are ld apart (elementwise: one row; after a [W_gate; W_up] GEMM: the halves of each
// [2 * cols] row). Each thread takes N-element groups within a row (one 16-byte vector per array
// when aligned), grid-stride.
#include "cuda_bf16.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_launch.cuh"

namespace so::cuda {

namespace {

// The g-th N-element group: its row, and its first column.
template <int N>
__device__ __forceinline__ void group_at(int64_t g, int64_t cols, int64_t& r, int64_t& c) {
  const int64_t per_row = (cols + N - 1) / N;
  r = g / per_row;
  c = (g - r * per_row) * N;
}

template <typename T, int N>
__global__ void swiglu_forward_kernel(T* out, const T* gate, const T* up, int64_t rows, int64_t cols, int64_t ld) {
  const int64_t groups = rows * ((cols + N - 1) / N);
  for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < groups;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t r, c;
    group_at<N>(g, cols, r, c);
    float gv[N], u[N], o[N];
    load_f32<N>(gv, gate + r * ld, c, cols);
    load_f32<N>(u, up + r * ld, c, cols);
#pragma unroll
    for (int k = 0; k < N; ++k) o[k] = gv[k] / (1.0f + expf(-gv[k])) * u[k];
    store_f32<N>(out + r * cols, o, c, cols);
  }
}

// sig = sigmoid(g): d silu(g)/dg = sig * (1 + g * (1 - sig)).
template <typename T, int N>
__global__ void swiglu_backward_kernel(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t rows,
                                       int64_t cols, int64_t ld) {
  const int64_t groups = rows * ((cols + N - 1) / N);
  for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < groups;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t r, c;
    group_at<N>(g, cols, r, c);
    float gv[N], u[N], dy[N], dg[N], du[N];
    load_f32<N>(gv, gate + r * ld, c, cols);
    load_f32<N>(u, up + r * ld, c, cols);
    load_f32<N>(dy, dout + r * cols, c, cols);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float sig = 1.0f / (1.0f + expf(-gv[k]));
      dg[k] = dy[k] * u[k] * sig * (1.0f + gv[k] * (1.0f - sig));
      du[k] = dy[k] * gv[k] * sig;
    }
    store_f32<N>(dgate + r * ld, dg, c, cols);
    store_f32<N>(dup + r * ld, du, c, cols);
  }
}

// Vector groups need every pointer aligned and every row stride (cols for out/dout, ld for the
// gate and up rows) a whole number of 16-byte vectors, unless there is one row.
template <typename X>
bool strides_keep_alignment(int64_t rows, int64_t cols, int64_t ld) {
  return rows == 1 || (cols % kVec16<X> == 0 && ld % kVec16<X> == 0);
}

void swiglu_forward(cudaStream_t stream, void* out, const void* gate, const void* up, int64_t rows, int64_t cols,
                    int64_t ld, DType dt) {
  if (rows == 0 || cols == 0) return;
  dispatch_dtype(dt, [&](auto t) {
    using X = decltype(t);
    const bool wide = aligned16(out) && aligned16(gate) && aligned16(up) && strides_keep_alignment<X>(rows, cols, ld);
    with_vector_width<kVec16<X>>(wide, [&](auto vw) {
      constexpr int N = decltype(vw)::value;
      swiglu_forward_kernel<X, N><<<grid_for_elements(rows * ((cols + N - 1) / N) * N, N), kBlockThreads, 0, stream>>>(
          static_cast<X*>(out), static_cast<const X*>(gate), static_cast<const X*>(up), rows, cols, ld);
      SO_CUDA_CHECK(cudaGetLastError());
    });
  });
}

void swiglu_backward(cudaStream_t stream, void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                     int64_t rows, int64_t cols, int64_t ld, DType dt) {
  if (rows == 0 || cols == 0) return;
  dispatch_dtype(dt, [&](auto t) {
    using X = decltype(t);
    const bool wide = aligned16(dgate) && aligned16(dup) && aligned16(dout) && aligned16(gate) && aligned16(up) &&
                      strides_keep_alignment<X>(rows, cols, ld);
    with_vector_width<kVec16<X>>(wide, [&](auto vw) {
      constexpr int N = decltype(vw)::value;
      swiglu_backward_kernel<X, N><<<grid_for_elements(rows * ((cols + N - 1) / N) * N, N), kBlockThreads, 0, stream>>>(
          static_cast<X*>(dgate), static_cast<X*>(dup), static_cast<const X*>(dout), static_cast<const X*>(gate),
          static_cast<const X*>(up), rows, cols, ld);
      SO_CUDA_CHECK(cudaGetLastError());
    });
  });
}

// The up half of a [gate | up] row: cols values in.
void* second_half(void* gate_up, int64_t cols, DType dt) { return static_cast<char*>(gate_up) + cols * dtype_size(dt); }
const void* second_half(const void* gate_up, int64_t cols, DType dt) {
  return static_cast<const char*>(gate_up) + cols * dtype_size(dt);
}

}  // namespace

void launch_swiglu_forward(cudaStream_t stream, void* out, const void* gate, const void* up, int64_t n, DType dt) {
  swiglu_forward(stream, out, gate, up, 1, n, n, dt);
}

void launch_swiglu_backward(cudaStream_t stream, void* dgate, void* dup, const void* dout, const void* gate,
                            const void* up, int64_t n, DType dt) {
  swiglu_backward(stream, dgate, dup, dout, gate, up, 1, n, n, dt);
}

void launch_swiglu_rows_forward(cudaStream_t stream, void* out, const void* gate_up, int64_t rows, int64_t cols,
                                DType dt) {
  swiglu_forward(stream, out, gate_up, second_half(gate_up, cols, dt), rows, cols, 2 * cols, dt);
}

void launch_swiglu_rows_backward(cudaStream_t stream, void* dgate_up, const void* dout, const void* gate_up,
                                 int64_t rows, int64_t cols, DType dt) {
  swiglu_backward(stream, dgate_up, second_half(dgate_up, cols, dt), dout, gate_up, second_half(gate_up, cols, dt),
                  rows, cols, 2 * cols, dt);
}

}  // namespace so::cuda
