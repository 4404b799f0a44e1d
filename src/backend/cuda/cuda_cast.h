#pragma once
// The first CUDA kernels: fp32 <-> bf16 casts with the same rounding as so::f32_to_bf16
// (round to nearest even, NaN kept), the casting half of SuperOffload. The full CUDA backend
// builds on these.
#include <cuda_runtime.h>

#include <cstdint>

namespace so::cuda {

int device_count();  // 0 when there is no usable GPU (never throws)
void cast_f32_to_bf16(uint16_t* dst, const float* src, int64_t n, cudaStream_t stream);
void cast_bf16_to_f32(float* dst, const uint16_t* src, int64_t n, cudaStream_t stream);

}  // namespace so::cuda
