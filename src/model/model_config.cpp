#include "so/model/model_config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <iterator>

#include "so/core/error.h"
#include "so/core/json_reader.h"
#include "so/model/model_family.h"

namespace so {

namespace {
// Keys an HF config carries that do not change the math so_train runs (token ids, inference and
// bookkeeping settings), whatever their value. Keys whose values can change the math are read
// and refused unless neutral; anything else unknown is an error.
const char* kIgnoredHfKeys[] = {"bos_token_id",  "eos_token_id",      "transformers_version", "use_cache",
                                "_name_or_path", "output_attentions", "output_hidden_states", "return_dict",
                                "model_name",    "is_decoder"};

using MoeStyle = ModelConfig::Moe::Style;

// Keys whose null every family takes as None: no padding row, no RoPE scaling, token ids and
// bookkeeping so_train does not read.
const char* kNullableEverywhere[] = {"pad_token_id", "rope_scaling", "rope_parameters", "dtype", "torch_dtype"};

bool listed(const char* space_separated, const std::string& key) {
  const std::string list = str_cat(" ", space_separated, " ");
  return list.find(str_cat(" ", key, " ")) != std::string::npos;
}

// A null value is refused by name unless the family (or every family) takes it as None.
void refuse_nulls(JsonReader& r, const ModelFamily& family, const char* const* ignored, size_t n_ignored) {
  for (const auto& [key, value] : r.raw().items()) {
    if (!value.is_null() || listed(family.nullable, key)) continue;
    if (std::find(std::begin(kNullableEverywhere), std::end(kNullableEverywhere), key) != std::end(kNullableEverywhere))
      continue;
    if (std::find(ignored, ignored + n_ignored, key) != ignored + n_ignored) continue;
    r.fail(key, str_cat("is null; ", family.model_type,
                        "'s configuration takes a value there (transformers refuses "
                        "None for it): give one, or leave the key out for ",
                        family.model_type, "'s default"));
  }
}
// Sizes far beyond any model so_train can hold, and small enough that no buffer size computed
// from them (tokens x intermediate x bytes, vocab x hidden x bytes) can overflow 64 bits.
struct SizeBound {
  const char* key;
  int64_t max;
};
constexpr SizeBound kSizeBounds[] = {{"vocab_size", int64_t{1} << 26},        {"hidden_size", int64_t{1} << 18},
                                     {"intermediate_size", int64_t{1} << 20}, {"num_hidden_layers", 4096},
                                     {"num_attention_heads", 4096},           {"num_key_value_heads", 4096},
                                     {"max_position_embeddings", INT32_MAX},  {"head_dim", 4096}};
int64_t size_bound(const char* key) {
  for (const SizeBound& b : kSizeBounds)
    if (std::string(key) == b.key) return b.max;
  return INT64_MAX;
}

// The shortest decimal that reads back as the same float, as a JSON number: 1e-05 rather than
// the float's exact double value 9.999999747378752e-06.
double shortest_decimal(float f) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof(buf) - 1, f);
  *r.ptr = '\0';
  return std::strtod(buf, nullptr);
}
constexpr const char* kPartialRotary =
    ", not 1; rotating only part of each head (Phi-4-mini, Phi-3.5) is not supported, nor is their longrope";

