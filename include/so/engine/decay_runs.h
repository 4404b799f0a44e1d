#pragma once
// Weight-decay groups at the optimizer's grain. The kernels step a bucket's flat arrays with one
// set of hyper-parameters; parameter groups (HF Trainer's: no decay on norms and biases) become
// runs of consecutive elements that share a weight decay, each stepped by its own call. Every
// optimizer path (device AdamW, ZeRO-Offload, SuperOffload's speculation, redo and rollback) goes
// through for_each_decay_run, so a rollback undoes exactly the decay its step applied.
#include <cstdint>
#include <vector>

#include "so/engine/bucket.h"
#include "so/engine/shard_layout.h"
#include "so/model/param_layout.h"
#include "so/optim/adamw.h"

namespace so {

struct DecayRun {
  int64_t begin = 0, count = 0;  // elements of the bucket's shard (shard coordinates, from 0)
  bool decay = true;
};

// The runs covering bucket b's shard on this rank (shard_layout's rank), in order. no_decay[id]
// marks the parameters stepped without decay (empty: every parameter decays, one run). Padding
// joins the run before it, so a bucket holds one run per change of group, not per parameter.
std::vector<DecayRun> decay_runs(const ParamLayout& layout, const std::vector<Bucket>& buckets,
                                 const ShardLayout& shards, size_t b, const std::vector<char>& no_decay);

// Calls step(a from run.begin, run.count, hp with weight_decay 0 where the run does not decay)
// for every run.
template <typename Step>
void for_each_decay_run(const std::vector<DecayRun>& runs, const AdamArrays& a, const AdamWParams& hp, Step&& step) {
  for (const DecayRun& r : runs) {
    AdamWParams run_hp = hp;
    if (!r.decay) run_hp.weight_decay = 0.0;
    step(a.from(r.begin), r.count, run_hp);
  }
}

}  // namespace so
