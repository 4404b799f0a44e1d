#pragma once
// out[i] = exp(in[i] - shift) in fp32, as straight-line arithmetic that GCC vectorises (glibc's
// expf is a call per element): callers pass a row of logits and its maximum. Cephes' expf:
// x = n ln2 + r with n = round(x / ln2) and |r| <= ln2 / 2 (ln2 split in two for an exact
// reduction), exp(r) by a degree-7 polynomial, 2^n through the exponent bits: within 8e-8
// relative of exp for x <= 88.37 (2^n must be a normal float). x is first clamped at -87.3, so
// such terms come out as about 1e-38 instead of 0, far below the rounding of any sum they join;
// the clamp is a loop of its own (inside the exp's loop GCC splits the clamped path off and
// stops vectorising). in and out may be the same array.
#include <cstdint>
#include <cstring>

namespace so::cpu {

inline void exp_shifted(float* out, const float* in, float shift, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = in[i] - shift;
    out[i] = x < -87.3f ? -87.3f : x;
  }
  for (int64_t i = 0; i < n; ++i) {
    const float x = out[i];
    // Round to nearest by the 1.5 * 2^23 trick (no rounding instruction needed to vectorise).
    const float k = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float r = (x - k * 0.693359375f) + k * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    // NaN (a diverged logit) must come out NaN, through a defined conversion: k of 0 there,
    // and p is NaN already.
    const int32_t bits = (static_cast<int32_t>(k == k ? k : 0.0f) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof scale);
    out[i] = p * scale;
  }
}

}  // namespace so::cpu