// One RoPE dict into c.rope: the keys transformers' _validate_<type>_rope_parameters knows for its
// type, each checked so that rope_frequencies computes finite, meaningful frequencies.
void read_rope_scaling(JsonReader& rp, ModelConfig& c, int64_t top_original) {
  RopeScaling& s = c.rope;
  s.type = rp.has("rope_type") ? rp.get<std::string>("rope_type", "") : rp.get<std::string>("type", "default");
  rp.accept("type");
  if (rp.get<double>("partial_rotary_factor", 1.0) != 1.0)
    rp.fail("partial_rotary_factor", str_cat("is ", rp.get<double>("partial_rotary_factor", 1.0), kPartialRotary));
  if (s.type == "default") return rp.finish();
  if (s.type != "linear" && s.type != "dynamic" && s.type != "yarn" && s.type != "llama3")
    rp.fail(rp.has("rope_type") ? "rope_type" : "type",
            str_cat("is '", s.type, "'; supported RoPE types: default, linear, dynamic, yarn, llama3",
                    s.type == "longrope" || s.type == "su" ? " (Phi-3.5's and Phi-4-mini's longrope is not)" : ""));
  auto positive = [&](const char* key) {
    if (!rp.has(key)) rp.fail(key, str_cat("is required for rope_type '", s.type, "'"));
    const double v = rp.get<double>(key, 0.0);
    if (!(v > 0.0 && std::isfinite(v))) rp.fail(key, str_cat("is ", v, "; it must be positive"));
    return v;
  };
  s.factor = positive("factor");
  if (s.type == "llama3" || s.type == "yarn") {
    s.original_max_position_embeddings =
        rp.get_in("original_max_position_embeddings", c.max_position_embeddings, 1, INT32_MAX);
    if (top_original > 0) s.original_max_position_embeddings = top_original;
  }
  if (s.type == "llama3") {
    s.low_freq_factor = positive("low_freq_factor");
    s.high_freq_factor = positive("high_freq_factor");
    if (!(s.high_freq_factor > s.low_freq_factor))
      rp.fail("high_freq_factor", str_cat("is ", s.high_freq_factor, "; it must be greater than low_freq_factor (",
                                          s.low_freq_factor, ")"));
  }
  if (s.type == "yarn") {
    // transformers reads a missing or zero beta as its default ("or 32", "or 1").
    s.beta_fast = rp.get<double>("beta_fast", 0.0);
    s.beta_slow = rp.get<double>("beta_slow", 0.0);
    if (s.beta_fast == 0.0) s.beta_fast = 32.0;
    if (s.beta_slow == 0.0) s.beta_slow = 1.0;
    if (!(s.beta_slow > 0.0 && s.beta_fast > s.beta_slow && std::isfinite(s.beta_fast)))
      rp.fail("beta_fast", str_cat("is ", s.beta_fast, " and beta_slow ", s.beta_slow,
                                   "; they must satisfy beta_fast > beta_slow > 0"));
    if (rp.has("attention_factor")) s.attention_factor = positive("attention_factor");
    s.mscale = rp.get<double>("mscale", 0.0);
    s.mscale_all_dim = rp.get<double>("mscale_all_dim", 0.0);
    for (const char* k : {"mscale", "mscale_all_dim"})
      if (!std::isfinite(rp.get<double>(k, 0.0))) rp.fail(k, "must be finite");
    s.truncate = rp.get<bool>("truncate", true);
  }
  rp.finish();
}
// The experts' keys. transformers 5 names the expert count num_local_experts (num_experts is its
// alias, the name Qwen3-MoE's published configs use). GPT-OSS: every layer is MoE, its experts'
// width is intermediate_size, their GLU is clamped (swiglu_alpha, swiglu_limit).
void read_moe(JsonReader& r, const ModelFamily& family, ModelConfig& c) {
  ModelConfig::Moe& m = c.moe;
  const bool gpt_oss = family.moe == MoeStyle::GptOss;
  if (r.has("num_experts") && r.has("num_local_experts") &&
      r.raw().at("num_experts") != r.raw().at("num_local_experts"))
    r.fail("num_experts", "and num_local_experts differ; they name the same count");
  const char* count_key = r.has("num_experts") || !r.has("num_local_experts") ? "num_experts" : "num_local_experts";
  r.accept("num_experts"), r.accept("num_local_experts");
  m.experts = r.get_in(count_key, 128, 0, 1 << 16);
  m.top_k = r.get_in("num_experts_per_tok", gpt_oss ? 4 : 8, 1, 1 << 16);
  r.accept("experts_per_token");  // GPT-OSS's published config repeats the count under this name
  if (r.has("experts_per_token") && r.get_in("experts_per_token", 0, 0, 1 << 16) != m.top_k)
    r.fail("experts_per_token", str_cat("differs from num_experts_per_tok (", m.top_k, "); they name the same count"));
  if (gpt_oss && m.experts == 0) r.fail(count_key, "is 0; gpt_oss layers are all mixtures of experts");
  if (m.experts > 0 && m.top_k > m.experts)
    r.fail("num_experts_per_tok", str_cat("(", m.top_k, ") exceeds ", count_key, " (", m.experts, ")"));
  m.aux_loss_coef = r.get<double>("router_aux_loss_coef", 0.001);
  m.aux_loss = r.get<bool>("output_router_logits", false);
  if (gpt_oss) {
    m.intermediate = c.intermediate_size;
    m.normalize = true;  // a softmax over the k chosen logits sums to 1
    m.glu_alpha = r.get<double>("swiglu_alpha", 1.702);
    m.glu_limit = r.get<double>("swiglu_limit", 7.0);
    if (!(m.glu_limit > 0.0 && std::isfinite(m.glu_limit)))
      r.fail("swiglu_limit", str_cat("is ", m.glu_limit, "; it must be positive"));
    if (!std::isfinite(m.glu_alpha)) r.fail("swiglu_alpha", "must be finite");
    r.accept("initial_context_length");  // the pre-training context; the RoPE keys carry it
    r.accept("quantization_config");
    if (r.has("quantization_config")) {
      const nlohmann::json& q = r.raw().at("quantization_config");
      if (!q.is_object() || !q.contains("quant_method") || q.at("quant_method") != "mxfp4")
        r.fail("quantization_config", str_cat("is ", brief_json(q),
                                              "; so_train reads {\"quant_method\": \"mxfp4\"} "
                                              "(GPT-OSS's published checkpoints) or unquantised weights"));
      for (const auto& [key, value] : q.items())
        if (key != "quant_method" && key != "modules_to_not_convert")
          r.fail("quantization_config", str_cat("has the unknown key '", key, "'"));
      // MXFP4 blocks hold 32 values along each expert matrix's input dimension.
      if (c.hidden_size % 32 != 0 || m.intermediate % 32 != 0)
        r.fail("quantization_config", str_cat("is mxfp4, but hidden_size (", c.hidden_size, ") and intermediate_size (",
                                              m.intermediate, ") must be multiples of the MXFP4 block of 32"));
      m.mxfp4 = true;
    }
    return;
  }
  m.intermediate = r.get_in("moe_intermediate_size", 768, 1, int64_t{1} << 20);
  m.normalize = r.get<bool>("norm_topk_prob", false);
  m.sparse_step = r.get_in("decoder_sparse_step", 1, 1, INT32_MAX);
  r.accept("mlp_only_layers");
  if (r.has("mlp_only_layers")) {
    const nlohmann::json& d = r.raw().at("mlp_only_layers");
    if (!d.is_array()) r.fail("mlp_only_layers", str_cat("is ", brief_json(d), "; it must be a list of layer indices"));
    for (const nlohmann::json& v : d) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= c.num_layers)
        r.fail("mlp_only_layers", str_cat("holds ", brief_json(v), "; layer indices are 0 to ", c.num_layers - 1));
      m.dense_layers.push_back(v.get<int64_t>());
    }
    // A set of layers, however often the list names one (transformers tests membership).
    std::sort(m.dense_layers.begin(), m.dense_layers.end());
    m.dense_layers.erase(std::unique(m.dense_layers.begin(), m.dense_layers.end()), m.dense_layers.end());
  }
}
}  // namespace

