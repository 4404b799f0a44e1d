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

// transformers' _get_wsd_scheduler_lambda, term for term.
double wsd_factor(const LrSchedule& s, int64_t step) {
  const auto ramp = [&](double factor) { return std::max(0.0, factor * (1.0 - s.min_lr_ratio) + s.min_lr_ratio); };
  if (step < s.warmup_steps) {
    const double progress = static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, s.warmup_steps));
    if (s.warmup_type == "linear") return ramp(progress);
    if (s.warmup_type == "cosine") return ramp(0.5 * (1.0 - std::cos(M_PI * progress)));
    return ramp(1.0 - std::sqrt(1.0 - progress));  // 1-sqrt
  }
  if (step < s.warmup_steps + s.stable_steps) return 1.0;
  if (step < s.warmup_steps + s.stable_steps + s.decay_steps) {
    const double progress = static_cast<double>(step - s.warmup_steps - s.stable_steps) /
                            static_cast<double>(std::max<int64_t>(1, s.decay_steps));
    if (s.decay_type == "linear") return ramp(1.0 - progress);
    if (s.decay_type == "cosine") return ramp(0.5 * (1.0 + std::cos(M_PI * s.num_cycles * 2.0 * progress)));
    return ramp(1.0 - std::sqrt(progress));  // 1-sqrt
  }
  return s.min_lr_ratio;
}

// OneCycle's _get_scale_factor() with last_batch_iteration = step - 1: 0 -> 1 -> 0 over the cycle.
double one_cycle_scale(const LrSchedule& s, int64_t step) {
  const double total = s.cycle_first_step_size + s.cycle_second_step_size;
  const double ratio = s.cycle_first_step_size / total;
  const double batch = static_cast<double>(step);
  const double cycle = std::floor(1.0 + batch / total);
  const double x = 1.0 + batch / total - cycle;
  return x <= ratio ? x / ratio : (x - 1.0) / (ratio - 1.0);
}

bool in_cycle(const LrSchedule& s, int64_t step) {
  return static_cast<double>(step - 1) < s.cycle_first_step_size + s.cycle_second_step_size;
}

// DeepSpeed's OneCycle.get_lr() with last_batch_iteration = step - 1.
double one_cycle(const LrSchedule& s, int64_t step) {
  const double total = s.cycle_first_step_size + s.cycle_second_step_size;
  const int64_t last = step - 1;
  if (in_cycle(s, step)) return s.cycle_min_lr + (s.cycle_max_lr - s.cycle_min_lr) * one_cycle_scale(s, step);
  if (s.decay_step_size == 0) return s.cycle_min_lr;
  const double decay_interval = (static_cast<double>(last) - total + 1.0) / static_cast<double>(s.decay_step_size);
  return s.cycle_min_lr / (1.0 + s.decay_lr_rate * decay_interval);
}

// DeepSpeed's LRRangeTest.get_lr() with last_batch_iteration = step - 1.
double range_test(const LrSchedule& s, int64_t step) {
  const double interval = static_cast<double>(step) / s.range_step_size;
  return s.range_min_lr * (1.0 + s.range_step_rate * (s.range_staircase ? std::floor(interval) : interval));
}
}  // namespace

std::optional<std::pair<double, double>> LrSchedule::betas_at(int64_t step) const {
  if (type != "OneCycle" || !cycle_momentum) return std::nullopt;
  constexpr double kBeta2 = 0.99;  // DeepSpeed's OneCycle sets betas to (momentum, 0.99)
  if (step == 0) return std::make_pair(cycle_min_mom, kBeta2);
  if (!in_cycle(*this, step)) return std::make_pair(cycle_max_mom, kBeta2);  // decay_mom_rate 0: no decay
  return std::make_pair(cycle_max_mom - (cycle_max_mom - cycle_min_mom) * one_cycle_scale(*this, step), kBeta2);
}

double LrSchedule::lr_at(int64_t step) const {
  if (type == "constant") return base_lr;
  if (type == "WSD") return base_lr * wsd_factor(*this, step);
  if (type == "OneCycle") return one_cycle(*this, step);
  if (type == "LRRangeTest") return range_test(*this, step);
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
