#pragma once
// SO_CUDA_CHECK: every CUDA runtime call is checked; the error names the call and the CUDA error.
// SO_CUBLAS_CHECK: the same for cuBLASLt calls (the including file includes <cublasLt.h>).
// SO_CUDA_WARN: for destructors and cleanup paths, which must not throw: logs the failure instead.
#include <cuda_runtime.h>

#include "so/core/error.h"
#include "so/core/log.h"

#define SO_CUDA_CHECK(call)                                                            \
  do {                                                                                 \
    cudaError_t so_cuda_err_ = (call);                                                 \
    if (so_cuda_err_ != cudaSuccess)                                                   \
      SO_FAIL("CUDA call failed: ", #call, ": ", cudaGetErrorName(so_cuda_err_), " (", \
              cudaGetErrorString(so_cuda_err_), ")");                                  \
  } while (0)

#define SO_CUBLAS_CHECK(call)                                                                        \
  do {                                                                                               \
    cublasStatus_t so_cublas_status_ = (call);                                                       \
    if (so_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                                  \
      SO_FAIL("cuBLASLt call failed: ", #call, ": ", cublasLtGetStatusName(so_cublas_status_), " (", \
              cublasLtGetStatusString(so_cublas_status_), ")");                                      \
  } while (0)

#define SO_CUDA_WARN(call)                                                                                   \
  do {                                                                                                       \
    cudaError_t so_cuda_err_ = (call);                                                                       \
    if (so_cuda_err_ != cudaSuccess)                                                                         \
      ::so::log(::so::LogLevel::Error,                                                                       \
                ::so::str_cat("CUDA call failed (ignored during cleanup): ", #call, ": ",                    \
                              cudaGetErrorName(so_cuda_err_), " (", cudaGetErrorString(so_cuda_err_), ")")); \
  } while (0)
