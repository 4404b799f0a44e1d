#include "so/model/model_config.h"

#include <charconv>
#include <cstdlib>

#include "so/core/error.h"
#include "so/core/json_reader.h"

namespace so {

namespace {
// Keys an HF config carries that do not change the math so_train runs (token ids, dtype hints,
// bookkeeping). They are accepted and ignored; anything else unknown is an error.
const char* kIgnoredHfKeys[] = {"architectures", "bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype",
                                "dtype", "transformers_version", "use_cache", "pretraining_tp", "_name_or_path",
                                "attention_dropout", "output_attentions", "output_hidden_states", "return_dict",
                                "max_window_layers", "layer_types", "model_name", "is_decoder"};

// The shortest decimal that reads back as the same float, as a JSON number: 1e-05 rather than
// the float's exact double value 9.999999747378752e-06.
double shortest_decimal(float f) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof(buf) - 1, f);
  *r.ptr = '\0';
  return std::strtod(buf, nullptr);
}
}  // namespace

int64_t ModelConfig::num_parameters() const {
  const int64_t H = hidden_size;
  const int64_t per_layer = H * q_dim() + 2 * H * kv_dim() + q_dim() * H + 3 * H * intermediate_size + 2 * H +
                            (qk_norm ? 2 * head_dim : 0);
  return vocab_size * H * (tie_word_embeddings ? 1 : 2) + num_layers * per_layer + H;
}

ModelConfig ModelConfig::from_hf_json(const nlohmann::json& j, const std::string& source) {
  JsonReader r(j, source);
  ModelConfig c;
  c.model_type = r.require<std::string>("model_type");
  if (c.model_type != "llama" && c.model_type != "qwen3")
    r.fail("model_type", str_cat("is '", c.model_type, "'; supported: llama, qwen3"));
  c.vocab_size = r.require<int64_t>("vocab_size");
  c.hidden_size = r.require<int64_t>("hidden_size");
  c.intermediate_size = r.require<int64_t>("intermediate_size");
  c.num_layers = r.require<int64_t>("num_hidden_layers");
  c.num_heads = r.require<int64_t>("num_attention_heads");
  c.num_kv_heads = r.get<int64_t>("num_key_value_heads", c.num_heads);
  c.max_position_embeddings = r.get<int64_t>("max_position_embeddings", 4096);
  c.rms_norm_eps = r.get<float>("rms_norm_eps", 1e-6f);
  c.tie_word_embeddings = r.get<bool>("tie_word_embeddings", false);
  c.initializer_range = r.get<float>("initializer_range", 0.02f);
  c.qk_norm = c.model_type == "qwen3";

  for (const std::string key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                "num_attention_heads", "num_key_value_heads", "max_position_embeddings"}) {
    if (r.has(key) && r.raw().at(key).get<int64_t>() <= 0) r.fail(key, "must be positive");
  }
  if (c.num_heads % c.num_kv_heads != 0)
    r.fail("num_attention_heads", str_cat("(", c.num_heads, ") is not divisible by num_key_value_heads (",
                                          c.num_kv_heads, ")"));
  if (r.has("head_dim")) {
    c.head_dim = r.require<int64_t>("head_dim");
  } else {
    if (c.hidden_size % c.num_heads != 0)
      r.fail("hidden_size", str_cat("(", c.hidden_size, ") is not divisible by num_attention_heads (", c.num_heads,
                                    ") and no head_dim is given"));
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) r.fail("head_dim", str_cat("must be positive and even, is ", c.head_dim));

  // RoPE: transformers <= 4 writes rope_theta/rope_scaling; transformers 5 nests them in
  // rope_parameters. Only the default (unscaled) rotary embedding is implemented.
  c.rope_theta = r.get<double>("rope_theta", 10000.0);
  if (r.has("rope_scaling")) r.fail("rope_scaling", "is not supported (only default RoPE); remove it or set null");
  if (r.has("rope_parameters")) {
    JsonReader rp = r.child("rope_parameters");
    c.rope_theta = rp.get<double>("rope_theta", c.rope_theta);
    const std::string type = rp.get<std::string>("rope_type", "default");
    if (type != "default") rp.fail("rope_type", str_cat("is '", type, "'; only 'default' is supported"));
    rp.finish();
  }
  if (c.rope_theta <= 0) r.fail("rope_theta", "must be positive");
  const std::string act = r.get<std::string>("hidden_act", "silu");
  if (act != "silu") r.fail("hidden_act", str_cat("is '", act, "'; only 'silu' (SwiGLU) is supported"));
  for (const char* bias : {"attention_bias", "mlp_bias"})
    if (r.get<bool>(bias, false)) r.fail(bias, "is true; biases are not supported");
  if (r.get<bool>("use_sliding_window", false)) r.fail("use_sliding_window", "is true; sliding windows are not supported");
  r.accept("sliding_window");
  for (const char* k : kIgnoredHfKeys) r.accept(k);
  r.finish();
  return c;
}

ModelConfig ModelConfig::from_hf_file(const std::string& path) {
  return from_hf_json(read_json_file(path, "model config"), path);
}

nlohmann::json ModelConfig::to_hf_json() const {
  nlohmann::json j = {{"model_type", model_type},
                      {"architectures", {model_type == "qwen3" ? "Qwen3ForCausalLM" : "LlamaForCausalLM"}},
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
  return j;
}

}  // namespace so
