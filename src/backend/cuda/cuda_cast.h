#pragma once
// Whether a GPU is usable (the backend's "auto" choice and the GPU tests' skip). The cast kernels
// beside it are launch_cast in cuda_kernels.h.
namespace so::cuda {

int device_count();  // 0 when there is no usable GPU (never throws)

}  // namespace so::cuda
