#pragma once
// Epochs over the rows of a prepared split: global sample i is row perm_e[i mod N] of epoch
// e = i / N, perm_e a shuffle that is a pure function of (seed, e). Each row is seen once per
// epoch, in a new order each epoch, and the position (the next sample index) is the whole state:
// a run resumed mid-epoch reads the very rows the uninterrupted one would have.
#include <cstdint>
#include <vector>

#include "so/data/prepared_data.h"
#include "so/data/sample_stream.h"

namespace so {

class EpochSampler final : public SampleStream {
 public:
  EpochSampler(const PreparedSplit& split, int64_t micro_batch, int64_t vocab_size, uint64_t seed);
  TokenBatch batch_at(int64_t first_sample) const override;
  int64_t supervised_tokens(int64_t first_sample, int64_t count) const override;
  int64_t samples_per_epoch() const override { return split_.rows(); }
  std::string describe() const override { return split_.describe(); }
  // The row sample i reads.
  int64_t row_of(int64_t sample) const;

 private:
  const PreparedSplit& split_;
  int64_t micro_batch_, vocab_size_;
  uint64_t seed_;
  mutable int64_t epoch_ = -1;  // the epoch whose permutation perm_ holds
  mutable std::vector<int64_t> perm_;
};

}  // namespace so
