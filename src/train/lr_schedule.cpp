#include "so/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace so {

namespace {
// DeepSpeed's warm-up shape: log(step+1)/log(warmup) or step/warmup.
double warmup_fraction(const LrSchedule& s, int64_t step) {
  if (s.warmup_steps <= 0) return 1.0;
  if (s.warmup_type == "linear") return static_cast<double>(step) / s.warmup_steps;
  if (s.warmup_steps <= 1) return 1.0;
  return std::log(static_cast<double>(step + 1)) / std::log(static_cast<double>(s.warmup_steps));
}
}  // namespace

double LrSchedule::lr_at(int64_t step) const {
  if (type == "constant") return base_lr;
  if (type == "WarmupLR") {
    if (step >= warmup_steps) return warmup_max_lr;
    return warmup_min_lr + (warmup_max_lr - warmup_min_lr) * warmup_fraction(*this, step);
  }
  if (type == "WarmupDecayLR") {
    if (step < warmup_steps) return warmup_min_lr + (warmup_max_lr - warmup_min_lr) * warmup_fraction(*this, step);
    const double remaining = static_cast<double>(total_steps - step) / std::max<int64_t>(1, total_steps - warmup_steps);
    return warmup_max_lr * std::max(0.0, remaining);
  }
  // WarmupCosineLR: ratios of base_lr.
  if (step < warmup_steps)
    return base_lr * (warmup_min_ratio + (1.0 - warmup_min_ratio) * warmup_fraction(*this, step));
  const double done = static_cast<double>(step - warmup_steps + 1);
  const double span = static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  const double cosine = (1.0 + std::cos(M_PI * std::min(1.0, done / span))) / 2.0;
  return base_lr * std::max(0.0, cos_min_ratio + (1.0 - cos_min_ratio) * cosine);
}

}  // namespace so
