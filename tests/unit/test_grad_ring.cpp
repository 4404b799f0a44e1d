// The gradient ring's plan (grad_ring.h) replayed event by event over two backward passes: ranges
// in use never overlap, a released range is taken again only `depth` - 1 completions later, and
// every copy whose memory a bucket writes over is one it waits for, directly or through the buckets
// it waits for (each of which waited for its own predecessors before writing).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <random>

#include "so/engine/grad_ring.h"
#include "so/model/model_config.h"
#include "so/model/param_layout.h"

namespace so {
namespace {

// Host order of one pass: per unit from the top, the buckets first written in it, then those
// complete after it (as Engine::grad and Engine::after_backward see them).
struct Event {
  bool touch;
  size_t use;
};
std::vector<Event> pass_events(const std::vector<GradRingUse>& uses) {
  int top = 0;
  for (const GradRingUse& u : uses) top = std::max(top, u.touch_unit);
  std::vector<Event> ev;
  for (int unit = top; unit >= 0; --unit) {
    for (size_t i = 0; i < uses.size(); ++i)
      if (uses[i].touch_unit == unit) ev.push_back({true, i});
    for (size_t i = 0; i < uses.size(); ++i)
      if (uses[i].ready_unit == unit) ev.push_back({false, i});
  }
  return ev;
}

bool overlap(const GradRing& r, const std::vector<GradRingUse>& u, size_t a, size_t b) {
  return r.offset[a] < r.offset[b] + u[b].bytes && r.offset[b] < r.offset[a] + u[a].bytes;
}

void check_ring(const std::vector<GradRingUse>& uses, int depth, const std::string& what) {
  SCOPED_TRACE(what + ", depth " + std::to_string(depth));
  const GradRing ring = plan_grad_ring(uses, depth);
  ASSERT_EQ(ring.offset.size(), uses.size());
  size_t top = 0;
  for (size_t i = 0; i < uses.size(); ++i) top = std::max(top, ring.offset[i] + uses[i].bytes);
  EXPECT_EQ(ring.bytes, top) << "the buffer is as large as its highest range, no larger";

  const std::vector<Event> one = pass_events(uses);
  std::vector<Event> ev = one;
  ev.insert(ev.end(), one.begin(), one.end());  // two passes: the second writes over the first's copies
  std::vector<int64_t> touched(uses.size(), -1), readied(uses.size(), -1);  // event index of the latest
  std::vector<int64_t> completion_of(uses.size(), -1);
  int64_t completions = 0;
  // What a touch at event `t` of use i makes sure is copied: for each use j, the latest of j's
  // copies (readies) known done, as an event index.
  std::function<void(size_t, int64_t, std::map<size_t, int64_t>&)> known = [&](size_t i, int64_t t,
                                                                               std::map<size_t, int64_t>& done) {
    for (size_t k : ring.waits_for[i]) {
      int64_t r = -1;  // k's latest ready before t
      for (int64_t e = t - 1; e >= 0; --e)
        if (!ev[e].touch && ev[e].use == k) {
          r = e;
          break;
        }
      if (r < 0 || done[k] >= r) continue;
      done[k] = r;
      int64_t kt = -1;  // k's touch before that ready: it waited for its own predecessors then
      for (int64_t e = r - 1; e >= 0; --e)
        if (ev[e].touch && ev[e].use == k) {
          kt = e;
          break;
        }
      if (kt >= 0) known(k, kt, done);
    }
  };
  for (int64_t t = 0; t < static_cast<int64_t>(ev.size()); ++t) {
    const size_t i = ev[t].use;
    if (!ev[t].touch) {
      readied[i] = t;
      completion_of[i] = completions++;
      continue;
    }
    std::map<size_t, int64_t> done;
    known(i, t, done);
    for (size_t j = 0; j < uses.size(); ++j) {
      if (j == i && readied[j] < 0) continue;
      if (!overlap(ring, uses, i, j)) continue;
      const bool alive = touched[j] >= 0 && touched[j] > readied[j];
      EXPECT_FALSE(alive && j != i) << "use " << i << " overlaps use " << j << ", still being written";
      if (readied[j] < 0) continue;  // never held anything yet
      // The last copy of j's range must be done before i writes over it.
      EXPECT_GE(done[j], readied[j]) << "use " << i << " writes over use " << j << "'s copy without waiting for it";
      if (t < static_cast<int64_t>(one.size())) {  // within the first pass: released `depth` - 1 completions ago
        EXPECT_GE(completions - completion_of[j], depth) << "use " << i << " takes use " << j << "'s range too soon";
      }
    }
    touched[i] = t;
  }
}

TEST(GradRing, RangesInUseNeverOverlapAndEveryOverwrittenCopyIsWaitedFor) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const int units = 3 + trial % 9;
    std::vector<GradRingUse> uses;
    for (int u = units - 1; u >= 0; --u) {
      const int per = 1 + static_cast<int>(rng() % 3);
      for (int k = 0; k < per; ++k) {
        GradRingUse g;
        g.bucket = uses.size();
        g.bytes = 512 * (1 + rng() % 8);
        g.touch_unit = u;
        g.ready_unit = std::max(0, u - static_cast<int>(rng() % 2));
        uses.push_back(g);
      }
    }
    // Tied embeddings: written at the head, complete only at the embedding.
    uses.push_back({uses.size(), 512 * 16, units - 1, 0});
    for (int depth : {1, 2, 3, 4}) check_ring(uses, depth, "trial " + std::to_string(trial));
  }
}

TEST(GradRing, DeeperRingsHoldMoreButAtMostEveryBucket) {
  const ModelConfig cfg = ModelConfig::from_hf_file("configs/models/tiny.json");
  const ParamLayout layout = ParamLayout::for_model(cfg);
  const std::vector<Bucket> buckets = make_buckets(layout, 20000);
  const ShardLayout flat = make_shard_layout(buckets, 1, 0);
  const std::vector<GradRingUse> uses = grad_ring_uses(layout, buckets, flat, buckets.size(), 3, 2, 64);
  ASSERT_EQ(uses.size(), buckets.size());
  size_t all = 0;
  for (const GradRingUse& u : uses) all += u.bytes;
  size_t last = 0;
  for (int depth = 1; depth <= 6; ++depth) {
    const GradRing ring = plan_grad_ring(uses, depth);
    EXPECT_GE(ring.bytes, last) << "depth " << depth;
    EXPECT_LT(ring.bytes, all) << "depth " << depth << ": the ring holds every bucket at once";
    last = ring.bytes;
    check_ring(uses, depth, "tiny.json");
  }
  // ZeRO stage 1 keeps whole gradient buckets: nothing passes through the ring; stages 2-3 put each
  // rank's shard there from its reduce-scatter on.
  const ShardLayout two = make_shard_layout(buckets, 2, 1);
  EXPECT_TRUE(grad_ring_uses(layout, buckets, two, buckets.size(), 1, 2, 64).empty());
  const std::vector<GradRingUse> sharded = grad_ring_uses(layout, buckets, two, buckets.size(), 3, 2, 64);
  ASSERT_EQ(sharded.size(), buckets.size());
  for (size_t b = 0; b < buckets.size(); ++b) {
    EXPECT_EQ(sharded[b].touch_unit, sharded[b].ready_unit);
    EXPECT_EQ(sharded[b].bytes, (static_cast<size_t>(two.buckets[b].shard_size) * 2 + 63) / 64 * 64);
  }
  check_ring(sharded, 2, "tiny.json, ZeRO-3 shard of 2");
}

}  // namespace
}  // namespace so
