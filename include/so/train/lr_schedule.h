#pragma once
// Learning-rate schedules with DeepSpeed's names and meanings (scheduler.type / .params), and WSD
// with Hugging Face's (transformers.get_wsd_schedule).
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace so {

struct LrSchedule {
  // constant | WarmupLR | WarmupCosineLR | WarmupDecayLR | OneCycle | LRRangeTest | WSD
  std::string type = "constant";
  double base_lr = 1e-3;  // optimizer.params.lr (WarmupCosineLR's and WSD's peak)
  int64_t warmup_steps = 0;
  // DeepSpeed: log | linear (its default log); WSD: linear | cosine | 1-sqrt (HF's default linear)
  std::string warmup_type = "log";
  double warmup_min_lr = 0.0;  // WarmupLR / WarmupDecayLR
  double warmup_max_lr = 1e-3;
  double warmup_min_ratio = 0.0;  // WarmupCosineLR
  double cos_min_ratio = 0.0001;
  int64_t total_steps = 0;  // WarmupCosineLR / WarmupDecayLR

  // WSD: warmup_steps, then stable_steps at base_lr, then decay_steps down to min_lr_ratio x base_lr
  // (decay_type linear | cosine | 1-sqrt; cosine over num_cycles periods, HF's 0.5 = half a period).
  int64_t stable_steps = 0, decay_steps = 0;
  std::string decay_type = "cosine";
  double min_lr_ratio = 0.0, num_cycles = 0.5;

  // OneCycle: cycle_min_lr -> cycle_max_lr over cycle_first_step_size steps, back over
  // cycle_second_step_size, then cycle_min_lr / (1 + decay_lr_rate x steps / decay_step_size)
  // (decay_step_size 0: stays at cycle_min_lr).
  double cycle_min_lr = 0.0, cycle_max_lr = 0.0, decay_lr_rate = 0.0;
  double cycle_first_step_size = 2000, cycle_second_step_size = 2000;
  int64_t decay_step_size = 0;
  // OneCycle's cycle_momentum: Adam's beta1 cycled inversely to the lr, from cycle_max_mom down to
  // cycle_min_mom and back, beta2 set to 0.99 (DeepSpeed's fixed second value); the first step runs
  // at (cycle_min_mom, 0.99), as DeepSpeed's constructor sets it, and after the cycle at cycle_max_mom.
  bool cycle_momentum = false;
  double cycle_min_mom = 0.8, cycle_max_mom = 0.9;

  // LRRangeTest: lr_range_test_min_lr x (1 + step_rate x step / step_size), step / step_size
  // floored when staircase.
  double range_min_lr = 1e-3, range_step_size = 2000, range_step_rate = 1.0;
  bool range_staircase = false;

  // Learning rate of optimizer step `step` (0-based: the number of steps already applied). For
  // DeepSpeed's schedules that is get_lr() with last_batch_iteration = step - 1 (their constructors
  // set the first step's lr, DeepSpeed's engine calls step() after each optimizer step); for WSD the
  // LambdaLR factor of step `step` times base_lr.
  double lr_at(int64_t step) const;
  // Adam's (beta1, beta2) of optimizer step `step` when the schedule sets them (OneCycle with
  // cycle_momentum); none: optimizer.params.betas.
  std::optional<std::pair<double, double>> betas_at(int64_t step) const;
};

}  // namespace so
