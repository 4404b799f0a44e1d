// The memory planner and the features it plans: the model allocates exactly the buffers it lists,
// the plan's device peak is the pool's measured peak on one rank (several ranks: tests/plan/),
// offloaded checkpoints change nothing but where the checkpoints live, a tiled MLP changes only
// the order of sums, and "auto" offloads and tiles only as far as needed to fit.
#include <gtest/gtest.h>

#include <cmath>

#include "parallel/communicator.h"
#include "so/data/batch_sampler.h"
#include "so/engine/engine.h"
#include "so/model/decoder_model.h"
#include "so/train/memory_plan.h"
#include "so/train/run_config.h"
#include "tests/test_util.h"
#ifdef SO_HAVE_CUDA
#include "src/backend/cuda/cuda_cast.h"
#endif

namespace so {
namespace {

// A Ulysses group of `size` for constructing the model only (its buffers; no all-to-all runs).
class SizeOnlySequenceParallel final : public SequenceParallel {
 public:
  explicit SizeOnlySequenceParallel(int size) : size_(size) {}
  int size() const override { return size_; }
  int rank() const override { return 0; }
  void all_to_all(Stream&, void*, const void*, int64_t, DType) override { FAIL() << "not for running"; }

 private:
  int size_;
};

// configs/models/tiny.json with qk-norm (Qwen3), so every optional buffer exists.
ModelConfig qwen_like() {
  ModelConfig c = ModelConfig::from_hf_file("configs/models/tiny.json");
  c.qk_norm = true;
  return c;
}

struct Variant {
  const char* name;
  bool checkpointing, offload;
  int64_t tile;
  int sp;
};

TEST(ActivationBuffers, AreExactlyWhatTheModelAllocates) {
  const ModelConfig cfg = qwen_like();
  for (const Variant& v : {Variant{"whole", false, false, 0, 1}, Variant{"checkpointed", true, false, 0, 1},
                           Variant{"offloaded", true, true, 0, 1}, Variant{"tiled", true, true, 100, 1},
                           Variant{"ulysses", true, false, 64, 2}, Variant{"ulysses kv copies", false, false, 0, 4}}) {
    auto backend = create_backend(test::cpu_backend_options());
    SizeOnlySequenceParallel sp(v.sp);
    ModelOptions mo;
    mo.micro_batch = 3;
    mo.seq_len = 96;
    mo.activation_checkpointing = v.checkpointing;
    mo.offload_checkpoints = v.offload;
    mo.mlp_tile_tokens = v.tile;
    if (v.sp > 1) mo.sequence_parallel = &sp;
    size_t listed = 0;
    for (const ActivationBuffer& b : DecoderModel::activation_buffers(cfg, mo, v.sp))
      listed += (b.bytes + backend->allocation_granularity() - 1) / backend->allocation_granularity() *
                backend->allocation_granularity();
    DecoderModel model(*backend, cfg, mo);
    EXPECT_EQ(backend->memory_stats().in_use, listed) << v.name;
    EXPECT_EQ(DecoderModel::host_checkpoint_bytes(cfg, mo),
              v.offload ? size_t{4} * cfg.num_layers * 3 * 96 * cfg.hidden_size : 0)
        << v.name;
  }
}

RunConfig run_config(const std::string& extra_train) {
  const std::string doc = R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "zero_optimization": {"stage": 0, "sub_group_size": 30000},
    "model": {"config": "configs/models/tiny.json"},
    "data": {"type": "synthetic", "seq_len": 80}, "train": {"steps": 3)" +
                          extra_train + "}}";
  return parse_run_config(nlohmann::json::parse(doc), "test");
}

struct Trained {
  std::vector<float> losses;
  size_t peak = 0;
};

// Three steps of two micro-batches with the run's model and engine options, as train() builds them.
Trained train_steps(const RunConfig& cfg, const std::string& backend_type) {
  auto comm = make_mpi_world_communicator();
  BackendOptions bo = cfg.backend;  // its device_memory_limit caps the pool
  bo.type = backend_type;
  auto backend = create_backend(bo);
  const ModelOptions mo = model_options(cfg, 2, 1);
  DecoderModel model(*backend, cfg.model, mo);
  EngineOptions eo;
  eo.dtype = cfg.dtype;
  eo.bucket_size = cfg.bucket_size;
  eo.offload = cfg.offload;
  eo.accumulation = static_cast<int>(resolve_batch_sizes(cfg, 1).accumulation);
  eo.grad_ring_depth = grad_ring_depth(cfg, 1, machine_profile_of(*backend));
  Engine engine(*backend, model.layout(), eo, *comm);
  engine.init_weights(5, 0.02f);
  auto tokens = make_synthetic_tokens(cfg.model.vocab_size, 1 << 15, 9);
  BatchSampler sampler(*tokens, cfg.data.seq_len, 2, cfg.model.vocab_size, 3);
  Trained t;
  for (int step = 0; step < 3; ++step) {
    engine.begin_step(1e-3, eo.accumulation);
    model.zero_loss();
    for (int m = 0; m < eo.accumulation; ++m)
      model.forward_backward(sampler.next(), engine, engine, 1.0f / (160.0f * eo.accumulation), true);
    t.losses.push_back(model.read_loss());
    engine.end_step();
  }
  engine.finish();
  t.peak = backend->memory_stats().peak;
  return t;
}

// The same on each backend: the CPU here, the GPU where there is one (gpu.test_memory_plan).
class OnBackend : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
#ifdef SO_HAVE_CUDA
    const bool cuda = cuda::device_count() > 0;
#else
    const bool cuda = false;
#endif
    if (GetParam() == "cuda" && !cuda) GTEST_SKIP() << "no CUDA device";
  }
  Trained train(const RunConfig& cfg) { return train_steps(cfg, GetParam()); }
};

