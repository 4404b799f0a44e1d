#include "so/engine/grad_ring.h"

#include <algorithm>

#include "so/core/error.h"
#include "so/core/round_up.h"

namespace so {

std::vector<GradRingUse> grad_ring_uses(const ParamLayout& layout, const std::vector<Bucket>& buckets,
                                        const ShardLayout& shards, size_t first_device_bucket, int zero_stage,
                                        size_t elem_bytes, size_t align) {
  std::vector<GradRingUse> uses;
  if (shards.sharded() && zero_stage == 1) return uses;
  const BucketUnits units = bucket_units(layout, buckets);
  for (size_t b = 0; b < first_device_bucket && b < buckets.size(); ++b) {
    GradRingUse u;
    u.bucket = b;
    u.ready_unit = buckets[b].ready_unit;
    if (shards.sharded()) {
      u.bytes = round_up(static_cast<size_t>(shards.buckets[b].shard_size) * elem_bytes, align);
      u.touch_unit = u.ready_unit;
    } else {
      u.bytes = round_up(static_cast<size_t>(buckets[b].size()) * elem_bytes, align);
      u.touch_unit = units.hi[b];
    }
    uses.push_back(u);
  }
  return uses;
}

GradRing plan_grad_ring(const std::vector<GradRingUse>& uses, int depth) {
  SO_CHECK(depth >= 1, "gradient ring depth ", depth, " is below 1");
  GradRing ring;
  ring.depth = depth;
  ring.offset.assign(uses.size(), 0);
  for (const GradRingUse& u : uses) ring.bucket.push_back(u.bucket);
  ring.waits_for.assign(uses.size(), {});
  if (uses.empty()) return ring;
  struct Range {
    size_t begin, end;
    size_t use;
    bool alive;
    int64_t usable_from;  // completions after which a released range may be taken again
  };
  std::vector<Range> ranges;
  auto overlap = [](const Range& r, size_t begin, size_t end) { return r.begin < end && begin < r.end; };
  int64_t completions = 0;
  int top = 0;
  for (const GradRingUse& u : uses) top = std::max(top, u.touch_unit);
  for (int unit = top; unit >= 0; --unit) {
    for (size_t i = 0; i < uses.size(); ++i) {
      if (uses[i].touch_unit != unit) continue;
      // The lowest gap between the ranges a new use must stay clear of that holds it.
      std::vector<std::pair<size_t, size_t>> blocked;
      for (const Range& r : ranges)
        if (r.alive || completions < r.usable_from) blocked.emplace_back(r.begin, r.end);
      std::sort(blocked.begin(), blocked.end());
      const size_t n = uses[i].bytes;
      size_t at = 0;
      for (const auto& [b, e] : blocked) {
        if (b >= at + n) break;
        at = std::max(at, e);
      }
      ring.offset[i] = at;
      ring.bytes = std::max(ring.bytes, at + n);
      for (const Range& r : ranges)
        if (overlap(r, at, at + n)) ring.waits_for[i].push_back(r.use);
      // Released ranges wholly covered again are forgotten; partly covered ones stay.
      ranges.erase(std::remove_if(ranges.begin(), ranges.end(),
                                  [&](const Range& r) { return !r.alive && r.begin >= at && r.end <= at + n; }),
                   ranges.end());
      ranges.push_back({at, at + n, i, true, 0});
    }
    for (size_t i = 0; i < uses.size(); ++i) {
      if (uses[i].ready_unit != unit) continue;
      for (Range& r : ranges)
        if (r.use == i) r.alive = false, r.usable_from = completions + depth;
      ++completions;
    }
  }
  // The pass repeats: what a range held at the end of the last one is written over in the next.
  for (size_t i = 0; i < uses.size(); ++i) {
    for (const Range& r : ranges)
      if (overlap(r, ring.offset[i], ring.offset[i] + uses[i].bytes)) ring.waits_for[i].push_back(r.use);
    std::sort(ring.waits_for[i].begin(), ring.waits_for[i].end());
    ring.waits_for[i].erase(std::unique(ring.waits_for[i].begin(), ring.waits_for[i].end()), ring.waits_for[i].end());
  }
  return ring;
}

}  // namespace so
