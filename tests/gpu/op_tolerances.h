#pragma once
// Every tolerance of the CUDA-vs-CPU op comparisons (test_cuda_ops.cpp), in one place.
//
// Both backends compute in fp32 from the same stored inputs (ops.h), so they differ only by
// (a) the order of fp32 sums and the last bits of exp/log/sin/cos, and (b) for bf16 outputs, a
// final rounding that can flip by one bf16 step (2^-8 relative) where (a) straddles a rounding
// boundary. The measure is norm-wise: ||cuda - cpu|| / ||cpu|| over one output tensor (the
// method's ||out - ref|| / ||ref||); NaN or Inf in a CUDA output where the CPU has a finite value
// never passes, and every overwritten output is poisoned with NaN before the op, so an unwritten
// element fails too (accumulated outputs start from the same random values on both backends).
#include <cmath>
#include <cstdint>

#include "so/core/dtype.h"

namespace so::test {

enum class OpClass {
  Exact,        // data movement, casts, adamw, sum_squares: equal bit for bit (NaN == NaN)
  Elementwise,  // one output element from a few inputs: swiglu, replicate_heads reverse
  Rope,         // elementwise, but through cos/sin of position * theta^(-2i/D)
  Reduction,    // a row reduced to a statistic first: rmsnorm, cross_entropy, softmax rows
  Scatter,      // long accumulations in an order the kernel chooses: embedding_backward, rmsnorm's dw
  Gemm,         // fp32 accumulation over K: error grows like sqrt(K)
  AttentionFwd,
  AttentionBwd,
};

inline const char* op_class_name(OpClass c) {
  switch (c) {
    case OpClass::Exact: return "exact";
    case OpClass::Elementwise: return "elementwise";
    case OpClass::Rope: return "rope";
    case OpClass::Reduction: return "reduction";
    case OpClass::Scatter: return "scatter";
    case OpClass::Gemm: return "gemm";
    case OpClass::AttentionFwd: return "attention forward";
    case OpClass::AttentionBwd: return "attention backward";
  }
  return "?";
}

// The bound for one output tensor of dtype `dt` (the output's own dtype: the fp32 rstd or lse of a
// bf16 op is held to the fp32 bound). k: the GEMM's inner dimension (ignored elsewhere).
inline double op_tolerance(OpClass c, DType dt, int64_t k = 1) {
  const bool f32 = dt == DType::F32;
  switch (c) {
    case OpClass::Exact: return 0.0;
    case OpClass::Elementwise:
      // fp32: a few ulps of expf (2^-23 ~ 1.2e-7 each). bf16: rare one-step flips.
      return f32 ? 1e-6 : 2e-3;
    case OpClass::Rope:
      // The CPU reference forms the angle position * inv_freq in double. A kernel that forms it in
      // fp32 loses position * 2^-24 rad: 8e-3 rad at position 131071, which this bound rejects on
      // purpose (long-context training reads those positions).
      return f32 ? 1e-5 : 4e-3;
    case OpClass::Reduction: return f32 ? 1e-5 : 4e-3;
    case OpClass::Scatter:
      // fp32: sums over up to 70k rows (the CPU's dw is summed in double). bf16: rows accumulated
      // in a different order round differently at every addition.
      return f32 ? 5e-5 : 1.5e-2;
    case OpClass::Gemm:
      // fp32 accumulation in another order: ~2^-24 * sqrt(K) norm-wise; 1e-6 * sqrt(K) keeps
      // margin yet stays under TF32's ~3e-4 (an accidental TF32 path fails at K >= 64). A bf16
      // output adds one-step rounding flips.
      return 1e-6 * std::sqrt(static_cast<double>(k)) + (f32 ? 0.0 : 3e-3);
    case OpClass::AttentionFwd:
      // bf16: flash kernels feed the softmax probabilities P to the tensor cores in bf16 (2^-9
      // relative each), the CPU keeps them in fp32.
      return f32 ? 2e-5 : 1e-2;
    case OpClass::AttentionBwd:
      // bf16: P and dS both rounded to bf16 before their matmuls; dK/dV sum over S queries.
      return f32 ? 5e-5 : 2e-2;
  }
  return 0.0;
}

}  // namespace so::test
