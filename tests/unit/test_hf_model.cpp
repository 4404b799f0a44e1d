// Hugging Face model directories: the fixtures in tests/reference/hf_models/ were written by
// transformers' save_pretrained (make_hf_models.py; bf16, fp16 and fp32, tied and untied, one
// sharded). so_train must load them, check every tensor against config.json, and compute the
// loss transformers computed; its export must load back bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "so/io/safetensors.h"
#include "so/model/hf_model.h"
#include "tests/reference/model_runner.h"
#include "tests/test_util.h"

namespace so {
namespace {

namespace fs = std::filesystem;

const fs::path kModels = fs::path(SO_FIXTURE_DIR).parent_path() / "hf_models";

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}
void write_json(const fs::path& p, const nlohmann::json& j) { std::ofstream(p) << j.dump(2); }

const nlohmann::json& reference() {
  static const nlohmann::json r = read_json(kModels / "reference.json");
  return r;
}
std::vector<int32_t> tokens() { return reference()["tokens"].get<std::vector<int32_t>>(); }

float so_train_loss(const HfModel& m) {
  test::ModelRunner runner(m.config, static_cast<int64_t>(tokens().size()) - 1);
  runner.load(m.values);
  return runner.step(tokens(), 0.0f);
}

class HfFixtureTest : public testing::TestWithParam<std::string> {};

TEST_P(HfFixtureTest, LoadsAndMatchesTransformersLoss) {
  const HfModel m = load_hf_model((kModels / GetParam()).string());
  const nlohmann::json& ref = reference()["models"][GetParam()];
  const bool tied = GetParam().find("_tied") != std::string::npos;
  EXPECT_EQ(m.config.tie_word_embeddings, tied);
  EXPECT_EQ(m.layout.lm_head == m.layout.embedding, tied);
  ASSERT_EQ(m.values.size(), m.layout.params.size());
  for (size_t id = 0; id < m.values.size(); ++id)
    EXPECT_EQ(static_cast<int64_t>(m.values[id].size()), m.layout.params[id].numel) << m.layout.params[id].name;
  EXPECT_EQ(m.layout.params[m.layout.embedding].shape, (std::vector<int64_t>{256, 64}));
  if (m.config.model_type == "qwen3") {
    EXPECT_EQ(m.layout.params[m.layout.layers[0].q].shape, (std::vector<int64_t>{128, 64}));  // head_dim 32
  }

  const float loss = so_train_loss(m), want = ref["loss"].get<float>();
  EXPECT_LE(std::abs(loss - want) / want, 1e-5) << "so_train " << loss << " vs transformers " << want;
  std::printf("[%s] loss %.7f, transformers %.7f (rel %.1e)\n", GetParam().c_str(), loss, want,
              std::abs(loss - want) / want);
}

INSTANTIATE_TEST_SUITE_P(SavePretrained, HfFixtureTest,
                         testing::Values("llama_tied_bf16", "llama_untied_fp32", "llama_untied_fp16_sharded",
                                         "qwen3_tied_bf16", "qwen2_untied_bf16", "mistral_untied_fp32",
                                         "phi3_untied_bf16", "seed_oss_tied_fp32", "qwen3_moe_untied_bf16",
                                         "gpt_oss_untied_bf16", "gpt_oss_mxfp4"));

class HfDirTest : public testing::Test {
 protected:
  // A copy of fixture `name` to edit.
  fs::path copy(const std::string& name) {
    const fs::path dst = tmp_ / name;
    fs::copy(kModels / name, dst, fs::copy_options::recursive);
    return dst;
  }
  static std::string load_error(const fs::path& dir) {
    return test::error_message([&] { load_hf_model(dir.string()); });
  }
  struct Extra {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> values;
  };
  // Rewrites dir/model.safetensors (fp32) with m's parameters plus `extra`.
  static void write_weights(const fs::path& dir, const HfModel& m, const std::vector<Extra>& extra) {
    std::vector<SafetensorsEntry> entries;
    for (const ParamInfo& p : m.layout.params) entries.push_back({p.name, p.shape});
    for (const Extra& e : extra) entries.push_back({e.name, e.shape});
    write_safetensors((dir / "model.safetensors").string(), entries, DType::F32,
                      [&](size_t i) { return i < m.values.size() ? m.values[i] : extra[i - m.values.size()].values; });
  }

