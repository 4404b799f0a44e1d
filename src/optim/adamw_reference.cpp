#include <cmath>

#include "adam_constants.h"
#include "so/optim/adamw.h"

namespace so {

AdamArrays AdamArrays::from(int64_t i) const {
  AdamArrays a = *this;
  auto shift = [i](auto* ptr, size_t elem) {
    using P = decltype(ptr);
    return ptr ? reinterpret_cast<P>(reinterpret_cast<uintptr_t>(ptr) + static_cast<uintptr_t>(i) * elem) : ptr;
  };
  a.p = shift(p, 4), a.m = shift(m, 4), a.v = shift(v, 4);
  a.grad = shift(grad, dtype_size(grad_dt));
  a.out = shift(out, dtype_size(out_dt));
  a.snapshot_p = shift(snapshot_p, 4), a.snapshot_m = shift(snapshot_m, 4), a.snapshot_v = shift(snapshot_v, 4);
  return a;
}

namespace optim {

AdamConstants adam_constants(const AdamWParams& hp) {
  // Python floats throughout, as torch.optim.AdamW computes them; each rounded to float once where
  // a float tensor op receives it.
  const double bc1 = 1.0 - std::pow(hp.beta1, static_cast<double>(hp.step));
  const double bc2 = 1.0 - std::pow(hp.beta2, static_cast<double>(hp.step));
  const auto bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const auto decay = static_cast<float>(1.0 - hp.lr * hp.weight_decay);
  const auto omb1 = static_cast<float>(1.0 - hp.beta1);
  const auto beta2 = static_cast<float>(hp.beta2);
  return AdamConstants{.neg_step_size = static_cast<float>(-(hp.lr / bc1)),
                       .bc2_sqrt = bc2_sqrt,
                       .inv_bc2_sqrt = 1.0f / bc2_sqrt,
                       .decay = decay,
                       .beta2 = beta2,
                       .one_minus_b1 = omb1,
                       .one_minus_b2 = static_cast<float>(1.0 - hp.beta2),
                       .eps = static_cast<float>(hp.eps),
                       .grad_scale = hp.grad_scale,
                       .inv_decay = static_cast<float>(1.0 / decay),
                       .inv_beta1 = static_cast<float>(1.0 / (1.0 - omb1)),
                       .inv_beta2 = static_cast<float>(1.0 / beta2)};
}

template <typename GradT, typename OutT>
void adamw_reference(float* p, float* m, float* v, const GradT* grad, OutT* out, int64_t n, const AdamWParams& hp) {
  const AdamConstants c = adam_constants(hp);
  for (int64_t i = 0; i < n; ++i) {
    const float g = to_f32(grad[i]) * c.grad_scale;
    const float pd = p[i] * c.decay;                                   // param.mul_(1 - lr*wd)
    const float mi = std::fma(c.one_minus_b1, g - m[i], m[i]);         // exp_avg.lerp_(grad, 1-b1)
    const float vi = std::fma(c.one_minus_b2 * g, g, v[i] * c.beta2);  // .mul_(b2).addcmul_(g, g, 1-b2)
    const float denom = std::sqrt(vi) / c.bc2_sqrt + c.eps;            // (sqrt(v) / bc2_sqrt).add_(eps)
    const float pi = pd + (c.neg_step_size * mi) / denom;              // param.addcdiv_(m, denom, -step_size)
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if (out) out[i] = from_f32<OutT>(pi);
  }
}

template void adamw_reference<float, float>(float*, float*, float*, const float*, float*, int64_t, const AdamWParams&);
template void adamw_reference<float, bf16>(float*, float*, float*, const float*, bf16*, int64_t, const AdamWParams&);
template void adamw_reference<bf16, float>(float*, float*, float*, const bf16*, float*, int64_t, const AdamWParams&);
template void adamw_reference<bf16, bf16>(float*, float*, float*, const bf16*, bf16*, int64_t, const AdamWParams&);

}  // namespace optim
}  // namespace so
