// GEMM through OpenBLAS sgemm. bf16 operands are widened to fp32 scratch first (Debian's OpenBLAS
// has no bf16 GEMM on every target), so bf16 mode computes exactly what fp32 would on the
// rounded inputs, accumulating in fp32.
#include <cblas.h>

#include <vector>

#include "cpu_kernels.h"
#include "so/core/error.h"

namespace so::cpu {

namespace {
const float* as_f32(const void* p, DType dt, int64_t n, std::vector<float>& scratch) {
  if (dt == DType::F32) return static_cast<const float*>(p);
  scratch.resize(static_cast<size_t>(n));
  cast(scratch.data(), static_cast<const bf16*>(p), n);
  return scratch.data();
}
}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A, const void* B,
          DType ab, float beta, void* C, DType c) {
  SO_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size M=", M, " N=", N, " K=", K);
  if (M == 0 || N == 0) return;
  if (K == 0) {  // an empty sum: C = beta * C (BLAS refuses a zero leading dimension)
    for (int64_t i = 0; i < M * N; ++i) {
      if (c == DType::F32)
        static_cast<float*>(C)[i] = beta == 0.0f ? 0.0f : beta * static_cast<float*>(C)[i];
      else
        static_cast<bf16*>(C)[i] = f32_to_bf16(beta == 0.0f ? 0.0f : beta * bf16_to_f32(static_cast<bf16*>(C)[i]));
    }
    return;
  }
  thread_local std::vector<float> a_scratch, b_scratch, c_scratch;
  const float* a = as_f32(A, ab, M * K, a_scratch);
  const float* b = as_f32(B, ab, K * N, b_scratch);
  float* cf = static_cast<float*>(C);
  if (c == DType::BF16) {
    c_scratch.resize(static_cast<size_t>(M * N));
    if (beta != 0.0f) cast(c_scratch.data(), static_cast<const bf16*>(C), M * N);
    cf = c_scratch.data();
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(M), static_cast<blasint>(N), static_cast<blasint>(K), alpha, a,
              static_cast<blasint>(trans_a ? M : K), b, static_cast<blasint>(trans_b ? K : N), beta, cf,
              static_cast<blasint>(N));
  if (c == DType::BF16) cast(static_cast<bf16*>(C), cf, M * N);
}

}  // namespace so::cpu
