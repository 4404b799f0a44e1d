#include "so/train/loss_normalization.h"

namespace so {

std::vector<float> micro_batch_loss_scales(const SampleStream& data, int64_t first, int64_t micro_batch,
                                           int64_t accumulation, int dp_size, int dp_rank, LossNormalization mode) {
  std::vector<float> scales(static_cast<size_t>(accumulation), 0.0f);
  // Every rank counts the whole step from the same deterministic stream: no collective needed.
  const int64_t step_tokens = data.supervised_tokens(first, accumulation * dp_size * micro_batch);
  for (int64_t m = 0; m < accumulation; ++m) {
    const int64_t mine = data.supervised_tokens(first + (m * dp_size + dp_rank) * micro_batch, micro_batch);
    if (mode == LossNormalization::Step) {
      if (step_tokens > 0) scales[m] = 1.0f / static_cast<float>(step_tokens);
    } else if (mine > 0) {
      scales[m] = 1.0f / static_cast<float>(mine * accumulation * dp_size);
    }
  }
  return scales;
}

}  // namespace so
