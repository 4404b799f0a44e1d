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
#include "so/train/monitor_config.h"
#include "so/train/decay_groups.h"
#include "so/train/loss_normalization.h"
#include "so/train/lr_schedule.h"
#include "so/train/nan_policy.h"

namespace so {

struct DataConfig {
  std::string type = "text";  // text | tokens | hdf5 | synthetic | prepared (scripts/prepare_data.py)
  std::string path;
  std::string dataset = "tokens";  // hdf5 only
  int64_t seq_len = 0;
  uint64_t seed = 0;
  int64_t synthetic_tokens = 1 << 20;
  // megatron: data.path is one PREFIX (PREFIX.bin + PREFIX.idx), or data.blend gives
  // [weight, prefix, weight, prefix, ...] as Megatron's --data-path does.
  std::vector<std::pair<double, std::string>> blend;
};

struct RunConfig {
  std::string source;       // the config file
  nlohmann::json resolved;  // the document after --set overrides
  ModelConfig model;
  std::string model_source;  // where the model config came from
  std::string init_hf_dir;   // model.hf_dir: start from these Hugging Face weights; empty = random init
  DType dtype = DType::F32;
  // As the config gives them; 0 = absent. resolve_batch_sizes derives the missing ones once the
  // data-parallel size is known, as DeepSpeed does.
  int64_t micro_batch = 0;       // train_micro_batch_size_per_gpu
  int64_t grad_accum = 0;        // gradient_accumulation_steps
  int64_t train_batch_size = 0;  // train_batch_size (global: micro x accumulation x data-parallel size)
  int sequence_parallel_size = 1;
  float grad_clip = 0.0f;
  AdamWParams adam;
  DecayGroupsConfig decay;  // which parameters adam.weight_decay applies to
  LrSchedule schedule;
  int zero_stage = 0;
  int64_t bucket_size = int64_t{1} << 22;
  OffloadConfig offload;
  DataConfig data;
  int64_t steps = 0;              // with num_train_epochs: 0 until train() derives it from the data
  double num_train_epochs = 0.0;  // train.num_train_epochs (0 = train.steps decides)
  int64_t eval_every = 0;         // train.eval_every: validation loss every N steps and at the end (0 = at the end)
  LossNormalization loss_normalization = LossNormalization::Step;
  uint64_t seed = 1234;
  int64_t log_every = 1;
  double peak_tflops = 0.0;              // 0 = ask the backend
  double collective_timeout_s = 1800.0;  // a collective waiting longer ends the job; 0 = never
  bool activation_checkpointing = false;
  // train.activation_offload (false | true | "auto") and train.mlp_tile_tokens (N | 0 = untiled |
  // "auto"); "auto" is resolved by the memory planner (resolve_auto_memory) once the ranks are known.
  bool offload_checkpoints = false, offload_checkpoints_auto = false;
  int64_t mlp_tile_tokens = 0;
  bool mlp_tile_auto = false;
  int64_t loss_chunk_tokens = 0;
  float z_loss = 0.0f;  // train.z_loss: OLMo's z-loss coefficient (0 = off)
  NanPolicyConfig nan_policy;
  MonitorConfig csv_monitor;    // DeepSpeed's csv_monitor section
  MonitorConfig tensorboard;    // DeepSpeed's tensorboard section (so_train --tensorboard DIR)
  WandbConfig wandb;            // DeepSpeed's wandb section (scripts/wandb_log.py)
  bool flops_profiler = false;  // flops_profiler.enabled: answered by the step line's TFLOP/s and MFU
  BackendOptions backend;
};

// The three batch sizes of a step, complete and consistent.
struct BatchSizes {
  int64_t micro = 1, accumulation = 1, global = 1;
  std::string derived;  // which were derived, for the start-up line ("" = all three given)
};
// DeepSpeed's rules (deepspeed/runtime/config.py): global = micro x accumulation x dp; any two
// give the third, the global batch alone gives micro = global / dp with accumulation 1, the micro
// batch alone gives accumulation 1; so_train adds micro = 1 when neither the micro nor the global
// batch is given. A derivation that does not divide evenly, or three values that disagree, is an
// error naming all three and dp.
BatchSizes resolve_batch_sizes(const RunConfig& cfg, int64_t data_parallel_size);

nlohmann::json load_json_file(const std::string& path);
// Applies "a.b.c=value" to the document; value is parsed as JSON, else taken as a string.
void apply_override(nlohmann::json& doc, const std::string& assignment);
RunConfig parse_run_config(const nlohmann::json& doc, const std::string& source);

}  // namespace so