namespace {

// The tensors and parameters of a model, counted as ParamLayout::for_model lays them out, in 128
// bits: a config is bounded by them before any per-tensor table is built.
struct ModelSize {
  __int128 tensors = 0, parameters = 0;
};

ModelSize model_size(const ModelConfig& c) {
  using W = __int128;
  const W H = c.hidden_size, V = c.vocab_size, q = c.q_dim(), kv = c.kv_dim();
  ModelSize s;
  s.tensors = 2 + (c.tie_word_embeddings ? 0 : 1);  // embedding, final norm, lm_head
  s.parameters = V * H * (c.tie_word_embeddings ? 1 : 2) + H;
  const W attention_tensors = 6 + (c.qkv_bias ? 3 : 0) + (c.o_bias ? 1 : 0) + (c.attention_sinks ? 1 : 0) +
                              (c.qk_norm ? 2 : 0);  // with the two norms
  const W attention = 2 * H * q + 2 * H * kv + 2 * H + (c.qk_norm ? 2 * W(c.head_dim) : 0) +
                      (c.qkv_bias ? q + 2 * kv : 0) + (c.o_bias ? H : 0) + (c.attention_sinks ? W(c.num_heads) : 0);
  const W E = c.moe.experts, Ie = c.moe.intermediate;
  const bool gpt_oss = c.moe.style == MoeStyle::GptOss;  // fused experts, router and experts with biases
  for (int64_t l = 0; l < c.num_layers; ++l) {
    s.tensors += attention_tensors;
    s.parameters += attention;
    if (!c.is_moe_layer(l)) {
      s.tensors += 3, s.parameters += 3 * H * W(c.intermediate_size);
    } else if (gpt_oss) {
      s.tensors += 6, s.parameters += E * (H + 3 * H * Ie) + E * (1 + 2 * Ie + H);
    } else {
      s.tensors += 1 + 3 * E, s.parameters += E * (H + 3 * H * Ie);
    }
  }
  return s;
}

// Far beyond any model so_train can hold: every size computed from the count (bytes of weights,
// gradients and optimizer state, per rank) stays exact in 64 bits.
constexpr int64_t kMaxParameters = int64_t{1} << 50;
// Per-tensor tables (names, shapes, offsets, buckets) grow with this: Qwen3-MoE-235B has 36k.
constexpr int64_t kMaxTensors = int64_t{1} << 18;

std::string wide_text(__int128 v) {
  std::string digits;
  do digits.insert(digits.begin(), static_cast<char>('0' + static_cast<int>(v % 10))), v /= 10;
  while (v > 0);
  return digits;
}

// Refuses, naming the keys, a model whose tensor or parameter count is past the bounds above.
void check_model_size(JsonReader& r, const ModelConfig& c) {
  const ModelSize s = model_size(c);
  const char* experts_key = c.moe.style == MoeStyle::GptOss ? "num_local_experts" : "num_experts";
  if (s.tensors > kMaxTensors)
    r.fail("num_hidden_layers",
           str_cat("(", c.num_layers, ") with ", experts_key, " (", c.moe.experts, ") makes ", wide_text(s.tensors),
                   " tensors (each expert of each MoE layer has its own), more "
                   "than the ",
                   kMaxTensors, " so_train lays out"));
  if (s.parameters > kMaxParameters)
    r.fail("num_hidden_layers",
           str_cat("(", c.num_layers, ") with vocab_size ", c.vocab_size, ", hidden_size ", c.hidden_size,
                   ", intermediate_size ", c.intermediate_size,
                   c.moe.experts > 0
                       ? str_cat(", ", experts_key, " ", c.moe.experts, ", moe_intermediate_size ", c.moe.intermediate)
                       : "",
                   " makes ", wide_text(s.parameters), " parameters, more than 2^50 (",
                   static_cast<double>(kMaxParameters), "), far past any model that can be trained"));
}

}  // namespace

