#include "so/checkpoint/run_saves.h"

#include <csignal>

#include "so/core/error.h"
#include "so/core/log.h"
#include "so/core/units.h"
#include "so/engine/engine.h"

namespace so {

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

}  // namespace

RunSaves::RunSaves(Engine& engine, Communicator& comm, const ModelConfig& model, const nlohmann::json& run_config,
                   const RunSaveOptions& opts)
    : engine_(engine), comm_(comm), model_(model), run_config_(run_config), opts_(opts) {
  if (!on()) return;
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGUSR1, on_stop_signal);
  if (!opts.async_save) return;
  engine.reserve_snapshot_space();  // its pages faulted in now, not by the step after a save
  if (comm.rank() == 0)
    log_info(str_cat("asynchronous saves: ", mib(engine.snapshot_space_bytes()),
                     " MiB of host memory per rank for the saved state: device state is staged there at each save, "
                     "host state put aside there before the next step changes it"));
}

void RunSaves::commit() {
  const std::string path = in_flight_->commit();
  in_flight_.reset();
  if (comm_.rank() == 0) log_info(str_cat("checkpoint saved: ", path));
}

void RunSaves::save(TrainState& state, bool async) {
  if (in_flight_) commit();
  state.steps_taken = engine_.steps_taken();
  state.last_step_redone = engine_.last_step_redone();
  in_flight_ =
      std::make_unique<CheckpointSave>(engine_, comm_, model_, run_config_, state, opts_.save_dir, opts_.keep, async);
  if (!async) commit();
}

void RunSaves::save_now(TrainState& state) { save(state, false); }

bool RunSaves::after_step(int64_t step, TrainState& state) {
  if (!on()) return false;
  // Every rank learns of a signal, and of every writer being done, at the same step boundary,
  // so all commit, save and stop together.
  double flags[2] = {g_stop_signal != 0 ? 1.0 : 0.0, in_flight_ && in_flight_->written() ? 1.0 : 0.0};
  comm_.all_reduce_sum(flags, 2);
  const bool stop = flags[0] > 0;
  if (in_flight_ && flags[1] == comm_.size()) commit();
  // On a signal: the save in flight first, then the final one, synchronously.
  if ((opts_.save_every > 0 && step % opts_.save_every == 0) || stop) save(state, opts_.async_save && !stop);
  if (stop && comm_.rank() == 0)
    log_info(str_cat("stopping after step ", step, " on a termination signal; resume with --resume ", opts_.save_dir));
  return stop;
}

void RunSaves::finish() {
  if (in_flight_) commit();
}

}  // namespace so
