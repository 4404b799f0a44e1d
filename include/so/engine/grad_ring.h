#pragma once
// The gradient ring: device memory for the gradients of offloaded buckets, which exist on the
// device only from the moment backward first writes them (or, under ZeRO-2/3, from their
// reduce-scatter) until their copy to the host has read them. One buffer, each bucket at a fixed
// offset planned once from the order in which backward first writes and completes the buckets, so
// the memory planner computes the very bytes the engine allocates. A bucket's range is reused by a
// later bucket only after `depth` - 1 more buckets have completed: its copy has that long before
// the next writer waits for it, on a stream (the host never waits for a copy here).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "so/engine/bucket.h"
#include "so/engine/shard_layout.h"
#include "so/model/param_layout.h"

namespace so {

// One offloaded bucket passing through the ring in a backward pass: its bytes, the unit whose
// backward first writes it and the unit after whose backward it is complete (backward visits units
// from the head down to the embedding, so touch_unit >= ready_unit).
struct GradRingUse {
  size_t bucket = 0;
  size_t bytes = 0;
  int touch_unit = 0, ready_unit = 0;
};

struct GradRing {
  size_t bytes = 0;  // the whole buffer
  int depth = 2;
  std::vector<size_t> bucket;  // per use: which bucket (offloaded bucket i is engine bucket i)
  std::vector<size_t> offset;  // per use
  // Per use: the uses whose copies must be done before it is written: the last users of its range,
  // earlier in the pass or at the end of the one before (each of them waited for its own
  // predecessors, so these are enough).
  std::vector<std::vector<size_t>> waits_for;
};

// Offloaded buckets [0, first_device_bucket) in the ring: unsharded (one rank, or ZeRO stage 0),
// the whole bucket from its first gradient on; sharded (stages 2-3), this rank's shard from its
// reduce-scatter on; stage 1 keeps whole gradient buckets anyway (its shard is copied from there),
// so nothing goes through the ring. Sizes are rounded up to `align` bytes.
std::vector<GradRingUse> grad_ring_uses(const ParamLayout& layout, const std::vector<Bucket>& buckets,
                                        const ShardLayout& shards, size_t first_device_bucket, int zero_stage,
                                        size_t elem_bytes, size_t align);

// Places the uses (first fit, lowest offset) replaying one backward pass: per unit from the head
// down, the buckets first written in it take their ranges, then those complete after it give
// theirs back, usable again `depth` - 1 completions later. depth >= 1.
GradRing plan_grad_ring(const std::vector<GradRingUse>& uses, int depth);

}  // namespace so