int64_t ModelConfig::num_parameters() const { return static_cast<int64_t>(model_size(*this).parameters); }

bool ModelConfig::is_moe_layer(int64_t l) const {
  if (moe.experts == 0) return false;
  if (std::binary_search(moe.dense_layers.begin(), moe.dense_layers.end(), l)) return false;
  return (l + 1) % moe.sparse_step == 0;
}

std::string ModelConfig::architecture() const { return model_family(model_type).architecture; }

namespace {

// sliding_window, use_sliding_window, max_window_layers and layer_types as the family's
// transformers class applies them (configuration_qwen2.py / modeling_mistral.py): the window
// (transformers' "kv_idx > q_idx - sliding_window") and which layers it masks.
void read_sliding_window(JsonReader& r, const ModelFamily& family, ModelConfig& c) {
  r.accept("sliding_window");  // null, or ignored by families without windows (as transformers does)
  r.accept("max_window_layers");
  r.accept("layer_types");
  const nlohmann::json* types = r.has("layer_types") ? &r.raw().at("layer_types") : nullptr;
  if (types != nullptr) {
    bool ok = types->is_array() && static_cast<int64_t>(types->size()) == c.num_layers;
    for (size_t i = 0; ok && i < types->size(); ++i)
      ok = (*types)[i] == "full_attention" || (*types)[i] == "sliding_attention";
    if (!ok)
      r.fail("layer_types", str_cat("is ", brief_json(*types),
                                    "; it must list \"full_attention\" or "
                                    "\"sliding_attention\" for each of the ",
                                    c.num_layers, " layers"));
  }
  // The window: as given, the family's default when the key is absent, none when it is null.
  const auto window = [&]() -> int64_t {
    if (r.raw().contains("sliding_window") && r.raw().at("sliding_window").is_null()) return 0;
    return r.get_in("sliding_window", family.default_window, 1, INT32_MAX);
  };
  if (family.typed_windows) {  // GPT-OSS: layer_types decides, by default every other layer from 0
    c.sliding_window = window();
    c.sliding_layers.resize(static_cast<size_t>(c.num_layers));
    for (int64_t l = 0; l < c.num_layers; ++l)
      c.sliding_layers[l] = types != nullptr ? (*types)[l] == "sliding_attention" : l % 2 == 0;
    return;
  }
  // Mistral and Phi-3 window every layer whatever use_sliding_window says (transformers reads it not).
  const bool flag = r.get<bool>("use_sliding_window", false);
  if (flag && !family.window_layers && !family.window && !family.window_flagged)
    r.fail("use_sliding_window", str_cat("is true; ", c.model_type, " models have no sliding-window attention"));
  const bool use = (family.window_layers || family.window_flagged) && flag;
  if (family.window || use) c.sliding_window = window();
  if (family.window || family.window_flagged) {  // every layer (Qwen3-MoE: when use_sliding_window)
    c.sliding_layers.assign(static_cast<size_t>(c.num_layers), c.sliding_window > 0);
    return;
  }
  if (family.window_layers) {
    const int64_t first = r.get_in("max_window_layers", 28, 0, INT32_MAX);  // Qwen2Config's default
    c.sliding_layers.resize(static_cast<size_t>(c.num_layers));
    for (int64_t l = 0; l < c.num_layers; ++l)
      c.sliding_layers[l] =
          c.sliding_window > 0 && (types != nullptr ? (*types)[l] == "sliding_attention" : l >= first);
    return;
  }
  if (types != nullptr)
    for (const auto& t : *types)
      if (t != "full_attention")
        r.fail("layer_types", str_cat("is ", brief_json(*types), "; ", c.model_type,
                                      " models have no sliding-window attention (every layer is \"full_attention\")"));
}

}  // namespace

