// Arm SVE kernels, vector-length agnostic (Grace's Neoverse V2 runs 128-bit SVE; the tests run
// 128, 256 and 512 under qemu). The tail is one predicated vector (svwhilelt), like every other
// vector, so no scalar remainder loop exists. Compiled with -march=armv8-a+sve.
#include <arm_sve.h>

#include "adam_kernels_impl.h"
#include "adam_kernels_isa.h"

namespace so::optim {
namespace {

// Arithmetic runs on all lanes (dead lanes hold zeros from the zeroing loads, harmless); only
// memory accesses are predicated.
inline svbool_t all32() { return svptrue_b32(); }
inline svbool_t all64() { return svptrue_b64(); }

struct SveInt {
  using U = svuint32_t;
  static U splat(uint32_t x) { return svdup_n_u32(x); }
  static U srl16(U a) { return svlsr_n_u32_x(all32(), a, 16); }
  static U and_(U a, U b) { return svand_u32_x(all32(), a, b); }
  static U add(U a, U b) { return svadd_u32_x(all32(), a, b); }
  static U or_(U a, U b) { return svorr_u32_x(all32(), a, b); }
  static svbool_t nan_mask(U a) { return svcmpgt_u32(all32(), and_(a, splat(0x7fffffffu)), splat(0x7f800000u)); }
  static U select(svbool_t mask, U a, U b) { return svsel_u32(mask, a, b); }
};

struct Sve {
  using F = svfloat32_t;
  using M = svbool_t;
  using D = svfloat64_t;
  static int64_t lanes() { return static_cast<int64_t>(svcntw()); }
  static M full() { return all32(); }
  static M first(int64_t k) { return svwhilelt_b32(int64_t{0}, k); }
  static F load(const float* p, M mk) { return svld1_f32(mk, p); }
  static F load(const bf16* p, M mk) {
    const svuint32_t h = svld1uh_u32(mk, reinterpret_cast<const uint16_t*>(p));
    return svreinterpret_f32_u32(svlsl_n_u32_x(all32(), h, 16));
  }
  static void store(float* p, F x, M mk) { svst1_f32(mk, p, x); }
  static void store(bf16* p, F x, M mk) {
    // st1h stores the low half of each 32-bit lane: the narrowing is part of the store.
    svst1h_u32(mk, reinterpret_cast<uint16_t*>(p), bf16_round_bits<SveInt>(svreinterpret_u32_f32(x)));
  }
  static F splat(float x) { return svdup_n_f32(x); }
  static F add(F a, F b) { return svadd_f32_x(all32(), a, b); }
  static F sub(F a, F b) { return svsub_f32_x(all32(), a, b); }
  static F mul(F a, F b) { return svmul_f32_x(all32(), a, b); }
  static F div(F a, F b) { return svdiv_f32_x(all32(), a, b); }
  static F sqrt(F a) { return svsqrt_f32_x(all32(), a); }
  static F fma(F a, F b, F c) { return svmla_f32_x(all32(), c, a, b); }
  static F if_inf(F x, F a, F b) { return svsel_f32(svcmpeq_n_f32(all32(), x, __builtin_inff()), a, b); }
  static F max0(F x) { return svsel_f32(svcmpgt_n_f32(all32(), x, 0.0f), x, svdup_n_f32(0.0f)); }
  static D dzero() { return svdup_n_f64(0.0); }
  static void add_squares(D& lo, D& hi, F x) {
    // fcvt widens the even 32-bit lanes; shifting each 64-bit container right by 32 brings the
    // odd lanes there.
    const svfloat64_t a = svcvt_f64_f32_x(all64(), x);
    const svfloat32_t odd = svreinterpret_f32_u64(svlsr_n_u64_x(all64(), svreinterpret_u64_f32(x), 32));
    const svfloat64_t b = svcvt_f64_f32_x(all64(), odd);
    lo = svadd_f64_x(all64(), lo, svmul_f64_x(all64(), a, a));
    hi = svadd_f64_x(all64(), hi, svmul_f64_x(all64(), b, b));
  }
  static double reduce(D lo, D hi) { return svaddv_f64(all64(), svadd_f64_x(all64(), lo, hi)); }
};

}  // namespace

const AdamKernels& sve_adam_kernels() {
  static const AdamKernels k = make_adam_kernels<Sve>(SimdIsa::Sve);
  return k;
}

}  // namespace so::optim
