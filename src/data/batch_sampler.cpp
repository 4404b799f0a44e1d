#include "so/data/batch_sampler.h"

#include <algorithm>
#include <cmath>

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
  TokenBatch b;
  b.first_sample = first_sample;
  for (int64_t i = 0; i < micro_batch_; ++i) window_into(first_sample + i, b, i * seq_len_);
  return b;
}

void BatchSampler::window_into(int64_t sample, TokenBatch& b, int64_t at) const {
  const int64_t S = seq_len_;
  const uint64_t starts = static_cast<uint64_t>(source_.size() - S);  // valid window starts
  const std::vector<int64_t>* docs = source_.document_offsets();
  for (std::vector<int32_t>* v : {&b.inputs, &b.targets, &b.positions})
    if (static_cast<int64_t>(v->size()) < at + S) v->resize(at + S);
  if (docs && static_cast<int64_t>(b.doc_start.size()) < at + S) b.doc_start.resize(at + S);
  std::vector<int32_t> window(S + 1);
  const int64_t start = static_cast<int64_t>(random_u64(seed_, 0xda7a, static_cast<uint64_t>(sample)) % starts);
  source_.read(start, S + 1, window.data());
  for (int64_t t = 0; t <= S; ++t)
    SO_CHECK(window[t] >= 0 && window[t] < vocab_size_, source_.describe(), ": token ", window[t], " at index ",
             start + t, " is outside the model's vocabulary [0, ", vocab_size_, ")");
  // With documents: the window's part of each one starts its positions at 0 (Megatron's
  // reset_position_ids / reset_attention_mask); the targets run on across them as in Megatron.
  auto next_doc = docs ? std::upper_bound(docs->begin(), docs->end(), start) : std::vector<int64_t>::const_iterator();
  int64_t doc = 0;  // the current document's first token, within the window
  for (int64_t t = 0; t < S; ++t) {
    if (docs && next_doc != docs->end() && *next_doc == start + t) doc = t, ++next_doc;
    b.inputs[at + t] = window[t];
    b.targets[at + t] = window[t + 1];
    b.positions[at + t] = static_cast<int32_t>(t - doc);
    if (docs) b.doc_start[at + t] = static_cast<int32_t>(doc);
  }
}

BlendedSampler::BlendedSampler(std::vector<std::unique_ptr<BatchSampler>> parts, std::vector<double> weights,
                               int64_t micro_batch, int64_t seq_len, uint64_t seed)
    : parts_(std::move(parts)), micro_batch_(micro_batch), seq_len_(seq_len), seed_(seed) {
  SO_CHECK(!parts_.empty() && parts_.size() == weights.size(), "a blend needs one weight per dataset");
  for (double w : weights) SO_CHECK(w > 0.0 && std::isfinite(w), "blend weight ", w, " must be positive and finite");
  // Relative to the largest weight first: the sum of weights near 1e308 would overflow to
  // infinity (and every share but the last read as 0); the sum of these is at most their count.
  const double largest = *std::max_element(weights.begin(), weights.end());
  double total = 0.0;
  for (double w : weights) total += w / largest;
  for (double w : weights)
    cumulative_.push_back((cumulative_.empty() ? 0.0 : cumulative_.back()) + w / largest / total);
  cumulative_.back() = 1.0;
}

size_t BlendedSampler::part_of(int64_t sample) const {
  const double u = random_uniform(seed_, 0xb1e2d, static_cast<uint64_t>(sample));
  return static_cast<size_t>(std::upper_bound(cumulative_.begin(), cumulative_.end(), u) - cumulative_.begin());
}

TokenBatch BlendedSampler::batch_at(int64_t first_sample) const {
  TokenBatch b;
  b.first_sample = first_sample;
  for (int64_t i = 0; i < micro_batch_; ++i)
    parts_[std::min(part_of(first_sample + i), parts_.size() - 1)]->window_into(first_sample + i, b, i * seq_len_);
  // A part without documents writes no doc_start: its rows stay 0 (one document each).
  if (!b.doc_start.empty()) b.doc_start.resize(micro_batch_ * seq_len_, 0);
  return b;
}

std::string BlendedSampler::describe() const {
  std::string s = "blend of";
  for (size_t k = 0; k < parts_.size(); ++k)
    s += str_cat(k ? ", " : " ", parts_[k]->describe(), " (", cumulative_[k] - (k ? cumulative_[k - 1] : 0.0), ")");
  return s;
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
  out.first_sample = batch.first_sample;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t from = i * seq_len + part * local;
    out.inputs.insert(out.inputs.end(), batch.inputs.begin() + from, batch.inputs.begin() + from + local);
    out.targets.insert(out.targets.end(), batch.targets.begin() + from, batch.targets.begin() + from + local);
    out.positions.insert(out.positions.end(), batch.positions.begin() + from, batch.positions.begin() + from + local);
  }
  out.doc_start = batch.doc_start;  // attention runs over whole rows (after the all-to-all)
  out.padding_start = batch.padding_start;
  return out;
}

}  // namespace so
