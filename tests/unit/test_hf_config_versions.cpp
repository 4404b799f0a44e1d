// config.json files written by transformers 4.x and 5.x (tests/reference/hf_configs, made by
// make_hf_configs.py with each version's own save_pretrained) mean the same model here: 4.x puts
// rope_theta and rope_scaling at the top level (Phi-3's longrope under "type"), 5.x nests them in
// rope_parameters. Per family and scaled-RoPE kind, both files give the same parsed config (as
// so_train writes it back) and the same frequency table, bit for bit.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>

#include "so/core/error.h"
#include "so/core/json_reader.h"
#include "so/model/model_config.h"
#include "so/model/param_layout.h"
#include "so/model/rope.h"

namespace so {
namespace {

std::string config_path(const std::string& version, const std::string& name) {
  return "tests/reference/hf_configs/" + version + "/" + name + ".json";  // tests run in the source root
}

TEST(HfConfigVersions, Transformers4And5ConfigsMeanTheSame) {
  for (const std::string name : {"llama_tied", "llama_untied", "qwen3_tied", "qwen3_untied", "qwen2", "mistral", "phi3",
                                 "seed_oss", "llama_rope_llama3", "qwen3_rope_yarn"}) {
    SCOPED_TRACE(name);
    const ModelConfig v4 = ModelConfig::from_hf_file(config_path("v4", name));
    const ModelConfig v5 = ModelConfig::from_hf_file(config_path("v5", name));
    EXPECT_EQ(v4.to_hf_json().dump(), v5.to_hf_json().dump());
    const RopeFrequencies r4 = rope_frequencies(v4.rope, v4.rope_theta, v4.head_dim);
    const RopeFrequencies r5 = rope_frequencies(v5.rope, v5.rope_theta, v5.head_dim);
    EXPECT_EQ(r4.inv_freq, r5.inv_freq);
    EXPECT_EQ(r4.attention_factor, r5.attention_factor);
  }
  // The scaled ones really are scaled (a test that compared two default tables would prove little).
  EXPECT_EQ(ModelConfig::from_hf_file(config_path("v4", "llama_rope_llama3")).rope.type, "llama3");
  EXPECT_EQ(ModelConfig::from_hf_file(config_path("v4", "qwen3_rope_yarn")).rope.type, "yarn");
  EXPECT_EQ(ModelConfig::from_hf_file(config_path("v4", "phi3")).pad_token_id, 5);
}

// Phi-4-mini's RoPE (a quarter of each head unrotated, longrope) is refused by name in either
// vintage: 4.x writes partial_rotary_factor at the top level, 5.x inside rope_parameters.
TEST(HfConfigVersions, PartialRotaryAndLongropeAreRefusedByName) {
  for (const std::string version : {"v4", "v5"}) {
    SCOPED_TRACE(version);
    try {
      ModelConfig::from_hf_file(config_path(version, "phi3_longrope_partial"));
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("partial_rotary_factor' is 0.75"), std::string::npos) << e.what();
    }
  }
}

// A key absent means the family's default; the same key given as null means what transformers
// makes of None there: no padding index, no window, derived from the other keys, or an error.
// tests/reference/fixtures/hf_config_absent_null.json (make_hf_config_defaults_fixture.py) holds,
// per family and key, both configs and the model transformers built from each (or its error).
TEST(HfConfigVersions, AbsentAndNullKeysMeanWhatTheyMeanToTransformers) {
  const nlohmann::json fixture = read_json_file("tests/reference/fixtures/hf_config_absent_null.json", "fixture");
  int checked = 0, refused = 0;
  for (const nlohmann::json& c : fixture.at("cases")) {
    const std::string name = str_cat(c.at("family").get<std::string>(), " ", c.at("key").get<std::string>(), " ",
                                     c.at("state").get<std::string>(), " ", c.at("config").dump());
    SCOPED_TRACE(name);
    if (c.contains("error")) {
      try {
        ModelConfig::from_hf_json(c.at("config"), "fixture");
        ADD_FAILURE() << "accepted; transformers: " << c.at("error").get<std::string>();
      } catch (const Error& e) {
        // A null is refused by its own name.
        if (c.at("state") == "null") {
          EXPECT_NE(std::string(e.what()).find("'" + c.at("key").get<std::string>() + "'"), std::string::npos)
              << e.what();
        }
      }
      ++refused;
      continue;
    }
    ModelConfig m;
    try {
      m = ModelConfig::from_hf_json(c.at("config"), "fixture");
    } catch (const Error& e) {
      ADD_FAILURE() << "refused: " << e.what();
      continue;
    }
    const nlohmann::json& want = c.at("expect");
    EXPECT_EQ(m.pad_token_id, want.at("pad_token_id").get<int64_t>());
    EXPECT_EQ(m.head_dim, want.at("head_dim").get<int64_t>());
    EXPECT_EQ(m.num_kv_heads, want.at("num_key_value_heads").get<int64_t>());
    std::vector<int64_t> windows;
    for (int64_t l = 0; l < m.num_layers; ++l) windows.push_back(m.layer_window(l));
    EXPECT_EQ(windows, want.at("windows").get<std::vector<int64_t>>());
    EXPECT_EQ(m.rms_norm_eps, static_cast<float>(want.at("rms_norm_eps").get<double>()));
    EXPECT_EQ(m.max_position_embeddings, want.at("max_position_embeddings").get<int64_t>());
    EXPECT_EQ(m.rope_theta, want.at("rope_theta").get<double>());
    EXPECT_EQ(m.tie_word_embeddings, want.at("tie_word_embeddings").get<bool>());
    EXPECT_EQ(m.qkv_bias, want.at("qkv_bias").get<bool>());
    EXPECT_EQ(m.o_bias, want.at("o_bias").get<bool>());
    ++checked;
  }
  EXPECT_GT(checked, 100);
  EXPECT_GT(refused, 50);

  // Phi-3 with a vocabulary smaller than its default pad_token_id (32000): null (transformers 5's
  // "none") trains with no padding row; absent takes the default, which is refused by name.
  nlohmann::json phi3 = {{"model_type", "phi3"},    {"vocab_size", 384},      {"hidden_size", 32},
                         {"intermediate_size", 64}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                         {"pad_token_id", nullptr}};
  EXPECT_EQ(ModelConfig::from_hf_json(phi3, "phi3").pad_token_id, -1);
  EXPECT_TRUE(ModelConfig::from_hf_json(phi3, "phi3").to_hf_json().at("pad_token_id").is_null());
  phi3.erase("pad_token_id");
  try {
    ModelConfig::from_hf_json(phi3, "phi3");
    ADD_FAILURE() << "an absent pad_token_id outside the vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'pad_token_id' is absent and phi3's default (32000)"), std::string::npos)
        << e.what();
  }
}

