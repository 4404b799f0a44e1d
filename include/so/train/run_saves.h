#pragma once
// The checkpoints of one run (docs/checkpoints.md): every save_every steps, and a final one on
// SIGTERM / SIGUSR1 (Slurm's preemption signals: finish the step, save, exit cleanly). At most one
// save is in flight: its writers run while training goes on, and it is committed at the first step
// boundary where every rank's writer has finished (or before the next save).
#include <cstdint>
#include <memory>

#include "parallel/communicator.h"
#include "so/train/checkpoint.h"
#include "so/train/trainer.h"

namespace so {

class Engine;

class RunSaves {
 public:
  // Installs the signal handlers and reserves the asynchronous saves' host memory when saving is on.
  RunSaves(Engine& engine, Communicator& comm, const RunConfig& cfg, const TrainOptions& opts);
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
  const RunConfig& cfg_;
  const TrainOptions& opts_;
  std::unique_ptr<CheckpointSave> in_flight_;
};

}  // namespace so
