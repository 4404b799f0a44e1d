#pragma once
// The checkpoints of one run (docs/checkpoints.md): every save_every steps, and a final one on
// SIGTERM / SIGUSR1 (Slurm's preemption signals: finish the step, save, exit cleanly). At most one
// save is in flight: its writers run while training goes on, and it is committed at the first step
// boundary where every rank's writer has finished (or before the next save).
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "parallel/communicator.h"
#include "so/checkpoint/checkpoint.h"
#include "so/model/model_config.h"

namespace so {

class Engine;

// so_train's --save-dir, --save-every, --keep and --async-save.
struct RunSaveOptions {
  std::string save_dir;    // checkpoints go here (docs/checkpoints.md); empty = never saved
  int64_t save_every = 0;  // steps between checkpoints; 0 = only on SIGTERM/SIGUSR1
  int keep = 3;            // checkpoints kept in save_dir
  bool async_save = true;  // training goes on while a checkpoint is written (docs/checkpoints.md)
};

class RunSaves {
 public:
  // Installs the signal handlers and reserves the asynchronous saves' host memory when saving is on.
  // `model` and `run_config` go into every checkpoint's metadata (CheckpointSave).
  RunSaves(Engine& engine, Communicator& comm, const ModelConfig& model, const nlohmann::json& run_config,
           const RunSaveOptions& opts);
  bool on() const { return !opts_.save_dir.empty(); }
  const std::string& directory() const { return opts_.save_dir; }
  // Collective, after each step: commits a finished save, saves when one is due or a signal came.
  // Returns true when a signal asks the run to stop (its state is then saved).
  bool after_step(int64_t step, TrainState& state);
  // Collective: a synchronous save of the state as it is now.
  void save_now(TrainState& state);
  // Collective: commits the save in flight, if any.
  void finish();

 private:
  void save(TrainState& state, bool async);
  void commit();
  Engine& engine_;
  Communicator& comm_;
  const ModelConfig& model_;
  const nlohmann::json& run_config_;
  const RunSaveOptions& opts_;
  std::unique_ptr<CheckpointSave> in_flight_;
};

}  // namespace so
