#pragma once
// AdamW over flat fp32 arrays. Kernels here update arrays and nothing else: they know nothing of
// buckets, streams or devices. The scalar version is the reference every SIMD path must match.
#include <cstdint>
#include <functional>

#include "so/core/dtype.h"

namespace so {

// The hyper-parameters as the user wrote them (doubles, like torch's Python floats): every
// derived float (1 - beta, 1 - lr*wd, lr / bias correction) is computed in double and rounded
// once, as torch.optim.AdamW does, so the state matches torch's to the last bit the operations
// allow (optim::adam_constants).
struct AdamWParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t step = 1;         // 1-based step used for bias correction
  float grad_scale = 1.0f;  // multiplies the gradient (clipping, loss scaling), as clip_grad_norm_ does
};

// The arrays of one optimizer call over n parameters; element i of each belongs to parameter i.
struct AdamArrays {
  float* p = nullptr;  // fp32 master weights, updated in place
  float* m = nullptr;  // first moment (exp_avg)
  float* v = nullptr;  // second moment (exp_avg_sq)
  const void* grad = nullptr;
  DType grad_dt = DType::F32;
  void* out = nullptr;  // receives the new weights in out_dt too (the device's copy); null = none
  DType out_dt = DType::BF16;
  // Exact rollback: p, m, v as they were before a speculative step. When set, `step` writes the
  // old state here in the same pass, and `rollback` / `redo` start from it instead of inverting.
  float* snapshot_p = nullptr;
  float* snapshot_m = nullptr;
  float* snapshot_v = nullptr;

  bool has_snapshot() const { return snapshot_p != nullptr; }
  // The same arrays from element i on.
  AdamArrays from(int64_t i) const;
};

// One optimizer pass (a step, rollback or redo) over the arrays it is given, issued by a caller
// that may first redirect the arrays' snapshot (a checkpoint's copy of the old state).
using AdamPass = std::function<void(const AdamArrays&)>;

namespace optim {

// torch.optim.AdamW, element by element, in torch's own operation order (its fused and
// vectorised CPU kernels: lerp as one FMA, addcmul as one FMA, addcdiv):
//   g = grad * grad_scale;  pd = p * (1 - lr*wd);  m' = fma(1-b1, g - m, m)
//   v' = fma((1-b2) g, g, v * b2);  p' = pd + (-lr/(1-b1^t) * m') / (sqrt(v')/sqrt(1-b2^t) + eps)
// and, in the same pass, out[i] = p'[i] stored as OutT (the device copy of the weights).
template <typename GradT, typename OutT>
void adamw_reference(float* p, float* m, float* v, const GradT* grad, OutT* out, int64_t n, const AdamWParams& hp);

}  // namespace optim
}  // namespace so
