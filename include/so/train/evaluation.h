#pragma once
// Validation loss: a forward pass (no backward) over every row of the validation split, each
// data-parallel rank taking its share and each sequence-parallel rank its slice; the mean over
// the split's supervised tokens, its perplexity, and how many there were.
#include <cstdint>

#include "parallel/communicator.h"
#include "so/data/sample_stream.h"
#include "so/model/decoder_model.h"

namespace so {

struct Evaluation {
  double loss = 0.0, perplexity = 0.0;
  int64_t supervised_tokens = 0;
};

struct EvaluationShare {
  int64_t micro_batch = 1, seq_len = 0;
  int dp_size = 1, dp_rank = 0, sp_size = 1, sp_rank = 0;
};

// The model reads its weights through params/hooks as in training (the engine waits for the last
// step's weights); the data-parallel sum goes over `dp`.
Evaluation evaluate(DecoderModel& model, ParamStore& params, ModelHooks& hooks, const SampleStream& validation,
                    const EvaluationShare& share, Communicator& world);

}  // namespace so
