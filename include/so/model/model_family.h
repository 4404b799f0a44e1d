#pragma once
// The families so_train trains (llama, qwen3, qwen2, mistral, phi3, seed_oss, qwen3_moe, gpt_oss):
// one row each of what sets a family apart, in one place.
#include <cstdint>
#include <string>

#include "so/model/model_config.h"

namespace so {

// A model family is data: its model_type, the class transformers builds for it, which of the
// decoder's optional pieces it switches on, its config defaults and the checkpoint names that
// differ from Llama's. The table of every family is model_family.cpp; config.json is read and
// written from it (model_config.cpp), the tensors are named from it (param_layout.cpp).
struct ModelFamily {
  const char* model_type;
  const char* architecture;
  bool qk_norm = false;
  // Projection biases: the config key that switches them on (null: fixed for the family, and a
  // key of that name is ignored as transformers ignores it) and the value when absent.
  const char* qkv_bias_key = nullptr;
  bool qkv_bias = false;
  const char* o_bias_key = nullptr;
  bool o_bias = false;
  // sliding_window applies to every layer (Mistral, Phi-3; transformers ignores layer_types there).
  bool window = false;
  // Qwen2/Qwen3: sliding_window applies only with use_sliding_window, on the layers layer_types
  // marks "sliding_attention" (by default those from max_window_layers on).
  bool window_layers = false;
  // Qwen3-MoE: with use_sliding_window, on every layer (its config has no layer_types).
  bool window_flagged = false;
  bool attention_sinks = false;  // self_attn.sinks per layer (GPT-OSS)
  // Checkpoint tensors that stack several of the decoder's (Phi-3): q|k|v and gate|up, their names
  // under model.layers.N. (null: separate q_proj, k_proj, v_proj, gate_proj, up_proj).
  const char* fused_qkv = nullptr;
  const char* fused_gate_up = nullptr;
  bool scaled_rope = true;  // transformers' class takes linear/dynamic/yarn/llama3 (Phi-3's only longrope)
  // The family's defaults, as its transformers config class has them, for a key the config leaves
  // out (a key given as null means None: see nullable).
  int64_t default_pad = -1;           // pad_token_id (-1: no padding row)
  int64_t default_head_dim = 0;       // head_dim (0: hidden_size / num_attention_heads)
  int64_t default_kv_heads = 0;       // num_key_value_heads (0: num_attention_heads)
  int64_t default_max_positions = 0;  // max_position_embeddings
  float default_rms_norm_eps = 1e-6f;
  int64_t default_window = 0;    // sliding_window (0: none), where the family has windows
  double default_dropout = 0.0;  // attention_dropout and residual_dropout when the config has none
  bool trains_dropout = false;   // attention_dropout and residual_dropout are honoured (else only 0 is accepted)
  // Mixture-of-experts layers and whose keys, routing and expert tensors they have.
  ModelConfig::Moe::Style moe = ModelConfig::Moe::Style::None;
  // Every layer's window from layer_types, sliding_window always applying (GPT-OSS).
  bool typed_windows = false;
  bool default_yarn = false;  // no RoPE keys means GPT-OSS's yarn (factor 32 over 4096 positions)
  // Keys whose null the family's config takes as None, beyond kNullableEverywhere (space-separated):
  // null pad_token_id = no padding row, head_dim = derived, num_key_value_heads = num_attention_heads,
  // sliding_window = no window, layer_types = derived, mlp_only_layers = none; keys the family has
  // no field for are ignored by transformers whatever they hold. Any other null is refused: its
  // typed field refuses None (or the model fails to build or train with it).
  const char* nullable = "";
};

// The row of model_type, or null.
const ModelFamily* find_model_family(const std::string& model_type);
// The row of model_type; an unknown one is an error naming the supported ones.
const ModelFamily& model_family(const std::string& model_type);
// "llama, qwen3, ...": the model_type of every row.
std::string supported_model_types();

}  // namespace so
