#include "so/data/epoch_sampler.h"

#include <numeric>

#include "so/core/error.h"
#include "so/core/random.h"

namespace so {

EpochSampler::EpochSampler(const PreparedSplit& split, int64_t micro_batch, int64_t vocab_size, uint64_t seed)
    : split_(split), micro_batch_(micro_batch), vocab_size_(vocab_size), seed_(seed) {}

int64_t EpochSampler::row_of(int64_t sample) const {
  SO_CHECK(sample >= 0, "sample index ", sample, " is negative");
  const int64_t n = split_.rows(), epoch = sample / n;
  if (epoch != epoch_) {  // Fisher-Yates with counter-based draws: the same order on every rank and run
    perm_.resize(n);
    std::iota(perm_.begin(), perm_.end(), int64_t{0});
    for (int64_t i = n - 1; i > 0; --i) {
      const uint64_t j =
          random_u64(seed_ ^ static_cast<uint64_t>(epoch) * 0x9e3779b97f4a7c15ull, 0xe90c, static_cast<uint64_t>(i)) %
          static_cast<uint64_t>(i + 1);
      std::swap(perm_[i], perm_[j]);
    }
    epoch_ = epoch;
  }
  return perm_[sample % n];
}

TokenBatch EpochSampler::batch_at(int64_t first_sample) const {
  TokenBatch b;
  for (int64_t i = 0; i < micro_batch_; ++i) split_.read_row(row_of(first_sample + i), b, i * split_.row_length());
  for (size_t t = 0; t < b.inputs.size(); ++t)
    SO_CHECK(b.inputs[t] >= 0 && b.inputs[t] < vocab_size_, split_.describe(), ": token ", b.inputs[t],
             " is outside the model's vocabulary [0, ", vocab_size_, ")");
  return b;
}

int64_t EpochSampler::supervised_tokens(int64_t first_sample, int64_t count) const {
  int64_t n = 0;
  for (int64_t i = 0; i < count; ++i) n += split_.supervised(row_of(first_sample + i));
  return n;
}

}  // namespace so
