#include "so/train/evaluation.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "so/core/error.h"
#include "so/data/batch_sampler.h"

namespace so {

Evaluation evaluate(DecoderModel& model, ParamStore& params, ModelHooks& hooks, const SampleStream& validation,
                    const EvaluationShare& s, Communicator& world) {
  // Tests make an evaluation fail after every split passed its start-up checks (the run must keep
  // the steps it trained).
  SO_CHECK(std::getenv("SO_TEST_EVALUATION_FAILS") == nullptr, "evaluation on ", validation.describe(),
           " failed: SO_TEST_EVALUATION_FAILS is set");
  const int64_t rows = validation.samples_per_epoch(), per_round = s.micro_batch * s.dp_size;
  double sums[2] = {0.0, 0.0};  // token losses, supervised tokens
  model.zero_loss();
  // Rounds of dp_size micro-batches; the last round's samples past the split (which would wrap
  // into a second epoch) are read but masked out, so every row counts exactly once.
  for (int64_t first = 0; first < rows; first += per_round) {
    const int64_t mine = first + s.dp_rank * s.micro_batch;
    TokenBatch b = validation.batch_at(mine);
    for (int64_t i = 0; i < s.micro_batch; ++i)
      if (mine + i >= rows) std::fill(b.targets.begin() + i * s.seq_len, b.targets.begin() + (i + 1) * s.seq_len, -1);
    const TokenBatch slice = slice_sequences(b, s.seq_len, s.sp_size, s.sp_rank);
    sums[1] += static_cast<double>(
        std::count_if(slice.targets.begin(), slice.targets.end(), [](int32_t t) { return t >= 0; }));
    model.forward_backward(slice, params, hooks, 1.0f, false);
  }
  sums[0] = model.read_loss();
  model.zero_loss();
  world.all_reduce_sum(sums, 2);
  Evaluation e;
  e.supervised_tokens = static_cast<int64_t>(sums[1]);
  e.loss = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
  e.perplexity = std::exp(e.loss);
  return e;
}

}  // namespace so
