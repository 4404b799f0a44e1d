#include "so/data/batch_sampler.h"

#include "so/core/error.h"
#include "so/core/random.h"

namespace so {

BatchSampler::BatchSampler(const TokenSource& source, int64_t seq_len, int64_t micro_batch, int64_t vocab_size,
                           uint64_t seed)
    : source_(source), seq_len_(seq_len), micro_batch_(micro_batch), vocab_size_(vocab_size), seed_(seed) {
  SO_CHECK(source.size() >= seq_len + 1, source.describe(), " has ", source.size(), " tokens; seq_len ", seq_len,
           " needs at least ", seq_len + 1);
}

TokenBatch BatchSampler::batch_at(int64_t first_sample) const {
  const int64_t S = seq_len_;
  const uint64_t starts = static_cast<uint64_t>(source_.size() - S);  // valid window starts
  TokenBatch b;
  b.inputs.resize(micro_batch_ * S);
  b.targets.resize(micro_batch_ * S);
  b.positions.resize(micro_batch_ * S);
  std::vector<int32_t> window(S + 1);
  for (int64_t i = 0; i < micro_batch_; ++i) {
    const uint64_t sample = static_cast<uint64_t>(first_sample + i);
    const int64_t start = static_cast<int64_t>(random_u64(seed_, 0xda7a, sample) % starts);
    source_.read(start, S + 1, window.data());
    for (int64_t t = 0; t <= S; ++t)
      SO_CHECK(window[t] >= 0 && window[t] < vocab_size_, source_.describe(), ": token ", window[t],
               " at index ", start + t, " is outside the model's vocabulary [0, ", vocab_size_, ")");
    for (int64_t t = 0; t < S; ++t) {
      b.inputs[i * S + t] = window[t];
      b.targets[i * S + t] = window[t + 1];
      b.positions[i * S + t] = static_cast<int32_t>(t);
    }
  }
  return b;
}

TokenBatch BatchSampler::next() {
  TokenBatch b = batch_at(position_);
  position_ += micro_batch_;
  return b;
}

TokenBatch slice_sequences(const TokenBatch& batch, int64_t seq_len, int parts, int part) {
  SO_CHECK(parts > 0 && seq_len % parts == 0, "sequence length ", seq_len, " is not divisible by ", parts,
           " sequence-parallel ranks");
  if (parts == 1) return batch;
  const int64_t n = static_cast<int64_t>(batch.inputs.size()) / seq_len, local = seq_len / parts;
  TokenBatch out;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t from = i * seq_len + part * local;
    out.inputs.insert(out.inputs.end(), batch.inputs.begin() + from, batch.inputs.begin() + from + local);
    out.targets.insert(out.targets.end(), batch.targets.begin() + from, batch.targets.begin() + from + local);
    out.positions.insert(out.positions.end(), batch.positions.begin() + from, batch.positions.begin() + from + local);
    if (!batch.doc_start.empty())
      out.doc_start.insert(out.doc_start.end(), batch.doc_start.begin() + from, batch.doc_start.begin() + from + local);
  }
  return out;
}

}  // namespace so
