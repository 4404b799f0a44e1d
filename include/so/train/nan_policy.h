#pragma once
// What the loop does about bad steps. A step with non-finite gradients is skipped (the engine
// changes nothing); a run whose steps stay non-finite only burns time, so after
// max_consecutive_skips of them in a row it is stopped with an error (Megatron stops at the first
// NaN, DeepSpeed's fp16 loss scaler gives up at its minimum scale). A loss far above its recent
// mean (a loss spike) is reported, so it is seen in a long log.
#include <cstdint>
#include <deque>
#include <string>

namespace so {

struct NanPolicyConfig {
  int64_t max_consecutive_skips = 10;  // train.max_consecutive_skipped_steps; 0 = never stop
  double spike_factor = 0.0;           // train.loss_spike_factor: report loss > factor x recent mean; 0 = off
  int64_t spike_window = 100;          // train.loss_spike_window: steps in that mean
};

class StepGuard {
 public:
  explicit StepGuard(const NanPolicyConfig& cfg) : cfg_(cfg) {}
  struct Verdict {
    std::string warning;  // a loss spike; empty = none
    std::string stop;     // why the run must stop; empty = go on
  };
  // After each step, with the step's global loss and whether it was skipped.
  Verdict observe(int64_t step, double loss, bool skipped);
  // Whether the next step would stop the run if it were skipped (the loop then reads that step's
  // result at once rather than one step late, so a stop comes at the step it always came).
  bool stops_if_skipped() const {
    return cfg_.max_consecutive_skips > 0 && skipped_in_a_row_ + 1 >= cfg_.max_consecutive_skips;
  }

 private:
  NanPolicyConfig cfg_;
  int64_t skipped_in_a_row_ = 0;
  std::deque<double> recent_;  // the last spike_window finite losses
  double recent_sum_ = 0.0;
};

}  // namespace so
