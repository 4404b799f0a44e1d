#pragma once
// Deterministic, stateless sampling: sample i is a window of seq_len + 1 tokens starting at a
// position that is a pure function of (seed, i). The data position is just the next sample
// index, so resuming (or resharding) needs only that one number.
#include <cstdint>
#include <memory>
#include <vector>

#include "so/data/sample_stream.h"
#include "so/data/token_batch.h"
#include "so/data/token_source.h"

namespace so {

class BatchSampler final : public SampleStream {
 public:
  BatchSampler(const TokenSource& source, int64_t seq_len, int64_t micro_batch, int64_t vocab_size, uint64_t seed);

  // The micro-batch made of samples [first, first + micro_batch).
  TokenBatch batch_at(int64_t first_sample) const override;
  // Every token of a window is a label.
  int64_t supervised_tokens(int64_t, int64_t count) const override { return count * seq_len_; }
  int64_t samples_per_epoch() const override { return 0; }
  std::string describe() const override { return source_.describe(); }
  // The window of sample `sample` as the sequence at offset `at` of b (grown to fit).
  void window_into(int64_t sample, TokenBatch& b, int64_t at) const;
  // The next micro-batch at the current position; advances it.
  TokenBatch next();
  int64_t position() const { return position_; }
  void set_position(int64_t p) { position_ = p; }

 private:
  const TokenSource& source_;
  int64_t seq_len_, micro_batch_, vocab_size_;
  uint64_t seed_;
  int64_t position_ = 0;
};

// Megatron's blends (--data-path W1 P1 W2 P2 ...): sample i is a window of dataset k, drawn with
// probability weight_k from a counter-based uniform of (seed, i), so the mix holds over any span
// and the position stays the only state.
class BlendedSampler final : public SampleStream {
 public:
  BlendedSampler(std::vector<std::unique_ptr<BatchSampler>> parts, std::vector<double> weights, int64_t micro_batch,
                 int64_t seq_len, uint64_t seed);
  TokenBatch batch_at(int64_t first_sample) const override;
  int64_t supervised_tokens(int64_t, int64_t count) const override { return count * seq_len_; }
  int64_t samples_per_epoch() const override { return 0; }
  std::string describe() const override;
  // Which dataset sample i reads.
  size_t part_of(int64_t sample) const;

 private:
  std::vector<std::unique_ptr<BatchSampler>> parts_;
  std::vector<double> cumulative_;
  int64_t micro_batch_, seq_len_;
  uint64_t seed_;
};

// Ulysses: part `part` of `parts` contiguous slices of every sequence (inputs, targets and the
// global positions RoPE needs); doc_start and padding_start stay whole rows, as attention sees
// them after the all-to-all. seq_len must be divisible by parts.
TokenBatch slice_sequences(const TokenBatch& batch, int64_t seq_len, int parts, int part);

}  // namespace so
