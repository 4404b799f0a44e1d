#pragma once
// The decoder's shape, read from a Hugging Face config.json. One decoder serves every family
// (so/model/model_family.h); a family only switches its optional pieces on.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "so/model/rope.h"

namespace so {

struct ModelConfig {
  std::string model_type = "llama";  // llama | qwen3 | qwen2 | mistral | phi3 | seed_oss | qwen3_moe | gpt_oss
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;
  double rope_theta = 10000.0;
  RopeScaling rope;  // rope_scaling / rope_parameters beyond rope_theta
  float rms_norm_eps = 1e-6f;
  // Seed-OSS's residual_dropout: each layer's attention and MLP outputs dropped with this
  // probability before they join the residual stream (training only; counter-based masks).
  float residual_dropout = 0.0f;
  // Seed-OSS's attention_dropout: attention probabilities dropped with this probability (training
  // only; AttentionMask::dropout, counter-based masks).
  float attention_dropout = 0.0f;
  bool tie_word_embeddings = false;
  bool qk_norm = false;   // Qwen3: RMSNorm over head_dim on q and k, before RoPE
  bool qkv_bias = false;  // q, k and v projections add a bias (Qwen2; attention_bias of Llama/Qwen3/Seed-OSS)
  bool o_bias = false;    // o_proj adds a bias (attention_bias of Llama/Qwen3, attention_out_bias of Seed-OSS)
  // GPT-OSS: a learned logit per head (self_attn.sinks, [num_heads]) in every attention row's
  // softmax (AttentionMask::sinks). Set by the family (no config key), for the MoE work's gpt_oss.
  bool attention_sinks = false;
  // A query sees keys fewer than this many positions back (transformers' sliding_window) on the
  // layers sliding_layers marks; 0 = no window. Mistral and Phi-3: every layer; Qwen2/Qwen3: with
  // use_sliding_window, the layers layer_types (or max_window_layers) marks.
  int64_t sliding_window = 0;
  std::vector<bool> sliding_layers;  // [num_layers], or empty: no window anywhere
  // The embedding's padding_idx (transformers builds nn.Embedding(vocab, hidden, pad_token_id)):
  // that row gets no gradient from the lookup (a tied lm_head's still reaches it); -1 = none.
  int64_t pad_token_id = -1;
  float initializer_range = 0.02f;
  // Mixture of experts (Qwen3-MoE, GPT-OSS): the layers it names run the MoE block (so/model/moe_block.h)
  // in place of the dense MLP. experts = 0: a dense model.
  struct Moe {
    // The family's kind of MoE layer, its config keys and expert tensors (None: a dense family).
    // Qwen3: softmax, top-k, SwiGLU experts (per-expert nn.Linear weights). GptOss: top-k of the
    // biased router's logits, softmax over them, clamped-GLU experts in fused interleaved tensors.
    enum class Style { None, Qwen3, GptOss } style = Style::None;
    int64_t experts = 0, top_k = 0, intermediate = 0;  // num_experts, num_experts_per_tok, moe_intermediate_size
    bool normalize = false;                            // norm_topk_prob
    int64_t sparse_step = 1;                           // decoder_sparse_step
    std::vector<int64_t> dense_layers;                 // mlp_only_layers, ascending, each once
    double aux_loss_coef = 0.001;                      // router_aux_loss_coef (used when output_router_logits)
    bool aux_loss = false;                             // output_router_logits: the load-balancing loss is added
    double glu_alpha = 1.702, glu_limit = 7.0;         // GptOss: swiglu_alpha, swiglu_limit
    // GptOss: quantization_config {"quant_method": "mxfp4"}: the checkpoint stores the expert
    // matrices as *_blocks / *_scales, dequantised at load; so_train trains and exports them in bf16/fp32.
    bool mxfp4 = false;
  } moe;
  // Layer l runs the MoE block, as transformers' Qwen3MoeDecoderLayer decides.
  bool is_moe_layer(int64_t l) const;

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  // Layer l's attention window (AttentionMask::window): 0 = causal over the whole sequence.
  int64_t layer_window(int64_t l) const {
    return l < static_cast<int64_t>(sliding_layers.size()) && sliding_layers[static_cast<size_t>(l)] ? sliding_window
                                                                                                     : 0;
  }
  // Exact: a config is refused at reading when its count (or its tensor count) is past the bounds
  // every size computed from it relies on (2^50 parameters, 2^18 tensors).
  int64_t num_parameters() const;
  std::string architecture() const;  // the transformers class, e.g. LlamaForCausalLM

  // Parses an HF config.json object; `source` names it in errors. Unsupported features
  // (other RoPE types, other activations, ...) are refused by name.
  static ModelConfig from_hf_json(const nlohmann::json& j, const std::string& source);
  static ModelConfig from_hf_file(const std::string& path);
  nlohmann::json to_hf_json() const;
};

}  // namespace so
