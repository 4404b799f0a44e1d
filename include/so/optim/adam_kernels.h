#pragma once
// One instruction set's AdamW kernels over flat host arrays. Every variant computes exactly what
// optim::adamw_reference computes (same operation order, no contraction into FMA), so results
// agree bit for bit with the scalar reference, and the tests hold them to exactly that (one
// documented exception: avx512bf16 stores subnormal weights as bf16 zeros; docs/optimizer.md).
#include <cstdint>

#include "so/core/dtype.h"
#include "so/optim/adamw.h"
#include "so/optim/simd_isa.h"

namespace so {

struct AdamKernels {
  SimdIsa isa;
  // adamw_reference over [0, n): grad is fp32 or bf16; out (fp32 or bf16) may be null.
  void (*step)(float* p, float* m, float* v, const void* grad, DType grad_dt, void* out, DType out_dt, int64_t n,
               const AdamWParams& hp);
  // In-place inverse of `step` given the same grad and hp: restores p, m, v up to rounding
  // (v is clamped at 0). Error bound in docs/optimizer.md, tested in test_grace_adam.
  void (*rollback)(float* p, float* m, float* v, const void* grad, DType grad_dt, int64_t n,
                   const AdamWParams& hp);
  // Sum of x^2 over [0, n), accumulated in double.
  double (*sum_squares)(const void* x, DType dt, int64_t n);
  // dst[i] = src[i] converted (fp32 <-> bf16 with round-to-nearest-even, NaN kept), or copied.
  void (*cast)(void* dst, DType dst_dt, const void* src, DType src_dt, int64_t n);
};

const AdamKernels& adam_kernels(SimdIsa isa);  // error if not supported

// Sums of squares are taken over fixed chunks of this many elements, each chunk's double sum
// added in order, so the result does not depend on the thread count or on who computes it
// (the device-side ops on the CPU backend and the offloaded optimizer agree bit for bit).
constexpr int64_t kSumSquaresChunk = 16384;
double sum_squares_chunked(const AdamKernels& k, const void* x, DType dt, int64_t n);

}  // namespace so
