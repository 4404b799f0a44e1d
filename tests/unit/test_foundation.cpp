// Unit tests of the foundation's small parts: bf16 rounding, CPU streams and events, the memory
// pool's capacity, config validation, data files and sampling, LR schedules, FLOP counting.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "so/backend/backend.h"
#include "so/core/error.h"
#include "so/data/batch_sampler.h"
#include "so/engine/bucket.h"
#include "so/train/run_config.h"
#include "tests/test_util.h"

namespace so {
namespace {

TEST(Bf16, RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(f32_to_bf16(1.0f).bits, 0x3f80);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties go to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.00390625f).bits, 0x3f80);
  // 1 + 3*2^-8 is halfway between 1.0078125 (odd mantissa) and 1.015625: goes up to even.
  EXPECT_EQ(f32_to_bf16(1.01171875f).bits, 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  // A NaN whose payload sits only in the low bits must not truncate to Inf.
  uint32_t u = 0x7f800001u;
  float f;
  std::memcpy(&f, &u, 4);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
  EXPECT_TRUE(std::isinf(bf16_to_f32(f32_to_bf16(INFINITY))));
}

TEST(CpuStreams, EventsOrderWorkAcrossStreams) {
  auto be = create_backend(test::cpu_backend_options());
  Stream& a = be->stream(StreamKind::Compute);
  Stream& b = be->stream(StreamKind::D2H);
  std::atomic<int> value{0};
  int seen = -1;
  auto ev = be->create_event();
  be->host_func(a, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    value = 42;
  });
  be->record(*ev, a);
  be->wait(b, *ev);
  be->host_func(b, [&] { seen = value.load(); });
  be->synchronize(b);
  EXPECT_EQ(seen, 42);
}

TEST(CpuStreams, AnErrorReachesWaitersInsteadOfHangingThem) {
  auto be = create_backend(test::cpu_backend_options());
  Stream& a = be->stream(StreamKind::Compute);
  Stream& b = be->stream(StreamKind::H2D);
  bool ran = false;
  auto ev = be->create_event();
  be->host_func(a, [] { SO_FAIL("injected failure"); });
  be->record(*ev, a);
  be->wait(b, *ev);
  be->host_func(b, [&] { ran = true; });
  EXPECT_THROW(be->synchronize(b), Error);
  EXPECT_FALSE(ran);
  EXPECT_THROW(be->synchronize(a), Error);
}

TEST(CpuBackend, CapacityLimitNamesTheAllocation) {
  BackendOptions o = test::cpu_backend_options();
  o.device_memory_limit = 1 << 20;
  auto be = create_backend(o);
  auto a = be->alloc(600 << 10, "first");
  try {
    auto b = be->alloc(600 << 10, "activations of layer 7");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("activations of layer 7"), std::string::npos);
  }
  a.reset();
  EXPECT_EQ(be->memory_stats().in_use, 0u);
  EXPECT_NO_THROW(be->alloc(600 << 10, "after free"));
}

nlohmann::json demo_config() {
  return nlohmann::json::parse(R"({
    "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "model": {"config": "configs/models/tiny.json"},
    "data": {"type": "text", "path": "data/corpus/austen.txt", "seq_len": 32},
    "train": {"steps": 3}
  })");
}

