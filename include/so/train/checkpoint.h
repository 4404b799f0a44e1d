#pragma once
// HDF5 checkpoints (layout: docs/checkpoints.md). One file per checkpoint, written collectively
// with parallel HDF5: every tensor at its global shape (fp32 master weights under /model, Adam
// moments under /optim/exp_avg and /optim/exp_avg_sq), each rank writing the hyperslab of its
// ZeRO-3 shard; chunked with Fletcher32 checksums; the training state, the resolved config and the
// model's HF config as attributes; a manifest checked on load. Saves commit atomically (temporary
// name, fsync, rename, then the `latest` pointer) and keep the last K; loads read each rank's new
// shard, whatever world size or (dp, sp) split wrote the file.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "so/engine/engine.h"
#include "so/train/run_config.h"

namespace so {

// Everything besides tensors that an exact resume needs. The sampler and the initialisation are
// counter-based, so the data position is the only "RNG state".
struct TrainState {
  int64_t iteration = 0;         // training-loop steps done, skipped ones included
  int64_t steps_taken = 0;       // optimizer steps applied (the LR schedule's position)
  int64_t data_position = 0;     // index of the next global sample
  bool last_step_redone = false; // SuperOffload's adaptive speculation looks at the previous step
};

constexpr int kCheckpointFormatVersion = 1;

// Collective over comm. Returns the committed file's path.
std::string save_checkpoint(Engine& engine, Communicator& comm, const RunConfig& cfg, const TrainState& state,
                            const std::string& dir, int keep);
// A checkpoint file, or a directory whose `latest` pointer names one.
std::string resolve_checkpoint(const std::string& file_or_dir);
// Collective over comm: loads the checkpoint into the engine's shards and returns its state.
TrainState load_checkpoint(Engine& engine, Communicator& comm, const RunConfig& cfg, const std::string& file_or_dir);

// Serial access for tools (so_ckpt), one process, no communicator.
struct CheckpointSummary {
  std::string path;
  int64_t format_version = 0, world_size = 0;
  TrainState state;
  nlohmann::json config, model_config, manifest;
};
CheckpointSummary read_checkpoint_summary(const std::string& file_or_dir);
// A whole tensor, e.g. "/model/model.norm.weight"; fails naming the dataset when a checksum fails.
std::vector<float> read_checkpoint_tensor(const std::string& file, const std::string& dataset);
// Reads every tensor (so every chunk's Fletcher32 checksum) and checks shapes against the
// manifest; returns one line per problem found (empty: intact).
std::vector<std::string> verify_checkpoint(const std::string& file_or_dir);

}  // namespace so
