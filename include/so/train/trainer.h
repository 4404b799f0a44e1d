#pragma once
// The training loop: data -> forward/backward per micro-batch -> optimizer step -> metrics.
#include <functional>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "so/checkpoint/run_saves.h"
#include "so/train/run_config.h"

namespace so {

class Engine;

// The checkpoint options (RunSaveOptions: --save-dir, --save-every, --keep, --async-save) and the
// loop's own.
struct TrainOptions : RunSaveOptions {
  std::string metrics_path;  // JSON lines; empty = none
  bool quiet = false;        // --quiet: short step lines (start-up notes are the launcher's log level)
  std::string trace_path;    // Chrome/Perfetto trace of every step; empty = none
  bool save_at_end = false;  // also after the last step (HF Trainer's final save), unless just saved
  std::string resume;        // checkpoint file, or a directory with a `latest` pointer
  int64_t profile_first = 0, profile_last = 0;  // steps bracketed by Backend::profile_range; 0 = none
  // Called with the engine after the last step (collectively on every rank): tests, exports.
  std::function<void(Engine&)> at_end;
};

struct TrainSummary {
  double first_loss = 0.0, last_loss = 0.0;
  double mean_tokens_per_s = 0.0;
  double mean_step_s = 0.0;               // per step, over steps 2..
  double mean_exposed_optimizer_s = 0.0;  // per step, over steps 2.. (step 1 pays start-up effects)
  double mean_optimizer_busy_s = 0.0;
  int64_t steps = 0;
  int64_t clipped_steps = 0, skipped_steps = 0;
  std::vector<double> losses;        // every step's global mean loss (of this run, after any resume)
  std::vector<double> step_seconds;  // every step's time, as its metrics line gives it
  bool stopped_by_signal = false;
};

TrainSummary train(const RunConfig& cfg, Communicator& comm, const TrainOptions& opts);

}  // namespace so
