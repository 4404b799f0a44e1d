#pragma once
// One micro-batch on the host, as the data path makes it and the model consumes it.
#include <cstdint>
#include <vector>

namespace so {

// B*S input ids, targets (-1 = ignore) and RoPE positions.
// doc_start (B*S, or empty when every row is one document): for each token, the index within its
// row of the first token of its document. Attention is causal within a document only (packed
// rows); positions restart at each document's start. Under Ulysses a rank's inputs, targets and
// positions are its slice of each row, doc_start stays whole rows (slice_sequences): attention
// runs over every token of a row.
struct TokenBatch {
  std::vector<int32_t> inputs, targets, positions, doc_start;
  // Per sequence, the index of its first padding token (its length when it has none); attention
  // hides the keys from there on (AttentionMask::key_end). Empty: no padding.
  std::vector<int32_t> padding_start;
  int64_t first_sample = 0;  // the run's index of its first sequence: names its tokens in dropout masks
};

}  // namespace so
