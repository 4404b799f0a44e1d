// Residual dropout, elementwise over [rows, cols]: one thread per element, grid-stride. The keep
// bit is dropout_mask.h's hash, as on the CPU; a kept value is one fp32 fused multiply-add
// (std::fma there), so both backends round identically.
#include "cuda_bf16.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_launch.cuh"

namespace so::cuda {

namespace {

template <typename T>
__global__ void dropout_add_kernel(T* x, const T* y, int64_t rows, int64_t cols, DropoutMask m, uint32_t threshold,
                                   float scale) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    if (dropout_keep(m.key, dropout_token(m, m.row0 + r), static_cast<uint64_t>(c), threshold))
      x[i] = from_float<T>(__fmaf_rn(to_float(y[i]), scale, to_float(x[i])));
  }
}

template <typename T>
__global__ void dropout_backward_kernel(T* dy, const T* dx, int64_t rows, int64_t cols, DropoutMask m,
                                        uint32_t threshold, float scale) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const bool keep = dropout_keep(m.key, dropout_token(m, m.row0 + r), static_cast<uint64_t>(c), threshold);
    dy[i] = from_float<T>(keep ? __fmul_rn(to_float(dx[i]), scale) : 0.0f);
  }
}

}  // namespace

void launch_dropout_add(cudaStream_t stream, void* x, const void* y, int64_t rows, int64_t cols, const DropoutMask& m,
                        DType dt) {
  if (rows * cols == 0) return;
  dispatch_dtype(dt, [&](auto t) {
    using X = decltype(t);
    dropout_add_kernel<X><<<grid_for_elements(rows * cols, 1), kBlockThreads, 0, stream>>>(
        static_cast<X*>(x), static_cast<const X*>(y), rows, cols, m, m.threshold(), m.scale());
    SO_CUDA_CHECK(cudaGetLastError());
  });
}

void launch_dropout_backward(cudaStream_t stream, void* dy, const void* dx, int64_t rows, int64_t cols,
                             const DropoutMask& m, DType dt) {
  if (rows * cols == 0) return;
  dispatch_dtype(dt, [&](auto t) {
    using X = decltype(t);
    dropout_backward_kernel<X><<<grid_for_elements(rows * cols, 1), kBlockThreads, 0, stream>>>(
        static_cast<X*>(dy), static_cast<const X*>(dx), rows, cols, m, m.threshold(), m.scale());
    SO_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace so::cuda
