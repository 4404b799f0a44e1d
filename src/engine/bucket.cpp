#include "so/engine/bucket.h"

#include <algorithm>
#include <cmath>

#include "so/core/error.h"

namespace so {

std::vector<Bucket> make_buckets(const ParamLayout& layout, int64_t bucket_size) {
  SO_CHECK(bucket_size > 0, "bucket size must be positive, is ", bucket_size);
  std::vector<Bucket> buckets;
  Bucket cur;
  auto close = [&] {
    if (!cur.params.empty()) buckets.push_back(cur);
    cur = Bucket{};
  };
  for (int id = static_cast<int>(layout.params.size()) - 1; id >= 0;) {
    // Parameters [lo, id]: id and the ones joined to it, placed as one.
    int lo = id;
    while (lo > 0 && layout.params[lo - 1].joined_to_next) --lo;
    const ParamInfo& last = layout.params[id];
    const int64_t end =
        (last.offset + last.numel + ParamLayout::kAlign - 1) / ParamLayout::kAlign * ParamLayout::kAlign;
    const int64_t extent = end - layout.params[lo].offset;
    if (!cur.params.empty() && cur.size() + extent > bucket_size) close();
    if (cur.params.empty()) {
      cur.end = end;
      cur.ready_unit = last.first_unit;
    }
    cur.begin = layout.params[lo].offset;
    for (; id >= lo; --id) {
      cur.params.push_back(id);
      cur.ready_unit = std::min(cur.ready_unit, layout.params[id].first_unit);
    }
  }
  close();
  return buckets;
}

size_t first_device_bucket(const std::vector<Bucket>& buckets, const OffloadConfig& offload) {
  const size_t n = buckets.size();
  if (offload.device_tail_buckets >= 0) {
    SO_CHECK(static_cast<size_t>(offload.device_tail_buckets) <= n, "device_tail_buckets is ",
             offload.device_tail_buckets, " but the model has only ", n, " buckets");
    return n - static_cast<size_t>(offload.device_tail_buckets);
  }
  int64_t total = 0;
  for (const Bucket& b : buckets) total += b.size();
  const double target = offload.ratio * static_cast<double>(total);
  size_t best = 0;
  double best_err = target;  // k = 0: nothing on the CPU
  int64_t cpu = 0;
  for (size_t k = 1; k <= n; ++k) {
    cpu += buckets[k - 1].size();
    const double err = std::abs(static_cast<double>(cpu) - target);
    if (err <= best_err) best = k, best_err = err;
  }
  return best;
}

BucketUnits bucket_units(const ParamLayout& layout, const std::vector<Bucket>& buckets) {
  int units = 0;
  for (const ParamInfo& p : layout.params) units = std::max(units, p.last_unit + 1);
  BucketUnits u;
  u.unit_buckets.resize(static_cast<size_t>(units));
  u.lo.assign(buckets.size(), units);
  u.hi.assign(buckets.size(), -1);
  u.param_bucket.assign(layout.params.size(), 0);
  for (size_t b = 0; b < buckets.size(); ++b)
    for (int id : buckets[b].params) {
      const ParamInfo& p = layout.params[id];
      u.param_bucket[id] = b;
      u.lo[b] = std::min(u.lo[b], p.first_unit);
      u.hi[b] = std::max(u.hi[b], p.last_unit);
      for (int unit : {p.first_unit, p.last_unit}) {
        std::vector<size_t>& list = u.unit_buckets[unit];
        if (std::find(list.begin(), list.end(), b) == list.end()) list.push_back(b);
      }
    }
  return u;
}

}  // namespace so
