#include <cmath>

#include "adam_constants.h"
#include "so/optim/adamw.h"

namespace so::optim {

AdamConstants adam_constants(const AdamWParams& hp) {
  // Bias corrections in double, as Python computes them in torch's single-tensor AdamW.
  const double bc1 = 1.0 - std::pow(static_cast<double>(hp.beta1), static_cast<double>(hp.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(hp.beta2), static_cast<double>(hp.step));
  const float decay = 1.0f - hp.lr * hp.weight_decay;
  return AdamConstants{.step_size = static_cast<float>(hp.lr / bc1),
                       .bc2_sqrt = static_cast<float>(std::sqrt(bc2)),
                       .decay = decay,
                       .beta1 = hp.beta1,
                       .beta2 = hp.beta2,
                       .one_minus_b1 = 1.0f - hp.beta1,
                       .one_minus_b2 = 1.0f - hp.beta2,
                       .eps = hp.eps,
                       .grad_scale = hp.grad_scale,
                       .inv_decay = static_cast<float>(1.0 / decay),
                       .inv_beta1 = static_cast<float>(1.0 / hp.beta1),
                       .inv_beta2 = static_cast<float>(1.0 / hp.beta2)};
}

template <typename GradT, typename OutT>
void adamw_reference(float* p, float* m, float* v, const GradT* grad, OutT* out, int64_t n,
                     const AdamWParams& hp) {
  const AdamConstants c = adam_constants(hp);
  for (int64_t i = 0; i < n; ++i) {
    const float g = to_f32(grad[i]) * c.grad_scale;
    float pi = p[i] * c.decay;
    const float mi = m[i] + c.one_minus_b1 * (g - m[i]);
    const float vi = c.beta2 * v[i] + c.one_minus_b2 * g * g;
    const float denom = std::sqrt(vi) / c.bc2_sqrt + c.eps;
    pi -= c.step_size * (mi / denom);
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
