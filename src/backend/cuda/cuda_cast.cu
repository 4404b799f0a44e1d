#include "cuda_cast.h"
#include "cuda_check.h"

namespace so::cuda {

namespace {

__device__ __forceinline__ uint16_t f32_to_bf16_rne(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

__global__ void cast_f32_to_bf16_kernel(uint16_t* dst, const float* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = f32_to_bf16_rne(src[i]);
}

__global__ void cast_bf16_to_f32_kernel(float* dst, const uint16_t* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = __uint_as_float(static_cast<uint32_t>(src[i]) << 16);
}

unsigned grid_for(int64_t n) { return static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65535)); }

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

void cast_f32_to_bf16(uint16_t* dst, const float* src, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  cast_f32_to_bf16_kernel<<<grid_for(n), 256, 0, stream>>>(dst, src, n);
  SO_CUDA_CHECK(cudaGetLastError());
}

void cast_bf16_to_f32(float* dst, const uint16_t* src, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  cast_bf16_to_f32_kernel<<<grid_for(n), 256, 0, stream>>>(dst, src, n);
  SO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace so::cuda
