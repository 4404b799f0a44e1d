#pragma once
// Buckets: contiguous ranges of the flat parameter buffer, formed in backward order, each the
// unit of gradient readiness, optimizer stepping (and, later, sharding and offload).
#include <cstdint>
#include <vector>

#include "so/engine/offload_config.h"
#include "so/model/param_layout.h"

namespace so {

struct Bucket {
  int64_t begin = 0;  // element range [begin, end) of the flat buffers
  int64_t end = 0;
  std::vector<int> params;
  int ready_unit = 0;  // gradients are final after the backward of this unit
  int64_t size() const { return end - begin; }
};

// Packs parameters in backward order (head first) into buckets of about `bucket_size`
// elements, never splitting a parameter nor a run of joined ones (ParamInfo::joined_to_next). buckets[0] is the first
// to become ready.
std::vector<Bucket> make_buckets(const ParamLayout& layout, int64_t bucket_size);

// Which buckets each unit (embedding 0, layers 1..L, head L+1) reads and, per bucket, the first
// and last unit reading it: what ZeRO-3's gathers follow (the engine, and the memory planner's
// replay of them).
struct BucketUnits {
  std::vector<std::vector<size_t>> unit_buckets;  // unit -> buckets holding its parameters
  std::vector<int> lo, hi;                        // first and last unit reading each bucket
  std::vector<size_t> param_bucket;               // parameter id -> bucket
  int units() const { return static_cast<int>(unit_buckets.size()); }
};
BucketUnits bucket_units(const ParamLayout& layout, const std::vector<Bucket>& buckets);

// The first bucket whose optimizer state stays on the device: buckets [0, k) are stepped on the
// CPU, [k, n) — the last in backward order, read first by the next forward — on the device.
// With `ratio`, k makes the CPU's share of *parameters* closest to ratio (ties to the CPU);
// with device_tail_buckets, k = n - that many.
size_t first_device_bucket(const std::vector<Bucket>& buckets, const OffloadConfig& offload);

}  // namespace so
