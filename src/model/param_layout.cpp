#include "so/model/param_layout.h"

#include <map>
#include <set>

#include "so/core/error.h"
#include "so/model/model_family.h"

namespace so {

ParamLayout ParamLayout::for_model(const ModelConfig& c) {
  ParamLayout L;
  const ModelFamily& family = model_family(c.model_type);
  const int head_unit = static_cast<int>(c.num_layers) + 1;
  enum Init { Random, One, Zero };
  // joined: the next parameter follows with no padding (ParamInfo::joined_to_next).
  auto add = [&](std::string name, std::vector<int64_t> shape, int unit, Init init = Random, bool joined = false) {
    ParamInfo p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.numel = 1;
    for (int64_t d : p.shape) p.numel *= d;
    p.offset = L.total;
    p.first_unit = p.last_unit = unit;
    p.is_norm = init == One;
    p.is_bias = init == Zero;
    p.joined_to_next = joined;
    // The end of a run of joined parameters is aligned again (its last one's offset may not be).
    L.total = joined ? L.total + p.numel : (L.total + p.numel + kAlign - 1) / kAlign * kAlign;
    L.params.push_back(std::move(p));
    return static_cast<int>(L.params.size()) - 1;
  };
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  std::map<int, std::pair<std::string, int>> fused;  // first part -> the checkpoint's stacked tensor, parts
  std::set<int> mxfp4;                               // stored as MXFP4 blocks and scales
  L.embedding = add("model.embed_tokens.weight", {c.vocab_size, H}, 0);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const int u = static_cast<int>(l) + 1;
    LayerParamIds ids{};
    ids.attn_norm = add(p + "input_layernorm.weight", {H}, u, One);
    ids.q = add(p + "self_attn.q_proj.weight", {c.q_dim(), H}, u, Random, true);  // [W_q; W_k; W_v]: one GEMM
    ids.k = add(p + "self_attn.k_proj.weight", {c.kv_dim(), H}, u, Random, true);
    ids.v = add(p + "self_attn.v_proj.weight", {c.kv_dim(), H}, u);
    ids.o = add(p + "self_attn.o_proj.weight", {H, c.q_dim()}, u);
    if (c.qkv_bias) {
      ids.q_bias = add(p + "self_attn.q_proj.bias", {c.q_dim()}, u, Zero, true);
      ids.k_bias = add(p + "self_attn.k_proj.bias", {c.kv_dim()}, u, Zero, true);
      ids.v_bias = add(p + "self_attn.v_proj.bias", {c.kv_dim()}, u, Zero);
    }
    if (c.o_bias) ids.o_bias = add(p + "self_attn.o_proj.bias", {H}, u, Zero);
    if (c.attention_sinks) ids.sinks = add(p + "self_attn.sinks", {c.num_heads}, u);  // GPT-OSS: normal(0, std)
    if (c.qk_norm) {
      ids.q_norm = add(p + "self_attn.q_norm.weight", {c.head_dim}, u, One);
      ids.k_norm = add(p + "self_attn.k_norm.weight", {c.head_dim}, u, One);
    }
    ids.mlp_norm = add(p + "post_attention_layernorm.weight", {H}, u, One);
    if (c.is_moe_layer(l) && c.moe.style == ModelConfig::Moe::Style::GptOss) {  // GPT-OSS's own tensors
      const int64_t E = c.moe.experts, Ie = c.moe.intermediate;
      ids.router = add(p + "mlp.router.weight", {E, H}, u);
      ids.router_bias = add(p + "mlp.router.bias", {E}, u, Zero);
      ids.experts_gate_up = add(p + "mlp.experts.gate_up_proj", {E, H, 2 * Ie}, u);
      ids.experts_gate_up_bias = add(p + "mlp.experts.gate_up_proj_bias", {E, 2 * Ie}, u, Zero);
      ids.experts_down = add(p + "mlp.experts.down_proj", {E, Ie, H}, u);
      ids.experts_down_bias = add(p + "mlp.experts.down_proj_bias", {E, H}, u, Zero);
      if (c.moe.mxfp4) mxfp4.insert({ids.experts_gate_up, ids.experts_down});
    } else if (c.is_moe_layer(l)) {  // transformers' per-expert checkpoint names
      const int64_t Ie = c.moe.intermediate;
      ids.router = add(p + "mlp.gate.weight", {c.moe.experts, H}, u);
      for (int64_t e = 0; e < c.moe.experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        ids.expert_gate.push_back(add(x + "gate_proj.weight", {Ie, H}, u));
        ids.expert_up.push_back(add(x + "up_proj.weight", {Ie, H}, u));
        ids.expert_down.push_back(add(x + "down_proj.weight", {H, Ie}, u));
      }
    } else {
      ids.gate = add(p + "mlp.gate_proj.weight", {I, H}, u, Random, true);
      ids.up = add(p + "mlp.up_proj.weight", {I, H}, u);
      ids.down = add(p + "mlp.down_proj.weight", {H, I}, u);
    }
    if (family.fused_qkv) {
      SO_CHECK(!c.qkv_bias && !c.qk_norm, "model: fused projections with biases or q/k norm are not laid out");
      fused[ids.q] = {p + family.fused_qkv, 3};  // q, k, v: consecutive ids
    }
    if (family.fused_gate_up && ids.gate >= 0) fused[ids.gate] = {p + family.fused_gate_up, 2};  // gate, up
    L.layers.push_back(ids);
  }
  L.final_norm = add("model.norm.weight", {H}, head_unit, One);
  if (c.tie_word_embeddings) {
    L.lm_head = L.embedding;
    L.params[L.embedding].last_unit = head_unit;
  } else {
    L.lm_head = add("lm_head.weight", {c.vocab_size, H}, head_unit);
  }
  L.num_units = head_unit + 1;
  for (int id = 0; id < static_cast<int>(L.params.size());) {
    HfTensor t{L.params[id].name, L.params[id].shape, {id}};
    if (const auto f = fused.find(id); f != fused.end()) {
      t.name = f->second.first;
      for (int j = 1; j < f->second.second; ++j) {
        t.parts.push_back(id + j);
        t.shape[0] += L.params[id + j].shape[0];
      }
    }
    t.mxfp4 = mxfp4.count(id) > 0;
    id += static_cast<int>(t.parts.size());
    L.hf_tensors.push_back(std::move(t));
  }
  return L;
}

