#pragma once
// Reading the model fixtures make_fixtures.py writes (fixtures/*.h5): the config, the batch
// shape and the single forward/backward's batch. Shared by test_reference (one rank) and
// test_reference_sp (Ulysses over two ranks); the AdamW hyper-parameters also by
// test_decay_groups_torch.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "so/io/hdf5_file.h"
#include "so/model/decoder_model.h"
#include "so/optim/adamw.h"

namespace so {

struct Fixture {
  H5File file;
  ModelConfig cfg;
  int64_t B = 0, S = 0;
};

inline Fixture open_fixture(const std::string& name) {
  Fixture f{H5File::open_read(std::string(SO_FIXTURE_DIR) + "/" + name + ".h5"), {}, 0, 0};
  f.cfg = ModelConfig::from_hf_json(nlohmann::json::parse(f.file.read_string_attr("/", "config_json")), name);
  // GPT-OSS's sinks on a Llama (llama_sinks): the fixture says so; gpt_oss has them as a family.
  if (f.file.has_attr("/", "attention_sinks")) f.cfg.attention_sinks = true;
  const auto shape = f.file.shape("/input_ids");
  f.B = shape[0];
  f.S = shape[1] - 1;
  return f;
}

// The AdamW hyper-parameters a fixture keeps as attrs of `group`: beta1, beta2, eps, weight_decay
// (the lr is given per step).
inline AdamWParams read_adamw_params(const H5File& f, const std::string& group) {
  AdamWParams adam;
  adam.beta1 = f.read_double_attr(group, "beta1");
  adam.beta2 = f.read_double_attr(group, "beta2");
  adam.eps = f.read_double_attr(group, "eps");
  adam.weight_decay = f.read_double_attr(group, "weight_decay");
  return adam;
}

inline TokenBatch to_batch(const std::vector<int32_t>& ids, int64_t B, int64_t S) {
  TokenBatch b;
  for (int64_t i = 0; i < B; ++i)
    for (int64_t t = 0; t < S; ++t) {
      b.inputs.push_back(ids[i * (S + 1) + t]);
      b.targets.push_back(ids[i * (S + 1) + t + 1]);
      b.positions.push_back(static_cast<int32_t>(t));
    }
  return b;
}

// The single forward/backward's batch: the packed rows (documents with restarting positions and
// doc_start) where the fixture has them, else input_ids.
inline TokenBatch fixture_batch(const Fixture& fx) {
  if (!fx.file.exists("/packed")) return to_batch(fx.file.read_i32("/input_ids", {fx.B, fx.S + 1}), fx.B, fx.S);
  TokenBatch b;
  b.inputs = fx.file.read_i32("/packed/inputs", {fx.B, fx.S});
  b.targets = fx.file.read_i32("/packed/targets", {fx.B, fx.S});
  b.positions = fx.file.read_i32("/packed/positions", {fx.B, fx.S});
  b.doc_start = fx.file.read_i32("/packed/doc_start", {fx.B, fx.S});
  return b;
}

}  // namespace so
