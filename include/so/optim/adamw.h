#pragma once
// AdamW over flat fp32 arrays. Kernels here update arrays and nothing else: they know nothing of
// buckets, streams or devices. The scalar version is the reference every SIMD path must match.
#include <cstdint>

#include "so/core/dtype.h"

namespace so {

struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;         // 1-based step used for bias correction
  float grad_scale = 1.0f;  // multiplies the gradient (clipping, loss scaling)
};

namespace optim {

// torch.optim.AdamW semantics, element by element:
//   g = grad * grad_scale;  p *= 1 - lr*wd;  m += (1-b1)(g - m);  v = b2 v + (1-b2) g^2
//   p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
// and, in the same pass, out[i] = p[i] stored as OutT (the device copy of the weights).
template <typename GradT, typename OutT>
void adamw_reference(float* p, float* m, float* v, const GradT* grad, OutT* out, int64_t n,
                     const AdamWParams& hp);

}  // namespace optim
}  // namespace so
