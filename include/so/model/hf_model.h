#pragma once
// A Hugging Face model directory (every family of model_config.h): config.json plus model.safetensors,
// or shards listed by model.safetensors.index.json. Import checks every tensor's name, shape and
// dtype against the layout of the config before it reads any data; export writes what
// transformers' save_pretrained writes for the same model, so from_pretrained loads it.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "so/core/dtype.h"
#include "so/model/model_config.h"
#include "so/model/param_layout.h"

namespace so {

// Reads the weights in `dir` (whose config.json gave `layout`) and hands each parameter's fp32
// values to `load`, in layout order, one at a time: the trainer passes them to
// Engine::load_weight. A tied model's lm_head.weight, when present, must equal the embedding.
// MXFP4 expert stacks (HfTensor::mxfp4) are dequantised here, into fp32.
void load_hf_weights(const std::string& dir, const ParamLayout& layout,
                     const std::function<void(int param_id, std::vector<float> values)>& load);
// What load_hf_weights checks before it reads any weight (names, shapes, dtypes, MXFP4 scales):
// the trainer calls it before it allocates the engine.
void check_hf_weights(const std::string& dir, const ParamLayout& layout);

struct HfModel {
  ModelConfig config;
  ParamLayout layout;
  std::vector<std::vector<float>> values;  // per parameter, in layout order
};
// config.json and every weight of `dir`, held in memory (tools and tests).
HfModel load_hf_model(const std::string& dir);

struct HfExportOptions {
  DType dtype = DType::BF16;    // stored dtype: BF16 (rounded to nearest even) or F32
  int64_t max_shard_bytes = 0;  // 0: one model.safetensors; else shards of at most this size
                                // (a larger tensor gets a shard of its own) and an index
};

// Writes config.json and the weights (get(param_id): fp32 values) into `dir`, creating it. A
// tied model gets no lm_head.weight, like save_pretrained. Every file is written under a
// temporary name and renamed; entry files of the other layout (single or sharded) left by an
// earlier export into `dir` are removed so transformers cannot pick them up.
void export_hf_model(const std::string& dir, const ModelConfig& cfg, const ParamLayout& layout,
                     const std::function<std::vector<float>(int param_id)>& get, const HfExportOptions& opts = {});

}  // namespace so
