#include "so/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace so {

namespace {
// DeepSpeed's Warmup* family (WarmupLR, WarmupDecayLR, WarmupCosineLR in lr_schedules.py): get_lr()
// at last_batch_iteration = step - 1, DeepSpeed's engine calling the scheduler's step() after each
// optimizer step; the first step runs with what the constructor sets, get_lr() at -1 (warmup_min_lr;
// WarmupCosineLR: 0). The warm-up lasts max(2, warmup_num_steps) steps, as DeepSpeed clamps it.
double warmup_gamma(const LrSchedule& s, int64_t last, int64_t warmup) {
  if (s.warmup_type == "linear") return static_cast<double>(last) / static_cast<double>(warmup);
  return std::log(static_cast<double>(last + 1)) / std::log(static_cast<double>(warmup));
}

double warmup_family(const LrSchedule& s, int64_t step) {
  const int64_t last = step - 1, warmup = std::max<int64_t>(2, s.warmup_steps);
  if (s.type == "WarmupCosineLR") {
    if (last < 0) return 0.0;
    if (last < warmup)
      return s.base_lr * (s.warmup_min_ratio + (1.0 - s.warmup_min_ratio) * warmup_gamma(s, last, warmup));
    // Not clamped at total_num_steps: past it the cosine rises again, as DeepSpeed's does.
    const double done = static_cast<double>(last - warmup + 1), span = static_cast<double>(s.total_steps - warmup);
    const double cosine = (1.0 + std::cos(M_PI * done / span)) / 2.0;
    return s.base_lr * std::max(0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * cosine);
  }
  if (last < 0) return s.warmup_min_lr;
  double gamma = 1.0;  // WarmupLR after its warm-up
  if (last < warmup)
    gamma = warmup_gamma(s, last, warmup);
  else if (s.type == "WarmupDecayLR")
    gamma = std::max(
        0.0, static_cast<double>(s.total_steps - last) / std::max(1.0, static_cast<double>(s.total_steps - warmup)));
  return s.warmup_min_lr + (s.warmup_max_lr - s.warmup_min_lr) * gamma;
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
  return warmup_family(*this, step);  // WarmupLR, WarmupDecayLR, WarmupCosineLR
}

}  // namespace so
