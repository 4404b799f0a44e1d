// Residual dropout, elementwise over [rows, cols]: one thread per element, grid-stride. The keep
// bit is dropout_mask.h's hash, as on the CPU; a kept value is one fp32 fused multiply-add
// (std::fma there), so both backends round identically.
#include "cuda_bf16.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_launch.cuh"

namespace so::cuda {

namespace {

// The forward adds the kept y, scaled, to x; the backward passes the kept dx, scaled, as dy.
struct AddKept {
  template <typename T>
  __device__ void operator()(T& x, const T& y, bool kept, float scale) const {
    if (kept) x = from_float<T>(__fmaf_rn(to_float(y), scale, to_float(x)));
  }
};
struct PassKept {
  template <typename T>
  __device__ void operator()(T& dy, const T& dx, bool kept, float scale) const {
    dy = from_float<T>(kept ? __fmul_rn(to_float(dx), scale) : 0.0f);
  }
};

// apply(dst[i], src[i], kept, scale) for every element of [rows, cols] under the mask m.
template <typename T, typename Apply>
__global__ void dropout_kernel(T* dst, const T* src, int64_t rows, int64_t cols, DropoutMask m, uint32_t threshold,
                               float scale, Apply apply) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    apply(dst[i], src[i], dropout_keep(m.key, dropout_token(m, m.row0 + r), static_cast<uint64_t>(c), threshold),
          scale);
  }
}

template <typename Apply>
void launch_dropout(cudaStream_t stream, void* dst, const void* src, int64_t rows, int64_t cols, const DropoutMask& m,
                    DType dt, Apply apply) {
  if (rows * cols == 0) return;
  dispatch_dtype(dt, [&](auto t) {
    using X = decltype(t);
    dropout_kernel<X><<<grid_for_elements(rows * cols, 1), kBlockThreads, 0, stream>>>(
        static_cast<X*>(dst), static_cast<const X*>(src), rows, cols, m, m.threshold(), m.scale(), apply);
    SO_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace

void launch_dropout_add(cudaStream_t stream, void* x, const void* y, int64_t rows, int64_t cols, const DropoutMask& m,
                        DType dt) {
  launch_dropout(stream, x, y, rows, cols, m, dt, AddKept{});
}

void launch_dropout_backward(cudaStream_t stream, void* dy, const void* dx, int64_t rows, int64_t cols,
                             const DropoutMask& m, DType dt) {
  launch_dropout(stream, dy, dx, rows, cols, m, dt, PassKept{});
}

}  // namespace so::cuda