TEST_P(OnBackend, OffloadedCheckpointsAreBitwiseAndTilesChangeOnlyTheOrderOfSums) {
  const Trained whole = train(run_config(""));
  const Trained ckpt = train(run_config(R"(, "activation_checkpointing": true)"));
  const Trained offloaded = train(run_config(R"(, "activation_checkpointing": true, "activation_offload": true)"));
  // 37 does not divide 160 tokens: the last tile is short.
  const Trained tiled = train(run_config(R"(, "mlp_tile_tokens": 37)"));
  const Trained both =
      train(run_config(R"(, "activation_checkpointing": true, "activation_offload": true, "mlp_tile_tokens": 37)"));
  EXPECT_TRUE(test::same_bits(ckpt.losses, whole.losses));
  EXPECT_TRUE(test::same_bits(offloaded.losses, whole.losses));
  for (const Trained* t : {&tiled, &both})
    for (size_t i = 0; i < whole.losses.size(); ++i)
      EXPECT_NEAR(t->losses[i], whole.losses[i], 1e-6 * std::abs(whole.losses[i])) << "step " << i + 1;
  // Each feature lowers the device peak.
  EXPECT_LT(ckpt.peak, whole.peak);
  EXPECT_LT(offloaded.peak, ckpt.peak);
  EXPECT_LT(both.peak, offloaded.peak);
}

TEST_P(OnBackend, PlannedDevicePeakIsTheMeasuredPeakOnOneRank) {
  BackendOptions bo;
  bo.type = GetParam();
  const std::unique_ptr<Backend> backend = create_backend(bo);
  const MachineProfile machine = machine_profile_of(*backend);
  for (const char* train_keys : {"", R"(, "activation_checkpointing": true, "activation_offload": true)",
                                 R"(, "activation_checkpointing": true, "mlp_tile_tokens": 50)"})
    for (const OffloadMode mode : {OffloadMode::None, OffloadMode::SuperOffload}) {
      RunConfig cfg = run_config(train_keys);
      cfg.offload.mode = mode, cfg.offload.ratio = 0.5;
      const MemoryPlan plan = plan_memory(cfg, 1, 0, machine);
      SCOPED_TRACE(str_cat("train", train_keys, ", optimizer ", offload_mode_name(mode), "\n",
                           format_plan(cfg, 1, plan, machine)));
      const Trained t = train(cfg);
      // The CPU backend allocates nothing the plan does not list. CUDA kernels also draw small
      // scratch buffers (reductions, the attention backward's row sums) from the pool: within 10%.
      if (machine.cuda)
        EXPECT_NEAR(static_cast<double>(t.peak), static_cast<double>(plan.device_peak), 0.1 * plan.device_peak);
      else
        EXPECT_EQ(plan.device_peak, t.peak);
    }
}

