// config.json files written by transformers 4.x and 5.x (tests/reference/hf_configs, made by
// make_hf_configs.py with each version's own save_pretrained) mean the same model here: 4.x puts
// rope_theta and rope_scaling at the top level (Phi-3's longrope under "type"), 5.x nests them in
// rope_parameters. Per family and scaled-RoPE kind, both files give the same parsed config (as
// so_train writes it back) and the same frequency table, bit for bit.
#include <gtest/gtest.h>

#include <string>

#include "so/core/error.h"
#include "so/model/model_config.h"
#include "so/model/rope.h"

namespace so {
namespace {

std::string config_path(const std::string& version, const std::string& name) {
  return "tests/reference/hf_configs/" + version + "/" + name + ".json";  // tests run in the source root
}

TEST(HfConfigVersions, Transformers4And5ConfigsMeanTheSame) {
  for (const std::string name : {"llama_tied", "llama_untied", "qwen3_tied", "qwen3_untied", "qwen2", "mistral",
                                 "phi3", "seed_oss", "llama_rope_llama3", "qwen3_rope_yarn"}) {
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

}  // namespace
}  // namespace so
