#include "so/engine/decay_runs.h"

#include <algorithm>

#include "so/core/error.h"

namespace so {

std::vector<DecayRun> decay_runs(const ParamLayout& layout, const std::vector<Bucket>& buckets,
                                 const ShardLayout& shards, size_t b, const std::vector<char>& no_decay) {
  SO_CHECK(no_decay.empty() || no_decay.size() == layout.params.size(), "decay runs: ", no_decay.size(),
           " no-decay flags for ", layout.params.size(), " parameters");
  const Bucket& bucket = buckets.at(b);
  const int64_t size = shards.buckets.at(b).shard_size;
  const int64_t lo = shards.rank * size, hi = lo + size;  // the shard's window of the (padded) bucket
  // Where each parameter starts in the bucket, in offset order: an element belongs to the last
  // parameter starting at or before it (padding to the one it follows).
  std::vector<std::pair<int64_t, bool>> starts;
  for (int id : bucket.params)
    starts.emplace_back(layout.params[id].offset - bucket.begin, no_decay.empty() || !no_decay[id]);
  std::sort(starts.begin(), starts.end());
  std::vector<DecayRun> runs;
  for (size_t i = 0; i < starts.size(); ++i) {
    const int64_t from = std::max(lo, starts[i].first);
    const int64_t to = std::min(hi, i + 1 < starts.size() ? starts[i + 1].first : hi);
    if (from >= to) continue;
    if (!runs.empty() && runs.back().decay == starts[i].second)
      runs.back().count = to - lo - runs.back().begin;
    else
      runs.push_back(DecayRun{from - lo, to - from, starts[i].second});
  }
  return runs;
}

}  // namespace so