// Every family's fixture configs (both transformers vintages and the exported model directories)
// read back as written: the config so_train writes describes the same model, down to the
// checkpoint's tensor names, shapes and how they split into parameters.
TEST(HfConfigVersions, EveryFamilysConfigReadsBackAsWritten) {
  std::vector<std::string> paths;
  for (const char* dir : {"tests/reference/hf_configs/v4", "tests/reference/hf_configs/v5"})
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.path().stem() != "phi3_longrope_partial") paths.push_back(e.path().string());  // refused (above)
  for (const auto& e : std::filesystem::directory_iterator("tests/reference/hf_models"))
    if (e.is_directory()) paths.push_back((e.path() / "config.json").string());
  std::set<std::string> families;
  for (const std::string& path : paths) {
    SCOPED_TRACE(path);
    const ModelConfig read = ModelConfig::from_hf_file(path);
    const nlohmann::json written = read.to_hf_json();
    const ModelConfig again = ModelConfig::from_hf_json(written, "written " + path);
    EXPECT_EQ(again.to_hf_json(), written);
    EXPECT_EQ(again.num_parameters(), read.num_parameters());
    const ParamLayout a = ParamLayout::for_model(read), b = ParamLayout::for_model(again);
    ASSERT_EQ(a.hf_tensors.size(), b.hf_tensors.size());
    for (size_t i = 0; i < a.hf_tensors.size(); ++i) {
      EXPECT_EQ(a.hf_tensors[i].name, b.hf_tensors[i].name);
      EXPECT_EQ(a.hf_tensors[i].shape, b.hf_tensors[i].shape);
      EXPECT_EQ(a.hf_tensors[i].parts, b.hf_tensors[i].parts);
    }
    families.insert(read.model_type);
  }
  // Every family has a fixture here (a new family's row comes with its fixture).
  try {
    ModelConfig::from_hf_json({{"model_type", "gpt2"}}, "gpt2");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    const std::string what = e.what(), list = what.substr(what.find("supported: ") + 11);
    std::set<std::string> supported;
    for (size_t at = 0; at < list.size();) {
      const size_t end = std::min(list.find(", ", at), list.size());
      supported.insert(list.substr(at, end - at));
      at = end + 2;
    }
    EXPECT_EQ(families, supported) << what;
  }
}

}  // namespace
}  // namespace so
