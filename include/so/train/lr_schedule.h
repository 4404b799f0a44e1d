#pragma once
// Learning-rate schedules with DeepSpeed's names and meanings (scheduler.type / .params).
#include <cstdint>
#include <string>

namespace so {

struct LrSchedule {
  std::string type = "constant";  // constant | WarmupLR | WarmupCosineLR | WarmupDecayLR
  double base_lr = 1e-3;          // optimizer.params.lr
  int64_t warmup_steps = 0;
  std::string warmup_type = "log";  // log | linear (DeepSpeed's default is log)
  double warmup_min_lr = 0.0;     // WarmupLR / WarmupDecayLR
  double warmup_max_lr = 1e-3;
  double warmup_min_ratio = 0.0;  // WarmupCosineLR
  double cos_min_ratio = 0.0001;
  int64_t total_steps = 0;        // WarmupCosineLR / WarmupDecayLR

  // Learning rate of optimizer step `step` (0-based: the number of steps already applied).
  double lr_at(int64_t step) const;
};

}  // namespace so
