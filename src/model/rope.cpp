#include "so/model/rope.h"

#include <algorithm>
#include <cmath>

#include "so/core/error.h"

namespace so {

namespace {
constexpr double kPi = 3.14159265358979323846;

// yarn: the attention factor a scale gives (get_mscale in transformers).
double yarn_mscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// yarn: the dimension at which the wavelength fits num_rotations times into the original context.
double yarn_correction_dim(double num_rotations, int64_t dim, double base, double original_max) {
  return dim * std::log(original_max / (num_rotations * 2.0 * kPi)) / (2.0 * std::log(base));
}
}  // namespace

std::vector<double> rope_default_inv_freq(double theta, int64_t dim) {
  std::vector<double> inv(static_cast<size_t>(dim / 2));
  for (int64_t i = 0; i < dim / 2; ++i) inv[i] = 1.0 / std::pow(theta, static_cast<double>(2 * i) / dim);
  return inv;
}

RopeFrequencies rope_frequencies(const RopeScaling& s, double theta, int64_t head_dim) {
  RopeFrequencies r;
  r.inv_freq = rope_default_inv_freq(theta, head_dim);
  const int64_t half = head_dim / 2;
  if (s.type == "default" || s.type == "dynamic") return r;
  if (s.type == "linear") {
    for (double& f : r.inv_freq) f /= s.factor;
  } else if (s.type == "llama3") {
    // Wavelengths shorter than the original context / high_freq_factor are kept, longer than
    // context / low_freq_factor divided by factor, the band between interpolated smoothly.
    const double old_len = static_cast<double>(s.original_max_position_embeddings);
    const double low_wavelen = old_len / s.low_freq_factor, high_wavelen = old_len / s.high_freq_factor;
    for (double& f : r.inv_freq) {
      const double wavelen = 2.0 * kPi / f;
      if (wavelen > low_wavelen) {
        f /= s.factor;
      } else if (!(wavelen < high_wavelen)) {
        const double smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1.0 - smooth) * f / s.factor + smooth * f;
      }
    }
  } else if (s.type == "yarn") {
    if (s.attention_factor >= 0.0)
      r.attention_factor = s.attention_factor;
    else if (s.mscale != 0.0 && s.mscale_all_dim != 0.0)
      r.attention_factor = yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim);
    else
      r.attention_factor = yarn_mscale(s.factor, 1.0);
    const double original = static_cast<double>(s.original_max_position_embeddings);
    double low = yarn_correction_dim(s.beta_fast, head_dim, theta, original);
    double high = yarn_correction_dim(s.beta_slow, head_dim, theta, original);
    if (s.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(head_dim - 1));
    if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
    // Pairs below the ramp keep their frequency (extrapolation), pairs above it are divided by
    // factor (interpolation), those on it are blended linearly.
    for (int64_t i = 0; i < half; ++i) {
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      const double extrapolation = 1.0 - ramp;
      const double f = r.inv_freq[i];
      r.inv_freq[i] = f / s.factor * (1.0 - extrapolation) + f * extrapolation;
    }
  } else {
    SO_FAIL("rope_frequencies: RoPE type '", s.type, "' is not implemented");
  }
  return r;
}

}  // namespace so
