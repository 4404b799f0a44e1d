#pragma once
// ZeRO-3 partition: every bucket is split into `world` equal shards (the bucket padded with zeros
// to a multiple of world x 16 elements, so no tensor size has to divide anything); rank r owns
// shard r of every bucket. A rank's shards are packed into its own flat shard buffers in flat
// order, so the device-resident buckets (the last in backward order, lowest offsets) come first
// and the offloaded ones form one contiguous range after them, as in the unsharded layout. With
// one rank the shard layout is the flat layout itself.
#include <cstdint>
#include <optional>
#include <vector>

#include "so/engine/bucket.h"

namespace so {

struct BucketShard {
  int64_t shard_begin = 0;  // offset in this rank's shard buffers
  int64_t shard_size = 0;   // elements of the bucket each rank owns
};

struct ShardLayout {
  int world = 1, rank = 0;
  std::vector<BucketShard> buckets;  // parallel to the engine's buckets
  int64_t total = 0;                 // shard elements per rank
  bool sharded() const { return world > 1; }
  int64_t padded_size(size_t b) const { return buckets[b].shard_size * world; }
};

ShardLayout make_shard_layout(const std::vector<Bucket>& buckets, int world, int rank);

// The part of flat elements [begin, begin + n) (inside bucket b) that this rank owns: `n`
// elements starting at index `src` of the range, stored at shard offset `dst`.
struct OwnedPart {
  int64_t src = 0, dst = 0, n = 0;
};
std::optional<OwnedPart> owned_part(const ShardLayout& sl, const Bucket& bucket, size_t b, int64_t begin, int64_t n);
// The same for another rank of the layout (dst is then an offset in that rank's shard buffers).
std::optional<OwnedPart> owned_part(const ShardLayout& sl, const Bucket& bucket, size_t b, int64_t begin, int64_t n,
                                    int rank);

}  // namespace so
