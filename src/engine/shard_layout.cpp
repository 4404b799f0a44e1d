#include "so/engine/shard_layout.h"

#include <algorithm>

#include "so/core/error.h"
#include "so/model/param_layout.h"

namespace so {

ShardLayout make_shard_layout(const std::vector<Bucket>& buckets, int world, int rank) {
  SO_CHECK(world >= 1 && rank >= 0 && rank < world, "shard layout: rank ", rank, " of ", world);
  ShardLayout sl;
  sl.world = world;
  sl.rank = rank;
  sl.buckets.resize(buckets.size());
  // Flat order is reverse bucket order (bucket 0 holds the highest offsets).
  for (size_t i = buckets.size(); i-- > 0;) {
    const int64_t size = buckets[i].size();
    const int64_t a = ParamLayout::kAlign;
    const int64_t shard = world == 1 ? size : ((size + world - 1) / world + a - 1) / a * a;
    sl.buckets[i] = BucketShard{sl.total, shard};
    sl.total += shard;
  }
  return sl;
}

std::optional<OwnedPart> owned_part(const ShardLayout& sl, const Bucket& bucket, size_t b, int64_t begin, int64_t n) {
  return owned_part(sl, bucket, b, begin, n, sl.rank);
}

std::optional<OwnedPart> owned_part(const ShardLayout& sl, const Bucket& bucket, size_t b, int64_t begin, int64_t n,
                                    int rank) {
  const BucketShard& s = sl.buckets[b];
  const int64_t o = begin - bucket.begin;  // position inside the (padded) bucket
  const int64_t mine_lo = rank * s.shard_size, mine_hi = mine_lo + s.shard_size;
  const int64_t lo = std::max(o, mine_lo), hi = std::min(o + n, mine_hi);
  if (lo >= hi) return std::nullopt;
  return OwnedPart{lo - o, s.shard_begin + (lo - mine_lo), hi - lo};
}

}  // namespace so