std::string config_error(nlohmann::json doc) {
  try {
    parse_run_config(doc, "test.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RunConfig, AcceptsTheDemoShape) {
  const RunConfig c = parse_run_config(demo_config(), "test.json");
  EXPECT_EQ(c.model.num_layers, 4);
  EXPECT_EQ(c.micro_batch, 2);
  EXPECT_FLOAT_EQ(c.schedule.base_lr, 1e-3f);
}

TEST(RunConfig, RejectsWithTheKeyPath) {
  auto doc = demo_config();
  doc["optimizer"]["params"]["lrr"] = 1;
  EXPECT_NE(config_error(doc).find("unknown key 'optimizer.params.lrr'"), std::string::npos) << config_error(doc);
  doc = demo_config();
  doc["train_micro_batch_size_per_gpu"] = "two";
  EXPECT_NE(config_error(doc).find("'train_micro_batch_size_per_gpu' must be an integer"), std::string::npos);
  doc = demo_config();
  doc["data"]["path"] = "no/such/file.txt";
  EXPECT_NE(config_error(doc).find("'data.path' names 'no/such/file.txt', which does not exist"), std::string::npos);
  doc = demo_config();
  doc["model"] = {{"inline", {{"model_type", "llama"}, {"vocab_size", 256}, {"hidden_size", 64},
                              {"intermediate_size", 128}, {"num_hidden_layers", 1}, {"num_attention_heads", 6},
                              {"num_key_value_heads", 4}, {"head_dim", 16}}}};
  EXPECT_NE(config_error(doc).find("'num_attention_heads' (6) is not divisible by num_key_value_heads (4)"),
            std::string::npos)
      << config_error(doc);
  doc = demo_config();
  doc["fp16"] = {{"enabled", true}};
  EXPECT_NE(config_error(doc).find("fp16"), std::string::npos);
  doc = demo_config();
  doc["train_batch_size"] = 7;
  EXPECT_NE(config_error(doc).find("'train_batch_size' is 7"), std::string::npos);
  doc = demo_config();
  doc["data"]["seq_len"] = 4096;
  EXPECT_NE(config_error(doc).find("max_position_embeddings"), std::string::npos);
}

TEST(RunConfig, OverridesParseJsonOrStrings) {
  auto doc = demo_config();
  apply_override(doc, "optimizer.params.lr=3e-4");
  apply_override(doc, "data.type=synthetic");
  apply_override(doc, "bf16.enabled=true");
  EXPECT_DOUBLE_EQ(doc["optimizer"]["params"]["lr"].get<double>(), 3e-4);
  EXPECT_EQ(doc["data"]["type"], "synthetic");
  EXPECT_TRUE(doc["bf16"]["enabled"].get<bool>());
  EXPECT_THROW(apply_override(doc, "novalue"), Error);
  EXPECT_THROW(apply_override(doc, "data.type.x=1"), Error);
}

TEST(Data, TokenFileRoundTripAndCorruption) {
  const auto dir = std::filesystem::temp_directory_path() / ("so_test_data_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "t.bin").string();
  std::vector<int32_t> tokens(1000);
  for (int i = 0; i < 1000; ++i) tokens[i] = (i * 37) % 300;
  write_token_file(path, tokens, 2);
  {
    auto src = open_token_file(path);
    ASSERT_EQ(src->size(), 1000);
    std::vector<int32_t> got(1000);
    src->read(0, 1000, got.data());
    EXPECT_EQ(got, tokens);
  }
  std::filesystem::resize_file(path, 32 + 999 * 2);
  try {
    open_token_file(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  std::ofstream(path, std::ios::trunc) << "plain text, not tokens, but long enough for a header";
  EXPECT_THROW(open_token_file(path), Error);
  std::filesystem::remove_all(dir);
}

TEST(Data, SamplingIsDeterministicShiftedAndChecked) {
  auto src = make_synthetic_tokens(50, 10000, 7);
  BatchSampler a(*src, 16, 4, 50, 99), b(*src, 16, 4, 50, 99);
  const TokenBatch x = a.next(), y = a.next();
  EXPECT_EQ(x.inputs, b.batch_at(0).inputs);
  EXPECT_EQ(y.inputs, b.batch_at(4).inputs);
  EXPECT_NE(x.inputs, y.inputs);
  EXPECT_EQ(a.position(), 8);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(x.targets[i], x.inputs[i + 1]);
  EXPECT_EQ(x.positions[17], 1);
  BatchSampler small_vocab(*src, 16, 4, 10, 99);  // tokens up to 49 exceed vocab 10
  EXPECT_THROW(small_vocab.next(), Error);
  EXPECT_THROW(BatchSampler(*make_synthetic_tokens(50, 10, 1), 16, 1, 50, 1), Error);
}

TEST(LrSchedule, DeepSpeedWarmupCosineShape) {
  LrSchedule s;
  s.type = "WarmupCosineLR";
  s.base_lr = 1.0;
  s.warmup_steps = 10;
  s.warmup_type = "linear";
  s.total_steps = 110;
  s.cos_min_ratio = 0.1;
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.0);
  EXPECT_DOUBLE_EQ(s.lr_at(5), 0.5);
  EXPECT_NEAR(s.lr_at(59), 0.1 + 0.9 * 0.5, 1e-12);  // halfway through the cosine
  EXPECT_NEAR(s.lr_at(109), 0.1, 1e-12);
  s.warmup_type = "log";
  EXPECT_NEAR(s.lr_at(4), std::log(5.0) / std::log(10.0), 1e-12);
}

TEST(Model, FlopsAndBucketsFollowTheLayout) {
  const ModelConfig c = ModelConfig::from_hf_file("configs/models/tiny.json");
  const ParamLayout L = ParamLayout::for_model(c);
  int64_t matmul = 0, total = 0;
  for (const ParamInfo& p : L.params) {
    total += p.numel;
    if (p.shape.size() == 2) matmul += p.numel;  // tied: the embedding doubles as lm_head
  }
  EXPECT_EQ(total, c.num_parameters());
  const int64_t S = 128;
  const double attn = c.num_layers * 4.0 * c.head_dim * c.num_heads * (S + 1) / 2.0;
  EXPECT_DOUBLE_EQ(train_flops_per_token(c, S), 3.0 * (2.0 * matmul + attn));

  const auto buckets = make_buckets(L, 20000);
  ASSERT_GT(buckets.size(), 3u);
  EXPECT_EQ(buckets.front().end, L.total);  // head first, in backward order
  EXPECT_EQ(buckets.back().begin, 0);
  for (size_t i = 1; i < buckets.size(); ++i) {
    EXPECT_EQ(buckets[i].end, buckets[i - 1].begin);
    EXPECT_LE(buckets[i].ready_unit, buckets[i - 1].ready_unit);
  }
  EXPECT_EQ(buckets.back().ready_unit, 0);  // tied embedding: final only after embedding backward
}

}  // namespace
}  // namespace so

namespace so {
namespace {

// The shipped model shapes parse and have the parameter counts their names promise.
TEST(ModelConfigs, ShippedShapesParseWithExpectedSizes) {
  const std::pair<const char*, double> expected[] = {{"llama-3-8b", 8.03e9}, {"llama-3-70b", 70.55e9},
                                                     {"qwen3-14b", 14.77e9}, {"llama-13b", 13.0e9},
                                                     {"llama-25b", 25.0e9}};
  for (const auto& [name, params] : expected) {
    const ModelConfig c = ModelConfig::from_hf_file(std::string("configs/models/") + name + ".json");
    EXPECT_NEAR(c.num_parameters() / params, 1.0, 0.02) << name << ": " << c.num_parameters();
  }
}

}  // namespace
}  // namespace so