ModelConfig ModelConfig::from_hf_json(const nlohmann::json& j, const std::string& source) {
  JsonReader r(j, source);
  ModelConfig c;
  c.model_type = r.require<std::string>("model_type");
  const ModelFamily* family = find_model_family(c.model_type);
  if (!family) r.fail("model_type", str_cat("is '", c.model_type, "'; supported: ", supported_model_types()));
  refuse_nulls(r, *family, kIgnoredHfKeys, std::size(kIgnoredHfKeys));
  // Absent: the family's default; null (where the family takes it): None.
  const auto is_null = [&](const char* key) { return j.contains(key) && j.at(key).is_null(); };
  c.moe.style = family->moe;
  auto size = [&](const char* key, int64_t fallback) {
    if (fallback < 0 && !r.has(key)) r.fail(key, "is required");
    return r.get_in(key, fallback, 1, size_bound(key));
  };
  c.vocab_size = size("vocab_size", -1);
  c.hidden_size = size("hidden_size", -1);
  c.intermediate_size = size("intermediate_size", -1);
  c.num_layers = size("num_hidden_layers", -1);
  c.num_heads = size("num_attention_heads", -1);
  c.num_kv_heads =
      size("num_key_value_heads",
           is_null("num_key_value_heads") || family->default_kv_heads == 0 ? c.num_heads : family->default_kv_heads);
  c.max_position_embeddings = size("max_position_embeddings", family->default_max_positions);
  // nn.Embedding takes a padding_idx in [-vocab, vocab), a negative one counted from the end; null
  // is no padding row (what transformers 5 writes when there is none).
  r.accept("pad_token_id");
  if (r.has("pad_token_id")) {
    c.pad_token_id = r.get_in("pad_token_id", -1, -c.vocab_size, c.vocab_size - 1);
    if (c.pad_token_id < 0) c.pad_token_id += c.vocab_size;
  } else if (family->default_pad >= 0 && !is_null("pad_token_id")) {
    if (family->default_pad >= c.vocab_size)
      r.fail("pad_token_id", str_cat("is absent and ", c.model_type, "'s default (", family->default_pad,
                                     ") is outside the vocabulary (", c.vocab_size, "); give pad_token_id"));
    c.pad_token_id = family->default_pad;
  }
  c.rms_norm_eps = r.get<float>("rms_norm_eps", family->default_rms_norm_eps);
  if (!(c.rms_norm_eps > 0.0f)) r.fail("rms_norm_eps", str_cat("is ", c.rms_norm_eps, "; it must be positive"));
  c.tie_word_embeddings = r.get<bool>("tie_word_embeddings", false);
  c.initializer_range = r.get<float>("initializer_range", 0.02f);
  if (!(c.initializer_range >= 0.0f)) r.fail("initializer_range", "must not be negative");
  c.qk_norm = family->qk_norm;
  c.qkv_bias = family->qkv_bias_key ? r.get<bool>(family->qkv_bias_key, family->qkv_bias) : family->qkv_bias;
  c.o_bias = family->o_bias_key ? r.get<bool>(family->o_bias_key, family->o_bias) : family->o_bias;
  r.accept("attention_bias");  // families without the key ignore it, as transformers does

  if (c.num_kv_heads > c.num_heads || c.num_heads % c.num_kv_heads != 0)
    r.fail("num_attention_heads",
           str_cat("(", c.num_heads, ") is not divisible by num_key_value_heads (", c.num_kv_heads, ")"));
  r.accept("head_dim");  // null (where the family takes it): derived, as transformers derives it
  if (r.has("head_dim")) {
    c.head_dim = size("head_dim", -1);
  } else if (family->default_head_dim > 0 && !is_null("head_dim")) {
    c.head_dim = family->default_head_dim;
  } else {
    if (c.hidden_size % c.num_heads != 0)
      r.fail("hidden_size", str_cat("(", c.hidden_size, ") is not divisible by num_attention_heads (", c.num_heads,
                                    ") and no head_dim is given"));
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (c.head_dim % 2 != 0) r.fail("head_dim", str_cat("must be even (rotary pairs), is ", c.head_dim));

  // RoPE: transformers 4 writes rope_theta and rope_scaling (null unless scaled); transformers 5
  // nests both in rope_parameters. Phi-3 keeps the pre-training context at the top level, where
  // transformers looks first.
  c.rope_theta = r.get<double>("rope_theta", 10000.0);
  const int64_t top_original = r.get_in("original_max_position_embeddings", 0, 1, INT32_MAX);
  // Phi-4-mini's shape (transformers 4 writes it here, 5 inside rope_parameters): before its
  // longrope, which a partial rotary always comes with there.
  if (r.get<double>("partial_rotary_factor", 1.0) != 1.0)
    r.fail("partial_rotary_factor", str_cat("is ", r.get<double>("partial_rotary_factor", 1.0), kPartialRotary));
  if (r.has("rope_scaling") && r.has("rope_parameters"))
    r.fail("rope_scaling", "and rope_parameters are both given; a config has one of them");
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    r.accept(key);
    if (!r.has(key)) continue;
    JsonReader rp = r.child(key);
    if (std::string(key) == "rope_parameters") c.rope_theta = rp.get<double>("rope_theta", c.rope_theta);
    read_rope_scaling(rp, c, top_original);
  }
  if (family->default_yarn && !r.has("rope_scaling") && !r.has("rope_parameters")) {
    c.rope.type = "yarn";  // GptOssConfig's default rope_parameters
    c.rope.factor = 32.0, c.rope.beta_fast = 32.0, c.rope.beta_slow = 1.0, c.rope.truncate = false;
    c.rope.original_max_position_embeddings = 4096;
    if (!r.has("rope_theta")) c.rope_theta = 150000.0;
  }
  // Phi-3's class renames yarn/su to longrope and takes nothing else but the default.
  if (!family->scaled_rope && c.rope.type != "default")
    r.fail(r.has("rope_scaling") ? "rope_scaling" : "rope_parameters",
           str_cat("has rope_type '", c.rope.type, "'; ", c.model_type,
                   " models take only the default rotary embedding here (transformers reads yarn as longrope)"));
  if (!(c.rope_theta > 0)) r.fail("rope_theta", "must be positive");
  const std::string act = r.get<std::string>("hidden_act", "silu");
  if (act != "silu") r.fail("hidden_act", str_cat("is '", act, "'; only 'silu' (SwiGLU) is supported"));
  if (r.get<bool>("mlp_bias", false)) r.fail("mlp_bias", "is true; MLP biases are not supported");
  read_sliding_window(r, *family, c);
  c.attention_sinks = family->attention_sinks;
  // Seed-OSS's attention-probability and residual dropout are trained as configured. Other
  // dropout (Phi-3's residual and embedding dropout, attention_dropout of families without it in
  // so_train) is not implemented: a value other than 0 is refused; model.override sets it to 0
  // where training without it is meant.
  for (const char* key : {"attention_dropout", "residual_dropout", "resid_pdrop", "embd_pdrop"}) {
    const std::string name = key;
    const bool family_default = name == "attention_dropout" || name == "residual_dropout";
    const double p = r.get<double>(key, family_default ? family->default_dropout : 0.0);
    if (family_default && family->trains_dropout) {
      if (!(p >= 0.0 && p < 1.0)) r.fail(key, str_cat("is ", p, "; a drop probability is in [0, 1)"));
      (name == "attention_dropout" ? c.attention_dropout : c.residual_dropout) = static_cast<float>(p);
      continue;
    }
    if (p != 0.0)
      r.fail(key, str_cat("is ", p, r.has(key) ? "" : str_cat(" (", c.model_type, "'s default)"),
                          ", not 0; so_train trains without dropout: set it to 0 with model.override to train so"));
  }
  if (r.get_in("pretraining_tp", 1, INT64_MIN, INT64_MAX) != 1)
    r.fail("pretraining_tp", "is not 1; only unsplit projections are supported");
  if (family->moe != MoeStyle::None) read_moe(r, *family, c);
  check_model_size(r, c);
  const std::string arch = family->architecture;
  r.accept("architectures");
  if (r.has("architectures")) {
    const nlohmann::json& a = r.raw().at("architectures");
    if (!a.is_array() || a.size() != 1 || a[0] != arch)
      r.fail("architectures",
             str_cat("is ", brief_json(a), "; a ", c.model_type, " model trained here is [\"", arch, "\"]"));
  }
  for (const char* key : {"dtype", "torch_dtype"}) {  // where the weights were saved from: a hint only
    r.accept(key);
    if (r.has(key) && !r.raw().at(key).is_string())
      r.fail(key, str_cat("must be a string such as \"bfloat16\", got ", brief_json(r.raw().at(key))));
  }
  for (const char* k : kIgnoredHfKeys) r.accept(k);
  r.finish();
  return c;
}

