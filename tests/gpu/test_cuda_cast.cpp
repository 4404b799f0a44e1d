// GPU casts equal the CPU reference bit for bit. Skipped (reported as skipped) without a GPU.
#include <gtest/gtest.h>

#include <random>

#include "src/backend/cuda/cuda_cast.h"
#include "src/backend/cuda/cuda_check.h"
#include "src/backend/cuda/cuda_kernels.h"
#include "so/core/dtype.h"

namespace so {
namespace {

TEST(CudaCast, MatchesCpuRoundingBitForBit) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const int64_t n = 1000003;  // not a multiple of any block size
  std::vector<float> x(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.0f, 100.0f);
  for (auto& v : x) v = d(rng);
  x[0] = std::nanf("");
  x[1] = INFINITY;
  x[2] = 1.00390625f;
  float* dx = nullptr;
  uint16_t* dy = nullptr;
  float* dz = nullptr;
  SO_CUDA_CHECK(cudaMalloc(&dx, n * 4));
  SO_CUDA_CHECK(cudaMalloc(&dy, n * 2));
  SO_CUDA_CHECK(cudaMalloc(&dz, n * 4));
  SO_CUDA_CHECK(cudaMemcpy(dx, x.data(), n * 4, cudaMemcpyHostToDevice));
  // There in two calls, the second from unaligned pointers (the one-element kernel); back in one
  // call from aligned ones (16-byte groups, then a partial last group).
  cuda::launch_cast(nullptr, dy, DType::BF16, dx, DType::F32, 1);
  cuda::launch_cast(nullptr, dy + 1, DType::BF16, dx + 1, DType::F32, n - 1);
  cuda::launch_cast(nullptr, dz, DType::F32, dy, DType::BF16, n);
  SO_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> y(n);
  std::vector<float> z(n);
  SO_CUDA_CHECK(cudaMemcpy(y.data(), dy, n * 2, cudaMemcpyDeviceToHost));
  SO_CUDA_CHECK(cudaMemcpy(z.data(), dz, n * 4, cudaMemcpyDeviceToHost));
  cudaFree(dx);
  cudaFree(dy);
  cudaFree(dz);
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bf16 ref = f32_to_bf16(x[i]);
    mismatches += y[i] != ref.bits;
    const float back = bf16_to_f32(ref);
    mismatches += !(back == z[i] || (std::isnan(back) && std::isnan(z[i])));
  }
  EXPECT_EQ(mismatches, 0);
}

}  // namespace
}  // namespace so
