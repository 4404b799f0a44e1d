#pragma once
// AVX-512 traits (16 lanes, masked loads and stores for the tail), shared by the two AVX-512
// kernel files: adam_kernels_avx512.cpp (F+BW+VL, integer bf16 rounding) and
// adam_kernels_avx512bf16.cpp (adds -mavx512bf16 and rounds with vcvtneps2bf16).
//
// vcvtneps2bf16 matches so::f32_to_bf16 (round to nearest even, NaN truncated with its quiet bit
// set, Inf kept, overflow to Inf) except that it treats subnormal inputs as zero: a subnormal
// fp32 becomes a zero of the same sign, where f32_to_bf16 rounds it to a bf16 subnormal (or to the
// smallest normal). Weights that small are zero for every purpose of the device copy; the master
// weights in p are unaffected. test_grace_adam checks exactly this difference and nothing more.
#include <immintrin.h>

#include "adam_kernels_impl.h"

namespace so::optim {
namespace {

struct Avx512Int {
  using U = __m512i;
  static U splat(uint32_t x) { return _mm512_set1_epi32(static_cast<int>(x)); }
  static U srl16(U a) { return _mm512_srli_epi32(a, 16); }
  static U and_(U a, U b) { return _mm512_and_si512(a, b); }
  static U add(U a, U b) { return _mm512_add_epi32(a, b); }
  static U or_(U a, U b) { return _mm512_or_si512(a, b); }
  static __mmask16 nan_mask(U a) { return _mm512_cmpgt_epu32_mask(and_(a, splat(0x7fffffffu)), splat(0x7f800000u)); }
  static U select(__mmask16 mask, U a, U b) { return _mm512_mask_blend_epi32(mask, b, a); }
};

template <bool kNativeBf16>
struct Avx512 {
  using F = __m512;
  using M = __mmask16;
  using D = __m512d;
  static int64_t lanes() { return 16; }
  static M full() { return 0xffff; }
  static M first(int64_t k) { return static_cast<M>((1u << k) - 1u); }
  static F load(const float* p, M mk) { return _mm512_maskz_loadu_ps(mk, p); }
  static F load(const bf16* p, M mk) {
    const __m256i h = _mm256_maskz_loadu_epi16(mk, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static void store(float* p, F x, M mk) { _mm512_mask_storeu_ps(p, mk, x); }
  static void store_nt(float* p, F x) { _mm512_stream_ps(p, x); }  // the non-temporal probe's
  static void store_fence() { _mm_sfence(); }
  static void store(bf16* p, F x, M mk) {
    if constexpr (kNativeBf16) {
      _mm256_mask_storeu_epi16(p, mk, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)));
    } else {
      _mm512_mask_cvtepi32_storeu_epi16(p, mk, bf16_round_bits<Avx512Int>(_mm512_castps_si512(x)));
    }
  }
  static F splat(float x) { return _mm512_set1_ps(x); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F sqrt(F a) { return _mm512_sqrt_ps(a); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F if_inf(F x, F a, F b) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(__builtin_inff()), _CMP_EQ_OQ), b, a);
  }
  static F max0(F x) { return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ), x); }
  static D dzero() { return _mm512_setzero_pd(); }
  static void add_squares(D& lo, D& hi, F x) {
    const __m512d a = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    const __m512d b = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    lo = _mm512_add_pd(lo, _mm512_mul_pd(a, a));
    hi = _mm512_add_pd(hi, _mm512_mul_pd(b, b));
  }
  static double reduce(D lo, D hi) { return _mm512_reduce_add_pd(_mm512_add_pd(lo, hi)); }
};

}  // namespace
}  // namespace so::optim
