// Weight-decay groups against torch: 10 AdamW steps of a tiny Qwen3 (every kind of norm) with HF
// Trainer's two parameter groups, in every optimizer mode, equal torch.optim.AdamW over the same
// groups (fixtures/decay_groups_torch.h5, made by make_decay_groups_fixture.py from transformers'
// own Trainer.get_decay_parameter_names). The model runs its forward and backward, but each
// parameter's gradient is replaced by the fixture's before the engine sees it, so the optimizer
// paths alone are compared. Also: the runs a sharded bucket is cut into, element by element.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

#include "parallel/communicator.h"
#include "so/engine/decay_runs.h"
#include "so/engine/engine.h"
#include "so/io/hdf5_file.h"
#include "so/model/decoder_model.h"
#include "so/train/decay_groups.h"
#include "tests/reference/reference_fixture.h"
#include "tests/test_util.h"

namespace so {
namespace {

const std::string kFixture = std::string(SO_FIXTURE_DIR) + "/decay_groups_torch.h5";

// Puts the fixture's gradient of step t into each parameter once its backward is complete (at
// its lowest unit: a tied embedding's last contribution is the embedding's own backward).
class GradientsFromFixture final : public ModelHooks {
 public:
  GradientsFromFixture(Engine& e, Backend& be, const std::vector<std::vector<float>>& grads)
      : engine_(e), backend_(be), grads_(grads) {}
  int64_t step = 0;
  void before_unit(int unit) override { engine_.before_unit(unit); }
  void after_backward(int unit) override {
    for (size_t id = 0; id < grads_.size(); ++id) {
      const ParamInfo& p = engine_.layout().params[id];
      if (p.first_unit != unit) continue;
      backend_.copy_h2d(engine_.grad(static_cast<int>(id)), grads_[id].data() + step * p.numel,
                        static_cast<size_t>(p.numel) * sizeof(float), backend_.stream(StreamKind::Compute));
    }
    engine_.after_backward(unit);
  }

