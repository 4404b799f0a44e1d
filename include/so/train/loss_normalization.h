#pragma once
// What a step's loss is the mean over. "step" (the default, as transformers does with
// num_items_in_batch): every supervised token of the optimizer step, across its micro-batches and
// the data-parallel ranks, weighs the same. "micro_batch" (DeepSpeed's engine): each micro-batch's
// own mean, averaged over the micro-batches and ranks. A step or micro-batch without a supervised
// token contributes nothing (scale 0), never a division by zero.
#include <cstdint>
#include <vector>

#include "so/data/sample_stream.h"

namespace so {

enum class LossNormalization { Step, MicroBatch };

// The loss scale of each of this rank's micro-batches of the step that starts at global sample
// `first` (micro-batch m of rank r reads samples first + (m * dp_size + r) * micro_batch onwards).
std::vector<float> micro_batch_loss_scales(const SampleStream& data, int64_t first, int64_t micro_batch,
                                           int64_t accumulation, int dp_size, int dp_rank, LossNormalization mode);

}  // namespace so