  test::ScratchDir scratch_{testing::UnitTest::GetInstance()->current_test_info()->name()};
  const fs::path tmp_ = scratch_.path();
};

TEST_F(HfDirTest, ExportRoundTripIsBitwiseInF32AndRoundsInBf16) {
  for (const std::string name : {"llama_untied_fp32", "qwen3_tied_bf16", "qwen2_untied_bf16", "mistral_untied_fp32",
                                 "phi3_untied_bf16", "seed_oss_tied_fp32"}) {
    const HfModel m = load_hf_model((kModels / name).string());
    const auto get = [&](int id) { return m.values[id]; };
    export_hf_model((tmp_ / "f32").string(), m.config, m.layout, get, {DType::F32, 0});
    const HfModel f32 = load_hf_model((tmp_ / "f32").string());
    EXPECT_EQ(f32.config.to_hf_json(), m.config.to_hf_json()) << name;
    for (size_t id = 0; id < m.values.size(); ++id)
      ASSERT_EQ(std::memcmp(f32.values[id].data(), m.values[id].data(), m.values[id].size() * 4), 0)
          << name << " " << m.layout.params[id].name;

    export_hf_model((tmp_ / "bf16").string(), m.config, m.layout, get, {DType::BF16, 0});
    const HfModel bf = load_hf_model((tmp_ / "bf16").string());
    for (size_t id = 0; id < m.values.size(); ++id)
      for (size_t i = 0; i < m.values[id].size(); ++i)
        ASSERT_EQ(bf.values[id][i], bf16_to_f32(f32_to_bf16(m.values[id][i])))
            << name << " " << m.layout.params[id].name;
    // Like save_pretrained: a tied model's file has no lm_head.weight.
    EXPECT_EQ(SafetensorsFile((tmp_ / "bf16/model.safetensors").string()).find("lm_head.weight") == nullptr,
              m.config.tie_word_embeddings);
    EXPECT_EQ(read_json(tmp_ / "bf16/config.json")["dtype"], "bfloat16");
    fs::remove_all(tmp_ / "f32");
    fs::remove_all(tmp_ / "bf16");
  }
}

TEST_F(HfDirTest, ShardedExportWritesAnIndexAndReplacesTheOtherLayout) {
  const HfModel m = load_hf_model((kModels / "llama_untied_fp16_sharded").string());
  const auto get = [&](int id) { return m.values[id]; };
  const fs::path out = tmp_ / "out";
  export_hf_model(out.string(), m.config, m.layout, get, {DType::F32, 0});
  ASSERT_TRUE(fs::exists(out / "model.safetensors"));

  export_hf_model(out.string(), m.config, m.layout, get, {DType::F32, 100'000});
  EXPECT_FALSE(fs::exists(out / "model.safetensors")) << "a stale single file would shadow the shards";
  const nlohmann::json index = read_json(out / "model.safetensors.index.json");
  EXPECT_EQ(index["weight_map"].size(), m.layout.params.size());
  EXPECT_TRUE(fs::exists(out / "model-00005-of-00005.safetensors"));  // greedy, in layout order
  const HfModel back = load_hf_model(out.string());
  for (size_t id = 0; id < m.values.size(); ++id) ASSERT_EQ(back.values[id], m.values[id]) << id;

  export_hf_model(out.string(), m.config, m.layout, get, {DType::BF16, 0});
  EXPECT_FALSE(fs::exists(out / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(out / "model-00001-of-00005.safetensors"));
  for (const fs::directory_entry& e : fs::directory_iterator(out))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

TEST_F(HfDirTest, RefusesShapesThatDisagreeWithTheConfig) {
  const fs::path dir = copy("llama_tied_bf16");
  nlohmann::json cfg = read_json(dir / "config.json");
  cfg["intermediate_size"] = 96;
  write_json(dir / "config.json", cfg);
  const std::string msg = load_error(dir);
  EXPECT_NE(msg.find("does not match its config.json (6 problems)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tensor 'model.layers.0.mlp.gate_proj.weight' in '" + (dir / "model.safetensors").string() +
                     "' has shape [128, 64] (BF16); config.json needs [96, 64]"),
            std::string::npos)
      << msg;

  // Every one of the 21 tensors depends on hidden_size: 20 are listed.
  const fs::path other = copy("llama_untied_fp32");
  cfg = read_json(other / "config.json");
  cfg["hidden_size"] = 32;
  write_json(other / "config.json", cfg);
  const std::string all = load_error(other);
  EXPECT_NE(all.find("(21 problems)"), std::string::npos) << all;
  EXPECT_NE(all.find("; and 1 more"), std::string::npos) << all;
}

TEST_F(HfDirTest, RefusesMissingAndUnexpectedTensors) {
  fs::path dir = copy("llama_tied_bf16");
  nlohmann::json cfg = read_json(dir / "config.json");
  cfg["tie_word_embeddings"] = false;
  write_json(dir / "config.json", cfg);
  std::string msg = load_error(dir);
  EXPECT_NE(msg.find("tensor 'lm_head.weight' [256, 64] is missing (config.json has tie_word_embeddings false)"),
            std::string::npos)
      << msg;

  cfg["tie_word_embeddings"] = true;
  cfg["num_hidden_layers"] = 1;
  write_json(dir / "config.json", cfg);
  msg = load_error(dir);
  EXPECT_NE(msg.find("(9 problems)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unexpected tensor 'model.layers.1.self_attn.k_proj.weight' [32, 64] (BF16) in '"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("the model of config.json has no such parameter"), std::string::npos) << msg;
}

TEST_F(HfDirTest, TiedHeadMayBeSavedIfEqualAndRotaryBuffersAreIgnored) {
  const fs::path dir = copy("llama_tied_bf16");
  const HfModel m = load_hf_model(dir.string());
  const std::vector<float> embedding = m.values[m.layout.embedding];
  write_weights(dir, m, {{"lm_head.weight", {256, 64}, embedding}});
  EXPECT_EQ(load_hf_model(dir.string()).values[m.layout.embedding], embedding);

  std::vector<float> other = embedding;
  other[5] += 1.0f;
  write_weights(dir, m, {{"lm_head.weight", {256, 64}, other}});
  EXPECT_NE(load_error(dir).find("lm_head.weight differs from model.embed_tokens.weight but config.json ties them"),
            std::string::npos);

  write_weights(dir, m, {{"model.rotary_emb.inv_freq", {8}, std::vector<float>(8, 0.5f)}});
  EXPECT_EQ(load_error(dir), "");
}

TEST_F(HfDirTest, RefusesInconsistentShardIndexes) {
  const fs::path dir = copy("llama_untied_fp16_sharded");
  const nlohmann::json index = read_json(dir / "model.safetensors.index.json");
  const std::string shard1 = "model-00001-of-00003.safetensors", shard2 = "model-00002-of-00003.safetensors";
  auto with_entry = [&](const std::string& tensor, const std::string& file) {
    nlohmann::json j = index;
    j["weight_map"][tensor] = file;
    write_json(dir / "model.safetensors.index.json", j);
    return load_error(dir);
  };
  EXPECT_EQ(with_entry("model.norm.weight", index["weight_map"]["model.norm.weight"].get<std::string>()), "");
  std::string msg = with_entry("model.norm.weight", "model-00009-of-00009.safetensors");
  EXPECT_NE(
      msg.find("maps tensor 'model.norm.weight' to shard 'model-00009-of-00009.safetensors', which does not exist"),
      std::string::npos)
      << msg;
  msg = with_entry("model.embed_tokens.weight", shard2);
  EXPECT_NE(msg.find("maps tensor 'model.embed_tokens.weight' to shard '" + (dir / shard2).string() +
                     "', which does not hold it"),
            std::string::npos)
      << msg;
  msg = with_entry("model.norm.weight", "../" + shard1);
  EXPECT_NE(msg.find("which is not a file name in the directory"), std::string::npos) << msg;

  nlohmann::json j = index;
  j["weight_map"].erase("model.embed_tokens.weight");
  write_json(dir / "model.safetensors.index.json", j);
  msg = load_error(dir);
  EXPECT_NE(msg.find("holds tensor 'model.embed_tokens.weight', which '" +
                     (dir / "model.safetensors.index.json").string() + "' does not list"),
            std::string::npos)
      << msg;

  fs::remove(dir / "model.safetensors.index.json");
  msg = load_error(dir);
  EXPECT_NE(msg.find("holds neither model.safetensors nor model.safetensors.index.json"), std::string::npos) << msg;
}

}  // namespace
}  // namespace so
