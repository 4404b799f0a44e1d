#pragma once
// What the training loop draws samples from: a stream of samples numbered from 0 across the
// whole run (the data position a checkpoint stores is the next number), read a micro-batch at a
// time, with how many supervised labels any range of them holds (the loss is normalised by it).
#include <cstdint>
#include <string>

#include "so/data/token_batch.h"

namespace so {

class SampleStream {
 public:
  virtual ~SampleStream() = default;
  // The micro-batch made of samples [first, first + micro_batch).
  virtual TokenBatch batch_at(int64_t first_sample) const = 0;
  // Labels (targets >= 0) in samples [first, first + count).
  virtual int64_t supervised_tokens(int64_t first_sample, int64_t count) const = 0;
  // Samples in one epoch; 0 where there are no epochs (windows drawn at random, with replacement).
  virtual int64_t samples_per_epoch() const = 0;
  virtual std::string describe() const = 0;
};

}  // namespace so
