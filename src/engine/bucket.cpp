#include "so/engine/bucket.h"

#include <algorithm>

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
  for (int id = static_cast<int>(layout.params.size()) - 1; id >= 0; --id) {
    const ParamInfo& p = layout.params[id];
    const int64_t padded = (p.numel + ParamLayout::kAlign - 1) / ParamLayout::kAlign * ParamLayout::kAlign;
    if (!cur.params.empty() && cur.size() + padded > bucket_size) close();
    if (cur.params.empty()) {
      cur.end = p.offset + padded;
      cur.ready_unit = p.first_unit;
    }
    cur.begin = p.offset;
    cur.params.push_back(id);
    cur.ready_unit = std::min(cur.ready_unit, p.first_unit);
  }
  close();
  return buckets;
}

}  // namespace so
