// Distributed training equals one rank: under mpirun every rank first trains the tiny model
// alone (a one-rank communicator, the whole global batch) and then together with the others
// (ZeRO-3 over all ranks, each reading its slice of the same global batch). Losses must agree
// within 1e-6 relative and the final master weights within the bound below, for the optimizer
// on the device, ZeRO-Offload and SuperOffload.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "parallel/communicator.h"
#include "so/checkpoint/checkpoint.h"
#include "so/engine/engine.h"
#include "so/train/run_config.h"
#include "so/train/trainer.h"
#include "tests/optimizer_state.h"
#include "tests/test_util.h"

namespace so {
namespace {

constexpr int kGlobalBatch = 4;

struct Result {
  std::vector<double> losses;
  std::vector<std::vector<float>> weights;
  size_t state_bytes = 0;  // parameter, gradient and optimizer state of this rank (device + host)
};

// How far a run of as many steps is from the reference: the worst relative difference of any
// step's loss and of any weight tensor.
struct Distance {
  double loss = 0, weights = 0;
};
Distance distance(const Result& got, const Result& ref) {
  Distance d;
  for (size_t s = 0; s < ref.losses.size(); ++s)
    d.loss = std::max(d.loss, std::abs(got.losses[s] - ref.losses[s]) / ref.losses[s]);
  d.weights = test::worst_rel_error(got.weights, ref.weights);
  return d;
}

struct Mode {
  const char* name;
  const char* offload;  // the zero_optimization.offload_optimizer block
  bool checkpointing;   // recompute in backward: gathers from before_unit during backward
};

// save_every > 0: a checkpoint every so many steps (into a directory of this world size's).
Result run(Communicator& comm, int sp, const Mode& mode, int stage = 3, int steps = 12, int64_t save_every = 0) {
  nlohmann::json doc = load_json_file("configs/runs/tiny-demo.json");
  const int dp = comm.size() / sp;
  for (const std::string& s :
       {"train.steps=" + std::to_string(steps), std::string("data.seq_len=32"), std::string("steps_per_print=100"),
        "train_micro_batch_size_per_gpu=" + std::to_string(kGlobalBatch / dp),
        "sequence_parallel_size=" + std::to_string(sp), "zero_optimization.stage=" + std::to_string(stage),
        std::string("zero_optimization.sub_group_size=60000"), std::string("gradient_clipping=0.5"),
        std::string("zero_optimization.offload_optimizer=") + mode.offload,
        std::string("train.activation_checkpointing=") + (mode.checkpointing ? "true" : "false")})
    apply_override(doc, s);
  const RunConfig cfg = parse_run_config(doc, "test_distributed");
  Result r;
  TrainOptions opts;
  if (save_every > 0) {
    opts.save_dir = "build/tests/distributed_saves_np" + std::to_string(comm.size());
    opts.save_every = save_every;
  }
  opts.at_end = [&](Engine& e) {
    r.state_bytes = e.state_bytes() + e.host_state_bytes();
    for (size_t id = 0; id < e.layout().params.size(); ++id) r.weights.push_back(e.read_weight(static_cast<int>(id)));
  };
  r.losses = train(cfg, comm, opts).losses;
  return r;
}

class Distributed : public testing::TestWithParam<Mode> {
 protected:
  void SetUp() override { world_ = make_mpi_world_communicator(); }
  std::unique_ptr<Communicator> world_;
};

TEST_P(Distributed, Zero3AndUlyssesMatchOneRank) {
  ASSERT_EQ(kGlobalBatch % world_->size(), 0) << "run with 1, 2 or 4 ranks";
  std::unique_ptr<Communicator> alone = world_->split(world_->rank(), 0, "alone");
  const Result ref = run(*alone, 1, GetParam());
  // Every (dp, sp) mesh of this world: (n,1), (1,n) and, with 4 ranks, (2,2). The tiny model has
  // 4 query and 2 KV heads, so sp = 4 exercises KV-head replication.
  for (int sp = 1; sp <= world_->size(); sp *= 2) {
    const Result got = run(*world_, sp, GetParam());
    ASSERT_EQ(got.losses.size(), ref.losses.size());
    const auto [worst_loss, worst_w] = distance(got, ref);
    if (world_->rank() == 0)
      std::printf("[(dp, sp) = (%d, %d), %s] worst loss rel diff %.3e, worst weight tensor rel diff %.3e\n",
                  world_->size() / sp, sp, GetParam().name, worst_loss, worst_w);
    EXPECT_LE(worst_loss, 1e-6) << "(dp, sp) = (" << world_->size() / sp << ", " << sp << ")";
    // Gradients summed in a different order (reduce-scatter, sequence slices) move the weights by
    // float rounding, amplified a little by 12 Adam steps.
    EXPECT_LE(worst_w, 1e-5) << "(dp, sp) = (" << world_->size() / sp << ", " << sp << ")";
    // ZeRO-3 shards over every rank of the mesh: 1/world of the state, plus at most 16 elements
    // of padding per bucket and rank.
    const double share = static_cast<double>(got.state_bytes) / static_cast<double>(ref.state_bytes);
    if (world_->rank() == 0)
      std::printf("  state per rank: %zu of %zu bytes (%.4f)\n", got.state_bytes, ref.state_bytes, share);
    EXPECT_LE(share, 1.0 / world_->size() + 0.01);
  }
}

// ZeRO stages 0-3 over every rank (data parallel), with the optimizer on the device and with
// SuperOffload: the same losses and weights as one rank, and less state per rank at every stage.
TEST(DistributedStages, EveryStageMatchesOneRankAndKeepsLessAsTheStageRises) {
  std::unique_ptr<Communicator> world = make_mpi_world_communicator();
  ASSERT_EQ(kGlobalBatch % world->size(), 0) << "run with 1, 2 or 4 ranks";
  std::unique_ptr<Communicator> alone = world->split(world->rank(), 0, "alone");
  for (const Mode& mode : {Mode{"device", R"({"device": "none"})", false},
                           Mode{"superoffload", R"({"device": "cpu", "super_offload": true, "ratio": 0.5})", false}}) {
    const Result ref = run(*alone, 1, mode, 3, 8);
    size_t previous = SIZE_MAX;
    for (int stage = 0; stage <= 3; ++stage) {
      const Result got = run(*world, 1, mode, stage, 8);
      ASSERT_EQ(got.losses.size(), ref.losses.size());
      const auto [worst_loss, worst_w] = distance(got, ref);
      if (world->rank() == 0)
        std::printf(
            "[%s, stage %d, %d ranks] worst loss rel diff %.3e, worst weight rel diff %.3e, state per rank %zu "
            "bytes (one rank alone: %zu)\n",
            mode.name, stage, world->size(), worst_loss, worst_w, got.state_bytes, ref.state_bytes);
      EXPECT_LE(worst_loss, 1e-6) << mode.name << " stage " << stage;
      EXPECT_LE(worst_w, 1e-5) << mode.name << " stage " << stage;
      if (world->size() > 1) {
        EXPECT_LT(got.state_bytes, previous) << mode.name << " stage " << stage;
      }
      previous = got.state_bytes;
    }
  }
}

// Over every rank with ZeRO-3 and the optimizer on the device, the step is validated on the device
// (the ranks' sums gathered on the comm stream) and the loop reads each step's figures one step
// late; with a checkpoint due every step it reads them at once. The same losses and weights bit
// for bit.
TEST(DistributedStages, FiguresReadLateEqualFiguresReadAtOnce) {
  std::unique_ptr<Communicator> world = make_mpi_world_communicator();
  ASSERT_EQ(kGlobalBatch % world->size(), 0) << "run with 1, 2 or 4 ranks";
  const Mode device{"device", R"({"device": "none"})", false};
  const Result late = run(*world, 1, device, 3, 6);
  const Result at_once = run(*world, 1, device, 3, 6, 1);
  EXPECT_EQ(late.losses, at_once.losses);
  ASSERT_EQ(late.weights.size(), at_once.weights.size());
  for (size_t p = 0; p < late.weights.size(); ++p)
    EXPECT_TRUE(test::same_bits(late.weights[p], at_once.weights[p])) << "weights of parameter " << p;
}

// A checkpoint written by all ranks (SuperOffload: offloaded state in host memory) loads into
// one rank alone and into every half of the job (on-device optimizer) with every master weight
// and both moments bit for bit as they were.
TEST(DistributedCheckpoint, ReshardedLoadIsExact) {
  std::unique_ptr<Communicator> world = make_mpi_world_communicator();
  nlohmann::json doc = load_json_file("configs/runs/tiny-demo.json");
  for (const char* s :
       {"train.steps=3", "data.seq_len=32", "steps_per_print=100", "train_micro_batch_size_per_gpu=1",
        "zero_optimization.sub_group_size=60000",
        R"(zero_optimization.offload_optimizer={"device": "cpu", "super_offload": true, "ratio": 0.5})"})
    apply_override(doc, s);
  const RunConfig cfg = parse_run_config(doc, "test_distributed");
  // Per world size: the 2- and 4-rank tests may run at the same time.
  const std::string dir = "build/tests/reshard_exact_np" + std::to_string(world->size());
  test::OptimizerState saved;
  TrainOptions opts;
  opts.at_end = [&](Engine& e) {
    TrainState st;
    st.iteration = st.steps_taken = e.steps_taken();
    save_checkpoint(e, *world, cfg.model, cfg.resolved, st, dir, 1);
    saved = test::OptimizerState::read(e);
  };
  train(cfg, *world, opts);

  RunConfig device = cfg;
  device.offload = OffloadConfig{};
  auto check = [&](Communicator& comm, const char* what) {
    auto backend = create_backend(test::cpu_backend_options());
    const ParamLayout layout = ParamLayout::for_model(device.model);
    EngineOptions eo;
    eo.bucket_size = 100000;  // a different bucketing too
    Engine e(*backend, layout, eo, comm);
    const TrainState st = load_checkpoint(e, comm, device.model, dir);
    EXPECT_EQ(st.steps_taken, 3) << what;
    test::expect_same_optimizer_state(test::OptimizerState::read(e), saved, what);
  };
  std::unique_ptr<Communicator> alone = world->split(world->rank(), 0, "alone");
  check(*alone, "one rank");
  if (world->size() >= 2) {
    std::unique_ptr<Communicator> half = world->split(world->rank() % 2, world->rank(), "half");
    check(*half, "half of the job");
  }
}

// Asynchronous saves copy aside only what this rank's writer saves: unsharded state is saved by
// rank 0 alone, so the other ranks reserve (and stage) nothing; sharded, every rank its shard.
TEST(DistributedCheckpoint, OnlyWhatARankSavesIsKeptForAsyncSaves) {
  std::unique_ptr<Communicator> world = make_mpi_world_communicator();
  ASSERT_GE(world->size(), 2) << "run with 2 or 4 ranks";
  const ParamLayout layout = ParamLayout::for_model(ModelConfig::from_hf_file("configs/models/tiny.json"));
  for (int stage : {0, 3}) {
    auto backend = create_backend(test::cpu_backend_options());
    EngineOptions eo;
    eo.bucket_size = 60000;
    eo.zero_stage = stage;
    Engine e(*backend, layout, eo, *world);
    e.reserve_snapshot_space();
    size_t shards = 0;
    for (size_t b = 0; b < e.buckets().size(); ++b) shards += static_cast<size_t>(e.bucket_shard_size(b)) * 12;
    const bool saves = stage > 0 || world->rank() == 0;
    EXPECT_EQ(e.snapshot_space_bytes(), saves ? shards : 0) << "stage " << stage << ", rank " << world->rank();
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, Distributed,
                         testing::Values(Mode{"device", R"({"device": "none"})", false},
                                         Mode{"zero_offload", R"({"device": "cpu"})", false},
                                         Mode{"superoffload_checkpointing",
                                              R"({"device": "cpu", "super_offload": true, "ratio": 0.5})", true}),
                         [](const testing::TestParamInfo<Mode>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace so
