#include "so/train/nan_policy.h"

#include <cmath>

#include "so/core/error.h"

namespace so {

StepGuard::Verdict StepGuard::observe(int64_t step, double loss, bool skipped) {
  Verdict v;
  skipped_in_a_row_ = skipped ? skipped_in_a_row_ + 1 : 0;
  if (cfg_.max_consecutive_skips > 0 && skipped_in_a_row_ >= cfg_.max_consecutive_skips)
    v.stop =
        str_cat("steps ", step - skipped_in_a_row_ + 1, " to ", step, " (", skipped_in_a_row_,
                " in a row, train.max_consecutive_skipped_steps) had non-finite gradients and were skipped: the run "
                "has diverged; the state is still that of step ",
                step - skipped_in_a_row_, " (resume from a checkpoint with a lower learning rate)");
  if (skipped || !std::isfinite(loss) || cfg_.spike_factor <= 0) return v;
  // Against a full window only: the first steps' losses fall too fast for a mean to mean anything.
  if (static_cast<int64_t>(recent_.size()) == cfg_.spike_window) {
    const double mean = recent_sum_ / static_cast<double>(recent_.size());
    if (loss > cfg_.spike_factor * mean)
      v.warning = str_cat("loss spike at step ", step, ": ", loss, " is ", loss / mean, " x the mean of the last ",
                          recent_.size(), " steps (", mean, "; train.loss_spike_factor ", cfg_.spike_factor, ")");
    recent_sum_ -= recent_.front();
    recent_.pop_front();
  }
  recent_.push_back(loss);
  recent_sum_ += loss;
  return v;
}

}  // namespace so
