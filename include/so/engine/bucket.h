#pragma once
// Buckets: contiguous ranges of the flat parameter buffer, formed in backward order, each the
// unit of gradient readiness, optimizer stepping (and, later, sharding and offload).
#include <cstdint>
#include <vector>

#include "so/model/param_layout.h"

namespace so {

struct Bucket {
  int64_t begin = 0;   // element range [begin, end) of the flat buffers
  int64_t end = 0;
  std::vector<int> params;
  int ready_unit = 0;  // gradients are final after the backward of this unit
  int64_t size() const { return end - begin; }
};

// Packs parameters in backward order (head first) into buckets of about `bucket_size`
// elements, never splitting a parameter. buckets[0] is the first to become ready.
std::vector<Bucket> make_buckets(const ParamLayout& layout, int64_t bucket_size);

}  // namespace so
