#pragma once
// GEMMs through cuBLASLt: bf16 (or fp32) inputs, fp32 accumulation (CUBLAS_COMPUTE_32F), C in
// bf16 or fp32. The algorithm for each (shape, transposes, dtypes, beta != 0) is chosen once by
// cublasLtMatmulAlgoGetHeuristic and cached (at most 1024 plans, then the cache starts over); the
// workspace is allocated once at construction.
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "so/core/dtype.h"

namespace so::cuda {

class CublasLtGemm {
 public:
  CublasLtGemm();
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // Ops::gemm semantics: row-major C[M,N] = alpha * op(A) @ op(B) + beta * C.
  void gemm(cudaStream_t stream, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
            const void* A, const void* B, DType ab, float beta, void* C, DType c);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace so::cuda
