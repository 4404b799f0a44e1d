// Arm NEON (Advanced SIMD) kernels, 4 lanes; every AArch64 CPU has them.
#include <arm_neon.h>

#include "adam_kernels_impl.h"
#include "adam_kernels_isa.h"

namespace so::optim {
namespace {

struct NeonInt {
  using U = uint32x4_t;
  static U splat(uint32_t x) { return vdupq_n_u32(x); }
  static U srl16(U a) { return vshrq_n_u32(a, 16); }
  static U and_(U a, U b) { return vandq_u32(a, b); }
  static U add(U a, U b) { return vaddq_u32(a, b); }
  static U or_(U a, U b) { return vorrq_u32(a, b); }
  static U nan_mask(U a) { return vcgtq_u32(and_(a, splat(0x7fffffffu)), splat(0x7f800000u)); }
  static U select(U mask, U a, U b) { return vbslq_u32(mask, a, b); }
};

struct NeonBase {
  using F = float32x4_t;
  using D = float64x2_t;
  static constexpr int64_t kLanes = 4;
  static F loadu(const float* p) { return vld1q_f32(p); }
  static F loadu(const bf16* p) {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(reinterpret_cast<const uint16_t*>(p)), 16));
  }
  static void storeu(float* p, F x) { vst1q_f32(p, x); }
  static void storeu(bf16* p, F x) {
    vst1_u16(reinterpret_cast<uint16_t*>(p), vmovn_u32(bf16_round_bits<NeonInt>(vreinterpretq_u32_f32(x))));
  }
  static F splat(float x) { return vdupq_n_f32(x); }
  static F add(F a, F b) { return vaddq_f32(a, b); }
  static F sub(F a, F b) { return vsubq_f32(a, b); }
  static F mul(F a, F b) { return vmulq_f32(a, b); }
  static F div(F a, F b) { return vdivq_f32(a, b); }
  static F sqrt(F a) { return vsqrtq_f32(a); }
  static F fma(F a, F b, F c) { return vfmaq_f32(c, a, b); }
  static F if_inf(F x, F a, F b) { return vbslq_f32(vceqq_f32(x, vdupq_n_f32(__builtin_inff())), a, b); }
  static F max0(F x) {
    return vreinterpretq_f32_u32(vandq_u32(vcgtq_f32(x, vdupq_n_f32(0.0f)), vreinterpretq_u32_f32(x)));
  }
  static D dzero() { return vdupq_n_f64(0.0); }
  static void add_squares(D& lo, D& hi, F x) {
    const float64x2_t a = vcvt_f64_f32(vget_low_f32(x));
    const float64x2_t b = vcvt_high_f64_f32(x);
    lo = vaddq_f64(lo, vmulq_f64(a, a));
    hi = vaddq_f64(hi, vmulq_f64(b, b));
  }
  static double reduce(D lo, D hi) { return vaddvq_f64(vaddq_f64(lo, hi)); }
};

using Neon = CountMasked<NeonBase>;

}  // namespace

const AdamKernels& neon_adam_kernels() {
  static const AdamKernels k = make_adam_kernels<Neon>(SimdIsa::Neon);
  return k;
}

}  // namespace so::optim