// Offloaded buckets' gradients live on the device only in the gradient ring: a run trains under a
// cap of exactly its plan, whole-model gradients (the device holding every gradient all step) would
// not fit there, and the pool's peak is the plan — fp32 and bf16 (casts on either side), one and two
// micro-batches per step (summed on the host), SuperOffload and ZeRO-Offload.
TEST(MemoryPlan, OffloadedGradientsLeaveTheDeviceSoTheRunTrainsWhereWholeGradientsDoNotFit) {
  struct Case {
    const char* name;
    DType dt;
    CastSite cast;
    int micro;
    OffloadMode mode;
  };
  for (const Case& c :
       {Case{"fp32 superoffload", DType::F32, CastSite::Host, 1, OffloadMode::SuperOffload},
        Case{"fp32 superoffload, 2 micro-batches", DType::F32, CastSite::Host, 2, OffloadMode::SuperOffload},
        Case{"bf16 superoffload, device casts", DType::BF16, CastSite::Device, 1, OffloadMode::SuperOffload},
        Case{"bf16 zero-offload, host casts, 2 micro-batches", DType::BF16, CastSite::Host, 2,
             OffloadMode::ZeroOffload}}) {
    RunConfig cfg = run_config("");
    cfg.dtype = c.dt;
    cfg.micro_batch = 2, cfg.grad_accum = c.micro, cfg.train_batch_size = 0;
    cfg.offload.mode = c.mode, cfg.offload.ratio = 0.9;
    cfg.offload.cast_grads = cfg.offload.cast_weights = c.cast;
    auto probe = create_backend(test::cpu_backend_options());
    const MemoryPlan plan = plan_memory(cfg, 1, 0, machine_profile_of(*probe));
    SCOPED_TRACE(str_cat(c.name, "\n", format_plan(cfg, 1, plan, machine_profile_of(*probe))));
    // What the layout before kept: every gradient on the device, and no ring.
    size_t ring = 0;
    for (const PlanTerm& t : plan.device)
      if (t.name == "gradients of offloaded buckets in flight (ring)") ring = t.bytes;
    ASSERT_GT(ring, 0u);
    const size_t whole_gradients = plan.device_peak - ring + static_cast<size_t>(plan.host_params) * dtype_size(c.dt);
    EXPECT_GT(whole_gradients, plan.device_peak);
    cfg.backend.device_memory_limit = plan.device_peak;
    const Trained t = train_steps(cfg, "cpu");
    EXPECT_EQ(t.peak, plan.device_peak);
    for (float loss : t.losses) EXPECT_TRUE(std::isfinite(loss));
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, OnBackend, testing::Values("cpu"));
INSTANTIATE_TEST_SUITE_P(Cuda, OnBackend, testing::Values("cuda"));

TEST(MemoryPlan, AutoOffloadsThenTilesOnlyAsFarAsNeeded) {
  RunConfig cfg =
      run_config(R"(, "activation_checkpointing": true, "activation_offload": "auto", "mlp_tile_tokens": "auto")");
  MachineProfile m;
  m.name = "test";
  auto peak_with = [&](bool offload, int64_t tile) {
    RunConfig c = cfg;
    c.offload_checkpoints_auto = c.mlp_tile_auto = false;
    c.offload_checkpoints = offload, c.mlp_tile_tokens = tile;
    return plan_memory(c, 1, 0, m).device_peak;
  };
  const size_t nothing = peak_with(false, 0), offloaded = peak_with(true, 0);
  ASSERT_LT(offloaded, nothing);
  // Room for everything: nothing changes.
  m.device_bytes = nothing;
  RunConfig c = cfg;
  resolve_auto_memory(c, 1, m);
  EXPECT_FALSE(c.offload_checkpoints);
  EXPECT_EQ(c.mlp_tile_tokens, 0);
  // Room only with the checkpoints offloaded: they are, and the MLP stays whole.
  m.device_bytes = offloaded;
  c = cfg;
  resolve_auto_memory(c, 1, m);
  EXPECT_TRUE(c.offload_checkpoints);
  EXPECT_EQ(c.mlp_tile_tokens, 0);
  // Less: tiles too, the largest that fit.
  m.device_bytes = offloaded - 1;
  c = cfg;
  const std::string said = resolve_auto_memory(c, 1, m);
  EXPECT_TRUE(c.offload_checkpoints);
  EXPECT_GT(c.mlp_tile_tokens, 0);
  EXPECT_LE(plan_memory(c, 1, 0, m).device_peak, m.device_bytes);
  EXPECT_NE(said.find("tiles of"), std::string::npos) << said;
  EXPECT_FALSE(first_term_over(plan_memory(c, 1, 0, m), m).has_value());
}

// The host term of asynchronous saves is the room the engine reserves to copy its state aside.
TEST(MemoryPlan, AsyncCheckpointCopiesAreWhatTheEngineReserves) {
  RunConfig cfg = run_config("");
  cfg.offload.mode = OffloadMode::SuperOffload, cfg.offload.ratio = 0.5;
  MachineProfile m;
  m.name = "test";
  const MemoryPlan without = plan_memory(cfg, 1, 0, m), with = plan_memory(cfg, 1, 0, m, true);
  ASSERT_EQ(with.host.size(), without.host.size() + 1);
  const PlanTerm& term = with.host.back();
  EXPECT_EQ(term.name, "asynchronous checkpoint copies");
  EXPECT_EQ(with.host_total, without.host_total + term.bytes);

  auto comm = make_mpi_world_communicator();
  auto backend = create_backend(test::cpu_backend_options());
  DecoderModel model(*backend, cfg.model, model_options(cfg, 2, 1));
  EngineOptions eo;
  eo.bucket_size = cfg.bucket_size;
  eo.offload = cfg.offload;
  Engine engine(*backend, model.layout(), eo, *comm);
  EXPECT_EQ(engine.snapshot_space_bytes(), 0u);  // nothing until a trainer saving asynchronously asks
  engine.reserve_snapshot_space();
  EXPECT_EQ(engine.snapshot_space_bytes(), term.bytes);
}

// Planning for another CUDA machine sizes cuDNN's backward workspace from the shape: the fp32 dQ
// accumulator and row sums of its atomic backward (the default), and dP as well when deterministic
// attention may meet a cuDNN before 9.25, if it is within the device's share.
TEST(MemoryPlan, CudnnWorkspaceOfAnotherMachine) {
  RunConfig cfg = run_config("");
  cfg.dtype = DType::BF16;
  const DecoderModel::AttentionShape at = DecoderModel::attention_shape(cfg.model, model_options(cfg, 2, 1), 1);
  const auto workspace = [&](const MachineProfile& m) {
    for (const PlanTerm& t : plan_memory(cfg, 1, 0, m).device)
      if (t.name == "CUDA attention workspace") return t.bytes;
    ADD_FAILURE() << "no CUDA attention workspace term on " << m.name;
    return size_t{0};
  };
  const auto rounded = [](size_t bytes) { return (bytes + 511) / 512 * 512; };
  MachineProfile m = machine_profile("h100-80", 0);
  ASSERT_FALSE(m.deterministic_attention);
  const size_t dq = static_cast<size_t>(at.B * at.Hq * at.S * (at.D + 1)) * 4;
  EXPECT_EQ(workspace(m), rounded(dq));
  m.deterministic_attention = true;
  const size_t s64 = static_cast<size_t>((at.S + 63) / 64 * 64);
  EXPECT_EQ(workspace(m), rounded(std::max(dq, static_cast<size_t>(at.B * at.Hq) * s64 * s64 * 2)));
  m.device_bytes = 1 << 20;  // dP past the share: our kernels take deterministic attention there
  EXPECT_EQ(workspace(m), rounded(dq));
}

TEST(MemoryPlan, NamesTheFirstTermOverCapacity) {
  RunConfig cfg = run_config("");
  MachineProfile m;
  m.name = "a small device";
  const MemoryPlan plan = plan_memory(cfg, 1, 0, m);
  m.device_bytes = plan.device[0].bytes + plan.device[1].bytes + 1;  // the third term does not fit
  const std::optional<std::string> over = first_term_over(plan, m);
  ASSERT_TRUE(over.has_value());
  EXPECT_NE(over->find("'" + plan.device[2].name + "'"), std::string::npos) << *over;
  const std::string table = format_plan(cfg, 1, plan, m);
  EXPECT_NE(table.find("does NOT fit"), std::string::npos) << table;
  const std::string last = table.substr(table.rfind('\n', table.size() - 2) + 1);
  EXPECT_EQ(last.rfind("device peak ", 0), 0u) << last;
  EXPECT_THROW(machine_profile("gh300", 0), Error);
  EXPECT_EQ(machine_profile("gh200-96", 0).device_bytes, size_t{96} * 1000 * 1000 * 1000);
}

}  // namespace
}  // namespace so
