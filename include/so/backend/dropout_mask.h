#pragma once
// Residual dropout's keep mask, counter-based: whether element (token, channel) of a mask is kept
// is a hash of (mask key, token, channel) alone. Every backend, MLP tile, recompute and Ulysses
// shard that touches an element draws the same bit, and there is no generator state to carry
// across steps, ranks or a resume. CPU and CUDA kernels share these functions.
#include <cstdint>

#include "so/core/host_device.h"

namespace so {

// One mask over a micro-batch's rows (tokens, sequence-major [B, seq_local]) and a block of them.
// A token is named by where it sits in the run, not on this rank: sample first_sample + b of the
// run (the trainer's sample counter, so data-parallel ranks and micro-batches differ and a resume
// continues), position seq_offset + s of its sequence of seq_global tokens (Ulysses: this rank
// holds positions [seq_offset, seq_offset + seq_local)).
struct DropoutMask {
  float p = 0.0f;    // drop probability, in [0, 1)
  uint64_t key = 0;  // which mask: run seed, layer and site (dropout_key)
  int64_t first_sample = 0;
  int64_t seq_local = 1, seq_global = 1, seq_offset = 0;
  int64_t row0 = 0;  // the block's first row among the micro-batch's rows

  // Kept when the hash's top 24 bits are >= p * 2^24; kept values are scaled by 1 / (1 - p).
  uint32_t threshold() const { return static_cast<uint32_t>(static_cast<double>(p) * (1u << 24)); }
  float scale() const { return static_cast<float>(1.0 / (1.0 - static_cast<double>(p))); }
};

// splitmix64's finaliser: a bijection on 64 bits whose output bits all depend on every input bit.
SO_HOST_DEVICE inline uint64_t dropout_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline uint64_t dropout_key(uint64_t seed, uint64_t layer, uint64_t site) {
  return dropout_mix(dropout_mix(dropout_mix(seed) ^ layer) ^ (site + 0x9e3779b97f4a7c15ull));
}

// The run-wide token of row `row` (of the micro-batch) of mask m.
SO_HOST_DEVICE inline uint64_t dropout_token(const DropoutMask& m, int64_t row) {
  const int64_t b = row / m.seq_local, s = row % m.seq_local;
  return static_cast<uint64_t>((m.first_sample + b) * m.seq_global + m.seq_offset + s);
}

SO_HOST_DEVICE inline bool dropout_keep(uint64_t key, uint64_t token, uint64_t channel, uint32_t threshold) {
  const uint64_t row = dropout_mix(key ^ (token * 0x9e3779b97f4a7c15ull));
  return static_cast<uint32_t>(dropout_mix(row + channel * 0xd1b54a32d192ed03ull) >> 40) >= threshold;
}

// Attention-probability dropout's keep bit of P[query i, key j] of sample `sample` of the run
// and head `head`: the GLOBAL head index, so Ulysses ranks, each holding a block of heads, draw
// what one rank draws. Attention sees whole sequences of S tokens: the query is the token residual
// dropout names (dropout_token), the channel is (head, key position).
SO_HOST_DEVICE inline bool attention_dropout_keep(uint64_t key, int64_t sample, int64_t S, int64_t i, int64_t head,
                                                  int64_t j, uint32_t threshold) {
  return dropout_keep(key, static_cast<uint64_t>(sample * S + i), static_cast<uint64_t>(head * S + j), threshold);
}

}  // namespace so