ModelConfig ModelConfig::from_hf_file(const std::string& path) {
  return from_hf_json(read_json_file(path, "model config"), path);
}

nlohmann::json ModelConfig::to_hf_json() const {
  nlohmann::json j = {{"model_type", model_type},
                      {"architectures", {architecture()}},
                      {"vocab_size", vocab_size},
                      {"hidden_size", hidden_size},
                      {"intermediate_size", intermediate_size},
                      {"num_hidden_layers", num_layers},
                      {"num_attention_heads", num_heads},
                      {"num_key_value_heads", num_kv_heads},
                      {"head_dim", head_dim},
                      {"max_position_embeddings", max_position_embeddings},
                      {"rope_theta", rope_theta},
                      {"rms_norm_eps", shortest_decimal(rms_norm_eps)},
                      {"tie_word_embeddings", tie_word_embeddings},
                      {"initializer_range", shortest_decimal(initializer_range)},
                      {"hidden_act", "silu"}};
  j["pad_token_id"] = pad_token_id >= 0 ? nlohmann::json(pad_token_id) : nlohmann::json(nullptr);
  const ModelFamily& family = model_family(model_type);
  if (family.qkv_bias_key) j[family.qkv_bias_key] = qkv_bias;
  if (family.o_bias_key) j[family.o_bias_key] = o_bias;
  // What so_train trained with, where the family's default differs.
  if (family.trains_dropout) {
    j["attention_dropout"] = shortest_decimal(attention_dropout);
    j["residual_dropout"] = shortest_decimal(residual_dropout);
  }
  if (family.moe != MoeStyle::None) {
    j["num_experts_per_tok"] = moe.top_k;
    j["router_aux_loss_coef"] = moe.aux_loss_coef;
    j["output_router_logits"] = moe.aux_loss;
  }
  if (family.moe == MoeStyle::GptOss) {
    j["num_local_experts"] = moe.experts;
    j["swiglu_alpha"] = moe.glu_alpha;
    j["swiglu_limit"] = moe.glu_limit;
  } else if (family.moe == MoeStyle::Qwen3) {
    j["num_experts"] = moe.experts;
    j["moe_intermediate_size"] = moe.intermediate;
    j["norm_topk_prob"] = moe.normalize;
    j["decoder_sparse_step"] = moe.sparse_step;
    j["mlp_only_layers"] = moe.dense_layers;
  }
  if (family.window)
    j["sliding_window"] = sliding_window > 0 ? nlohmann::json(sliding_window) : nlohmann::json(nullptr);
  if (family.window_flagged) {
    j["use_sliding_window"] = sliding_window > 0;
    j["sliding_window"] = sliding_window > 0 ? nlohmann::json(sliding_window) : nlohmann::json(nullptr);
  }
  if (family.window_layers) {
    j["use_sliding_window"] = sliding_window > 0;
    j["sliding_window"] = sliding_window > 0 ? nlohmann::json(sliding_window) : nlohmann::json(nullptr);
    nlohmann::json& types = j["layer_types"] = nlohmann::json::array();
    for (int64_t l = 0; l < num_layers; ++l)
      types.push_back(layer_window(l) > 0 ? "sliding_attention" : "full_attention");
  }
  if (rope.type != "default") {
    nlohmann::json& s = j["rope_scaling"] = {{"rope_type", rope.type}, {"factor", rope.factor}};
    if (rope.type == "llama3" || rope.type == "yarn")
      s["original_max_position_embeddings"] = rope.original_max_position_embeddings;
    if (rope.type == "llama3") {
      s["low_freq_factor"] = rope.low_freq_factor;
      s["high_freq_factor"] = rope.high_freq_factor;
    }
    if (rope.type == "yarn") {
      s["beta_fast"] = rope.beta_fast;
      s["beta_slow"] = rope.beta_slow;
      s["truncate"] = rope.truncate;
      if (rope.attention_factor >= 0.0) s["attention_factor"] = rope.attention_factor;
      if (rope.mscale != 0.0) s["mscale"] = rope.mscale;
      if (rope.mscale_all_dim != 0.0) s["mscale_all_dim"] = rope.mscale_all_dim;
    }
  }
  return j;
}

}  // namespace so
