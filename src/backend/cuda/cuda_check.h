#pragma once
// SO_CUDA_CHECK: every CUDA runtime call is checked; the error names the call and the CUDA error.
#include <cuda_runtime.h>

#include "so/core/error.h"

#define SO_CUDA_CHECK(call)                                                                          \
  do {                                                                                               \
    cudaError_t so_cuda_err_ = (call);                                                               \
    if (so_cuda_err_ != cudaSuccess)                                                                 \
      SO_FAIL("CUDA call failed: ", #call, ": ", cudaGetErrorName(so_cuda_err_), " (",              \
              cudaGetErrorString(so_cuda_err_), ")");                                                \
  } while (0)
