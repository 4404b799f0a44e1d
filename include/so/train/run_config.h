#pragma once
// A training run's configuration: DeepSpeed's vocabulary where it has a word for the thing,
// plus so_train's own "model", "data", "train" and "backend" sections. Everything is validated
// before any work starts; errors name the key path.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "so/backend/backend.h"
#include "so/engine/offload_config.h"
#include "so/model/model_config.h"
#include "so/optim/adamw.h"
#include "so/train/lr_schedule.h"

namespace so {

struct DataConfig {
  std::string type = "text";  // text | tokens | hdf5 | synthetic
  std::string path;
  std::string dataset = "tokens";  // hdf5 only
  int64_t seq_len = 0;
  uint64_t seed = 0;
  int64_t synthetic_tokens = 1 << 20;
};

struct RunConfig {
  std::string source;        // the config file
  nlohmann::json resolved;   // the document after --set overrides
  ModelConfig model;
  std::string model_source;  // where the model config came from
  std::string init_hf_dir;   // model.hf_dir: start from these Hugging Face weights; empty = random init
  DType dtype = DType::F32;
  int64_t micro_batch = 1;
  int64_t grad_accum = 1;
  int64_t train_batch_size = 0;  // 0 = not given; else micro x accumulation x data-parallel size
  int sequence_parallel_size = 1;
  float grad_clip = 0.0f;
  AdamWParams adam;
  LrSchedule schedule;
  int zero_stage = 0;
  int64_t bucket_size = int64_t{1} << 22;
  OffloadConfig offload;
  DataConfig data;
  int64_t steps = 0;
  uint64_t seed = 1234;
  int64_t log_every = 1;
  double peak_tflops = 0.0;  // 0 = ask the backend
  bool activation_checkpointing = false;
  int64_t loss_chunk_tokens = 0;
  BackendOptions backend;
};

nlohmann::json load_json_file(const std::string& path);
// Applies "a.b.c=value" to the document; value is parsed as JSON, else taken as a string.
void apply_override(nlohmann::json& doc, const std::string& assignment);
RunConfig parse_run_config(const nlohmann::json& doc, const std::string& source);

}  // namespace so