 private:
  Engine& engine_;
  Backend& backend_;
  const std::vector<std::vector<float>>& grads_;
};

OffloadConfig offload(OffloadMode mode, double ratio, RollbackMode rollback) {
  OffloadConfig o;
  o.mode = mode;
  o.ratio = ratio;
  o.rollback = rollback;
  o.speculation = Speculation::Always;  // speculated buckets redone on the clipped steps
  return o;
}

TEST(DecayGroupsVsTorch, TenStepsWithHfTrainerGroupsInEveryOptimizerMode) {
  const H5File f = H5File::open_read(kFixture);
  std::istringstream config_text(f.read_string_attr("/", "config_json"));
  nlohmann::json config_json;
  config_text >> config_json;
  const ModelConfig cfg = ModelConfig::from_hf_json(config_json, kFixture);
  const AdamWParams adam = read_adamw_params(f, "/");
  const double lr = f.read_double_attr("/", "lr");
  const auto max_norm = static_cast<float>(f.read_double_attr("/", "max_norm"));
  const auto steps = static_cast<int64_t>(f.read_double_attr("/", "steps"));
  std::unique_ptr<Communicator> comm = make_mpi_world_communicator();

  for (const bool decay_embeddings : {true, false}) {
    const std::string group = decay_embeddings ? "/hf_trainer" : "/no_embedding_decay";
    DecayGroupsConfig dc;
    dc.decay_embeddings = decay_embeddings;
    ModelOptions mo;
    mo.seq_len = 8;
    // The groups themselves: so_train's defaults put exactly the tensors HF Trainer decays in the decay group.
    std::set<std::string> decayed;
    for (std::stringstream names(f.read_string_attr(group, "decayed")); names.good();) {
      std::string n;
      std::getline(names, n, ',');
      decayed.insert(n);
    }
    for (const auto& [name, mode] : std::vector<std::pair<std::string, OffloadConfig>>{
             {"device", offload(OffloadMode::None, 0, RollbackMode::Exact)},
             {"zero_offload_half", offload(OffloadMode::ZeroOffload, 0.5, RollbackMode::Exact)},
             {"super_offload_exact", offload(OffloadMode::SuperOffload, 1.0, RollbackMode::Exact)},
             {"super_offload_inverse_half", offload(OffloadMode::SuperOffload, 0.5, RollbackMode::Inverse)}}) {
      SCOPED_TRACE(group + " " + name);
      auto backend = create_backend(test::cpu_backend_options());
      DecoderModel model(*backend, cfg, mo);
      const ParamLayout& layout = model.layout();
      const DecayGroups groups = decay_groups(layout, dc, adam.weight_decay);
      for (size_t id = 0; id < layout.params.size(); ++id)
        EXPECT_EQ(!groups.no_decay[id], decayed.count(layout.params[id].name) == 1) << layout.params[id].name;
      EngineOptions eo;
      eo.adam = adam;
      eo.no_decay = groups.no_decay;
      eo.grad_clip = max_norm;
      eo.bucket_size = 3000;  // several buckets, each mixing decayed and undecayed tensors
      eo.offload = mode;
      Engine engine(*backend, layout, eo, *comm);
      std::vector<std::vector<float>> grads;
      for (size_t id = 0; id < layout.params.size(); ++id) {
        const std::string& n = layout.params[id].name;
        const int64_t numel = layout.params[id].numel;
        engine.load_weight(static_cast<int>(id), f.read_f32("/p0/" + n, {numel}));
        grads.push_back(f.read_f32("/grads/" + n, {steps, numel}));
        ASSERT_EQ(static_cast<int64_t>(grads.back().size()), steps * layout.params[id].numel) << n;
      }
      GradientsFromFixture hooks(engine, *backend, grads);
      TokenBatch batch;
      for (int32_t t = 0; t < mo.seq_len; ++t) {
        batch.inputs.push_back(t % cfg.vocab_size);
        batch.targets.push_back((t + 1) % cfg.vocab_size);
        batch.positions.push_back(t);
      }
      int clipped = 0;
      for (hooks.step = 0; hooks.step < steps; ++hooks.step) {
        engine.begin_step(lr);
        model.zero_loss();
        model.forward_backward(batch, engine, hooks, 1.0f / static_cast<float>(mo.seq_len), true);
        engine.end_step();
        clipped += engine.step_result().clip_coef < 1.0f;
      }
      engine.finish();
      EXPECT_GT(clipped, 0);  // the redo of speculated buckets is exercised
      double worst[3] = {0, 0, 0};
      const OptimState parts[3] = {OptimState::Master, OptimState::ExpAvg, OptimState::ExpAvgSq};
      for (size_t id = 0; id < layout.params.size(); ++id)
        for (int k = 0; k < 3; ++k) {
          const std::vector<float> got = engine.read_state(static_cast<int>(id), parts[k]);
          const std::vector<float> want =
              f.read_f32(group + "/" + "pmv"[k] + "/" + layout.params[id].name, {layout.params[id].numel});
          ASSERT_EQ(got.size(), want.size());
          for (size_t i = 0; i < got.size(); ++i) worst[k] = std::max(worst[k], std::fabs(double(got[i]) - want[i]));
        }
      std::printf("[ %s %s ] %d of %lld steps clipped; worst |so_train - torch| p %.3g, m %.3g, v %.3g\n",
                  group.c_str() + 1, name.c_str(), clipped, static_cast<long long>(steps), worst[0], worst[1],
                  worst[2]);
      for (double w : worst) EXPECT_LE(w, 1e-6);
    }
  }
}

// decay_runs of every bucket on every rank, expanded element by element, against each element's
// parameter found through owned_part (padding may go either way: its values are zeros).
// train.weight_decay_exclude patterns run in time linear in each name (std::regex backtracked
// exponentially on these and hung), and a pattern is bounded in length (200k nested groups
// overflowed std::regex's compiler); deep nesting within the bound compiles or is refused by name.
TEST(DecayGroups, PatternsAreMatchedInLinearTimeAndBoundedInSize) {
  ModelConfig c;
  c.vocab_size = 64, c.hidden_size = 32, c.intermediate_size = 64, c.num_layers = 2, c.num_heads = 4;
  c.num_kv_heads = 2, c.head_dim = 8, c.max_position_embeddings = 64;
  const ParamLayout layout = ParamLayout::for_model(c);
  DecayGroupsConfig dc;
  dc.exclude_given = true;
  for (const std::string p : {"(.+)+z", "(a|aa)+$z", "(x+x+)+y", "^(([a-z._0-9])+)+#"}) {
    SCOPED_TRACE(p);
    dc.exclude = {"norm", p};
    const std::string msg = test::error_message([&] { decay_groups(layout, dc, 0.1); });
    EXPECT_NE(msg.find(str_cat("has '", p, "', which matches no parameter of this model")), std::string::npos) << msg;
  }
  dc.exclude = {"(.+)+weight"};  // the same shape matching: every weight
  EXPECT_EQ(decay_groups(layout, dc, 0.1).description.find("weight decay 0.1 on 0 tensors"), 0u);
  std::string nested(200000, '(');
  nested += "norm" + std::string(200000, ')');
  dc.exclude = {nested};
  std::string msg = test::error_message([&] { decay_groups(layout, dc, 0.1); });
  EXPECT_NE(msg.find("has a pattern of 400004 characters"), std::string::npos) << msg;
  std::string deep = std::string(500, '(') + "norm" + std::string(500, ')');  // within the bound
  dc.exclude = {deep};
  try {
    EXPECT_NE(decay_groups(layout, dc, 0.1).description.find("model.norm.weight"), std::string::npos);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("which is not a regular expression"), std::string::npos) << e.what();
  }
  dc.exclude = {"norm(?=x)"};  // lookahead: not RE2's
  msg = test::error_message([&] { decay_groups(layout, dc, 0.1); });
  EXPECT_NE(msg.find("has 'norm(?=x)', which is not a regular expression"), std::string::npos) << msg;
}

TEST(DecayRuns, ShardsOfEveryBucketFollowTheirParameters) {
  ModelConfig cfg = ModelConfig::from_hf_file("configs/models/tiny.json");
  const ParamLayout layout = ParamLayout::for_model(cfg);
  const std::vector<Bucket> buckets = make_buckets(layout, 40000);
  std::vector<char> no_decay(layout.params.size(), 0);
  for (size_t id = 0; id < layout.params.size(); ++id) no_decay[id] = layout.params[id].is_norm || id % 7 == 3;
  for (int world : {1, 2, 3, 5}) {
    for (int rank = 0; rank < world; ++rank) {
      const ShardLayout shards = make_shard_layout(buckets, world, rank);
      for (size_t b = 0; b < buckets.size(); ++b) {
        const std::vector<DecayRun> runs = decay_runs(layout, buckets, shards, b, no_decay);
        std::vector<int> flag(static_cast<size_t>(shards.buckets[b].shard_size), -1);  // -1: not covered
        int64_t next = 0;
        for (const DecayRun& r : runs) {
          EXPECT_EQ(r.begin, next) << "world " << world << " rank " << rank << " bucket " << b;
          for (int64_t i = r.begin; i < r.begin + r.count; ++i) flag[i] = r.decay;
          next = r.begin + r.count;
        }
        EXPECT_EQ(next, shards.buckets[b].shard_size);
        for (size_t i = 1; i < runs.size(); ++i) EXPECT_NE(runs[i].decay, runs[i - 1].decay) << "runs not merged";
        for (int id : buckets[b].params) {
          const ParamInfo& p = layout.params[id];
          const std::optional<OwnedPart> part = owned_part(shards, buckets[b], b, p.offset, p.numel);
          if (!part) continue;
          const int64_t at = part->dst - shards.buckets[b].shard_begin;
          for (int64_t i = at; i < at + part->n; ++i)
            ASSERT_EQ(flag[i], no_decay[id] ? 0 : 1) << p.name << " world " << world << " rank " << rank;
        }
      }
    }
  }
}

}  // namespace
}  // namespace so