int ParamLayout::find(const std::string& name) const {
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].name == name) return static_cast<int>(i);
  return -1;
}

double train_flops_per_token(const ModelConfig& c, int64_t seq_len, bool causal) {
  const double H = static_cast<double>(c.hidden_size);
  const double attn_params = H * c.q_dim() + 2.0 * H * c.kv_dim() + static_cast<double>(c.q_dim()) * H;
  double matmul_params = static_cast<double>(c.vocab_size) * H;
  for (int64_t l = 0; l < c.num_layers; ++l)
    matmul_params += attn_params + (c.is_moe_layer(l) ? H * c.moe.experts + 3.0 * H * c.moe.intermediate * c.moe.top_k
                                                      : 3.0 * H * c.intermediate_size);
  // QK^T and PV: 2 matmuls x 2 FLOPs x head_dim x heads per (query, visible key) pair; under a
  // window W query i sees min(i + 1, W) keys (the mean over the S queries).
  double keys_all_layers = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const int64_t W = c.layer_window(l);
    double keys = causal ? (seq_len + 1) / 2.0 : static_cast<double>(seq_len);
    if (causal && W > 0 && W < seq_len)  // sum_i min(i + 1, W) = W(W+1)/2 + (S - W) W
      keys = (W * (W + 1) / 2.0 + static_cast<double>(seq_len - W) * W) / static_cast<double>(seq_len);
    keys_all_layers += keys;
  }
  const double attn_fwd = 4.0 * c.head_dim * c.num_heads * keys_all_layers;
  // A bias costs one add per element forward and one (its gradient's sum) backward: no input gradient.
  const double biases = c.num_layers * ((c.qkv_bias ? c.q_dim() + 2.0 * c.kv_dim() : 0.0) + (c.o_bias ? H : 0.0));
  return 3.0 * (2.0 * matmul_params + attn_fwd) + 2.0 * biases;
}

}  // namespace so
