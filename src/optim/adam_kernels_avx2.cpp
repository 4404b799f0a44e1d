// AVX2 kernels (8 lanes); compiled with -mavx2 -mfma (CPUs with AVX2 have FMA). FMAs appear only
// where the body asks for one: -ffp-contract=off keeps the reference's other roundings separate.
#include <immintrin.h>

#include "adam_kernels_impl.h"
#include "adam_kernels_isa.h"

namespace so::optim {
namespace {

struct Avx2Int {
  using U = __m256i;
  static U splat(uint32_t x) { return _mm256_set1_epi32(static_cast<int>(x)); }
  static U srl16(U a) { return _mm256_srli_epi32(a, 16); }
  static U and_(U a, U b) { return _mm256_and_si256(a, b); }
  static U add(U a, U b) { return _mm256_add_epi32(a, b); }
  static U or_(U a, U b) { return _mm256_or_si256(a, b); }
  // One float compare (unordered with itself) instead of clearing the sign and comparing as integers.
  static U nan_mask(U a) {
    const __m256 x = _mm256_castsi256_ps(a);
    return _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  }
  static U select(U mask, U a, U b) { return _mm256_blendv_epi8(b, a, mask); }
};

struct Avx2Base {
  using F = __m256;
  using D = __m256d;
  static constexpr int64_t kLanes = 8;
  static F loadu(const float* p) { return _mm256_loadu_ps(p); }
  static F loadu(const bf16* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static void storeu(float* p, F x) { _mm256_storeu_ps(p, x); }
  static void store_nt(float* p, F x) { _mm256_stream_ps(p, x); }  // the non-temporal probe's
  static void store_fence() { _mm_sfence(); }
  static void storeu(bf16* p, F x) {
    const __m256i r = bf16_round_bits<Avx2Int>(_mm256_castps_si256(x));
    // Lanes hold values <= 0xffff, so the unsigned-saturating pack is an exact narrowing.
    const __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
  }
  static F splat(float x) { return _mm256_set1_ps(x); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F sqrt(F a) { return _mm256_sqrt_ps(a); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F if_inf(F x, F a, F b) {
    return _mm256_blendv_ps(b, a, _mm256_cmp_ps(x, _mm256_set1_ps(__builtin_inff()), _CMP_EQ_OQ));
  }
  static F max0(F x) { return _mm256_and_ps(_mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GT_OQ), x); }
  static D dzero() { return _mm256_setzero_pd(); }
  static void add_squares(D& lo, D& hi, F x) {
    const __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    const __m256d b = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    lo = _mm256_add_pd(lo, _mm256_mul_pd(a, a));
    hi = _mm256_add_pd(hi, _mm256_mul_pd(b, b));
  }
  static double reduce(D lo, D hi) {
    const __m256d s = _mm256_add_pd(lo, hi);
    const __m128d t = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    return _mm_cvtsd_f64(_mm_add_sd(t, _mm_unpackhi_pd(t, t)));
  }
};

using Avx2 = CountMasked<Avx2Base>;

}  // namespace

const AdamKernels& avx2_adam_kernels() {
  static const AdamKernels k = make_adam_kernels<Avx2>(SimdIsa::Avx2);
  return k;
}

}  // namespace so::optim
