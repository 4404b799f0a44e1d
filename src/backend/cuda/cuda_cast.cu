// fp32 <-> bf16 casts with the rounding of so::f32_to_bf16 (nearest even, NaN kept), and same-dtype
// copies; plus the device probe.
#include "cuda_bf16.cuh"
#include "cuda_cast.h"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_launch.cuh"

namespace so::cuda {

namespace {

template <typename Dst, typename Src, int N>
__global__ void cast_kernel(Dst* dst, const Src* src, int64_t n) {
  for (int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * N; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x * N) {
    float v[N];
    load_f32<N>(v, src, i, n);
    store_f32<N>(dst, v, i, n);
  }
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

void launch_cast(cudaStream_t stream, void* dst, DType dst_dt, const void* src, DType src_dt, int64_t n) {
  if (n == 0) return;
  if (dst_dt == src_dt) {  // a byte copy: bf16 NaN payloads pass through untouched, as on the CPU
    SO_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * dtype_size(dst_dt), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  dispatch_dtype(dst_dt, [&](auto d) {
    dispatch_dtype(src_dt, [&](auto s) {
      using D = decltype(d);
      using S = decltype(s);
      // One of the two is bf16: groups of 8 are 16 bytes of bf16 and 32 of fp32.
      with_vector_width<8>(aligned16(dst) && aligned16(src), [&](auto vw) {
        constexpr int N = decltype(vw)::value;
        cast_kernel<D, S, N><<<grid_for_elements(n, N), kBlockThreads, 0, stream>>>(static_cast<D*>(dst),
                                                                                    static_cast<const S*>(src), n);
        SO_CUDA_CHECK(cudaGetLastError());
      });
    });
  });
}

}  // namespace so::cuda
