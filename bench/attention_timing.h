#pragma once
// Causal attention forward and backward timed through a backend's ops (so_bench attention, and
// the attention rows of so_bench ops): random inputs, rows unpacked or packed with equal
// documents, FLOPs counted for the (query, key) pairs the mask lets through.
#include <cstddef>
#include <cstdint>
#include <string>

#include "so/backend/backend.h"

namespace so::bench {

struct AttentionCase {
  int64_t B = 1, S = 1, Hq = 1, Hkv = 1, D = 1;
  // Documents per row (1: unpacked). docs > 1 packs each row with `docs` documents of S / docs
  // tokens (the last one takes the remainder), as AttentionMask::doc_start says.
  int64_t docs = 1;
  DType dt = DType::BF16;
};

// The forward's FLOPs: 4 * B * Hq * D * (sum over documents of L^2) / 2 (causal, within
// documents); the backward is counted as 2.5x that.
double attention_forward_flop(const AttentionCase& a);

struct AttentionTiming {
  std::string implementation;  // Ops::attention_implementation for this shape and mask
  std::string refused;         // why the backend refuses the shape (nothing timed); empty: timed
  double forward_ms = 0, backward_ms = 0, forward_flop = 0;
  size_t memory_peak = 0, tensor_bytes = 0;  // the backend's pool peak; the inputs and outputs
};

// Median times of `iters` runs after `warmup` on be's compute stream; where the backend refuses
// the shape (backend.attention=cudnn where cuDNN cannot take it), only `refused`, saying why.
AttentionTiming time_attention(Backend& be, const AttentionCase& a, int warmup, int iters);

}  // namespace so::bench
