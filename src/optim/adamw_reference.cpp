#include <cmath>

#include "so/optim/adamw.h"

namespace so::optim {

template <typename GradT, typename OutT>
void adamw_reference(float* p, float* m, float* v, const GradT* grad, OutT* out, int64_t n,
                     const AdamWParams& hp) {
  // Bias corrections in double, as Python computes them in torch's single-tensor AdamW.
  const double bc1 = 1.0 - std::pow(static_cast<double>(hp.beta1), static_cast<double>(hp.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(hp.beta2), static_cast<double>(hp.step));
  const float step_size = static_cast<float>(hp.lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay = 1.0f - hp.lr * hp.weight_decay;
  const float one_minus_b1 = 1.0f - hp.beta1;
  const float one_minus_b2 = 1.0f - hp.beta2;
  for (int64_t i = 0; i < n; ++i) {
    const float g = to_f32(grad[i]) * hp.grad_scale;
    float pi = p[i] * decay;
    const float mi = m[i] + one_minus_b1 * (g - m[i]);
    const float vi = hp.beta2 * v[i] + one_minus_b2 * g * g;
    const float denom = std::sqrt(vi) / bc2_sqrt + hp.eps;
    pi -= step_size * (mi / denom);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if (out) out[i] = from_f32<OutT>(pi);
  }
}

template void adamw_reference<float, float>(float*, float*, float*, const float*, float*, int64_t,
                                            const AdamWParams&);
template void adamw_reference<float, bf16>(float*, float*, float*, const float*, bf16*, int64_t,
                                           const AdamWParams&);
template void adamw_reference<bf16, float>(float*, float*, float*, const bf16*, float*, int64_t,
                                           const AdamWParams&);
template void adamw_reference<bf16, bf16>(float*, float*, float*, const bf16*, bf16*, int64_t,
                                          const AdamWParams&);

}  // namespace so::optim
