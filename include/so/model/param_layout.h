#pragma once
// Where every parameter of the model lives in the flat parameter buffer, and which part of the
// model ("unit") reads it. Units are what the engine's hooks are called with:
//   unit 0 = embedding, units 1..L = decoder layers, unit L+1 = head (final norm, lm_head).
#include <cstdint>
#include <string>
#include <vector>

#include "so/model/model_config.h"

namespace so {

struct ParamInfo {
  std::string name;  // Hugging Face name, e.g. model.layers.3.self_attn.q_proj.weight (of the
                     // unfused projection where the checkpoint fuses them, see HfTensor)
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t offset = 0;  // element offset into the flat buffer (aligned, but after a joined one)
  int first_unit = 0;  // units reading it, lowest and highest (tied embeddings: 0 and L+1)
  int last_unit = 0;
  bool is_norm = false;  // RMSNorm weight: initialised to one
  bool is_bias = false;  // projection bias: initialised to zero
  // Laid out right before the next parameter, no padding between, and never in another bucket:
  // one GEMM reads the run as one matrix (a dense MLP's [W_gate; W_up], attention's [W_q; W_k; W_v] and
  // its biases).
  bool joined_to_next = false;
};

struct LayerParamIds {
  int attn_norm, q, k, v, o, q_norm = -1, k_norm = -1, mlp_norm, gate = -1, up = -1, down = -1;
  int q_bias = -1, k_bias = -1, v_bias = -1, o_bias = -1;  // -1: the family has none
  // An MoE layer (gate, up and down are -1): the router, and each expert's projections (Qwen3-MoE)
  // or the experts' fused tensors, one parameter each (GPT-OSS: gate_up [E, H, 2I] and its bias
  // [E, 2I], down [E, I, H] and its bias [E, H]).
  int router = -1, router_bias = -1;
  std::vector<int> expert_gate, expert_up, expert_down;
  int experts_gate_up = -1, experts_gate_up_bias = -1, experts_down = -1, experts_down_bias = -1;
  int sinks = -1;  // self_attn.sinks [num_heads] (ModelConfig::attention_sinks), else -1
};

// A tensor of the Hugging Face checkpoint: one parameter, or consecutive parameters stacked along
// dim 0 (Phi-3's qkv_proj = [q; k; v] and gate_up_proj = [gate; up]), split at import, joined at export.
struct HfTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<int> parts;  // parameter ids, in row order
  // In the checkpoint as MXFP4 `<name>_blocks` / `<name>_scales` ([E, R, G, 16] / [E, R, G] U8 for
  // the [E, G*32, R] expert stack; ModelConfig::Moe::mxfp4); exports write the plain tensor.
  bool mxfp4 = false;
};

struct ParamLayout {
  std::vector<ParamInfo> params;
  std::vector<HfTensor> hf_tensors;                   // every parameter in exactly one, in layout order
  int64_t total = 0;                                  // flat buffer elements, padding included
  int embedding = -1, final_norm = -1, lm_head = -1;  // lm_head == embedding when tied
  std::vector<LayerParamIds> layers;
  int num_units = 0;

  static constexpr int64_t kAlign = 16;  // elements: 64 bytes in fp32, for vector loads
  static ParamLayout for_model(const ModelConfig& cfg);
  int find(const std::string& name) const;  // -1 when absent
};

// Exact model FLOPs per trained token (forward + backward, no recompute): every matmul counts
// 2 FLOPs per multiply-add, and causal attention counts the (S+1)/2 keys a query sees on average.
// causal = true counts attention's score and value products over the visible (query, key) pairs
// only, (S + 1) / 2 per query; false over all S, the convention most published MFU figures use.
// A projection bias counts 1 FLOP per element forward and 1 backward (its gradient's sum). An MoE
// layer counts its active parameters: the router and top_k experts per token.
// A projection bias counts 1 FLOP per element forward and 1 backward (its gradient's sum). A
// sliding window caps the keys a query sees (per layer, ModelConfig::layer_window); packed
// documents (data-dependent) are not counted.
double train_flops_per_token(const ModelConfig& cfg, int64_t seq_len, bool causal = true);

}  // namespace so
