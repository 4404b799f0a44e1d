#include "so/model/model_family.h"

#include "so/core/error.h"

namespace so {

namespace {
// A table: one family a row, its fields packed (clang-format would give each field a line).
// clang-format off
constexpr ModelFamily kFamilies[] = {
    {.model_type = "llama", .architecture = "LlamaForCausalLM", .qkv_bias_key = "attention_bias",
     .o_bias_key = "attention_bias", .default_max_positions = 2048,
     .nullable = "head_dim num_key_value_heads sliding_window use_sliding_window max_window_layers layer_types"},
    {.model_type = "qwen3", .architecture = "Qwen3ForCausalLM", .qk_norm = true, .qkv_bias_key = "attention_bias",
     .o_bias_key = "attention_bias", .window_layers = true, .default_head_dim = 128, .default_kv_heads = 32,
     .default_max_positions = 32768, .default_window = 4096, .nullable = "num_key_value_heads sliding_window layer_types"},
    {.model_type = "qwen2", .architecture = "Qwen2ForCausalLM", .qkv_bias = true, .window_layers = true,
     .default_kv_heads = 32, .default_max_positions = 32768, .default_window = 4096,
     .nullable = "num_key_value_heads sliding_window layer_types attention_bias"},
    {.model_type = "mistral", .architecture = "MistralForCausalLM", .window = true, .default_kv_heads = 8,
     .default_max_positions = 131072, .default_window = 4096,
     .nullable = "head_dim sliding_window use_sliding_window max_window_layers layer_types attention_bias"},
    {.model_type = "phi3", .architecture = "Phi3ForCausalLM", .window = true, .fused_qkv = "self_attn.qkv_proj.weight",
     .fused_gate_up = "mlp.gate_up_proj.weight", .scaled_rope = false,
     .default_pad = 32000, .default_max_positions = 4096, .default_rms_norm_eps = 1e-5f,
     .nullable = "num_key_value_heads sliding_window use_sliding_window max_window_layers layer_types attention_bias"},
    {.model_type = "seed_oss", .architecture = "SeedOssForCausalLM", .qkv_bias_key = "attention_bias", .qkv_bias = true,
     .o_bias_key = "attention_out_bias", .default_pad = 1, .default_head_dim = 128, .default_kv_heads = 8,
     .default_max_positions = 524288, .default_dropout = 0.1, .trains_dropout = true,
     .nullable = "head_dim num_key_value_heads sliding_window use_sliding_window max_window_layers layer_types"},
    {.model_type = "qwen3_moe", .architecture = "Qwen3MoeForCausalLM", .qk_norm = true,
     .qkv_bias_key = "attention_bias", .o_bias_key = "attention_bias", .window_flagged = true, .default_kv_heads = 4,
     .default_max_positions = 32768, .default_window = 4096, .moe = ModelConfig::Moe::Style::Qwen3,
     .nullable = "sliding_window max_window_layers layer_types mlp_only_layers"},
    {.model_type = "gpt_oss", .architecture = "GptOssForCausalLM", .qkv_bias_key = "attention_bias", .qkv_bias = true,
     .o_bias_key = "attention_bias", .o_bias = true, .attention_sinks = true, .default_head_dim = 64,
     .default_kv_heads = 8, .default_max_positions = 131072, .default_rms_norm_eps = 1e-5f, .default_window = 128,
     .moe = ModelConfig::Moe::Style::GptOss, .typed_windows = true, .default_yarn = true,
     .nullable = "layer_types use_sliding_window max_window_layers"},
};
// clang-format on
}  // namespace

const ModelFamily* find_model_family(const std::string& model_type) {
  for (const ModelFamily& f : kFamilies)
    if (model_type == f.model_type) return &f;
  return nullptr;
}

const ModelFamily& model_family(const std::string& model_type) {
  const ModelFamily* f = find_model_family(model_type);
  SO_CHECK(f, "model_type '", model_type, "' is not supported; supported: ", supported_model_types());
  return *f;
}

std::string supported_model_types() {
  std::string list;
  for (const ModelFamily& f : kFamilies) list += (list.empty() ? "" : ", ") + std::string(f.model_type);
  return list;
}

}  // namespace so
