#pragma once
// The log of a run's steps: each step's metrics (throughput, MFU, exposed optimizer time, ETA) to
// the step line, the JSONL file and TensorBoard, and the means the run's summary reports.
// A step's timing is known only once the next step's forward has started (an offloaded step's
// optimizer overlaps it), so each step is held and written one step late.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "so/engine/step_timeline.h"
#include "so/train/metrics.h"
#include "so/train/tensorboard_monitor.h"

namespace so {

struct TrainSummary;

// What a step's throughput figures are computed from, fixed at start-up.
struct ThroughputBasis {
  int64_t tokens_per_step = 0;
  double flops_per_token = 0.0;  // attention counted causally
  double flops_per_token_noncausal = 0.0;
  double peak_tflops = 0.0;  // configured or datasheet peak; 0 = no MFU
  double gemm_tflops = 0.0;  // measured at start-up; 0 = none
};

struct StepLogOptions {
  std::string metrics_path;  // JSON lines; empty = none (and on every rank but 0)
  bool quiet = false;        // the short step line
  bool lead = false;         // rank 0: prints and writes
  int64_t first_step = 1, last_step = 1, log_every = 1;
};

class StepLog {
 public:
  // tensorboard: the step's metrics go there too as scalars "train/<name>" (when it is on).
  StepLog(const StepLogOptions& opts, const ThroughputBasis& basis, TensorBoardMonitor& tensorboard);

  // A finished step's loss, lr, norm and memory; written by the next write_held.
  void hold(const StepMetrics& m);
  // Writes the held step, if any, once its timing is complete on the timeline.
  void write_held(StepTimeline& timeline);
  // The means over the steps written (the first step of a run pays start-up effects and is left out
  // of the timing means).
  void summarize(TrainSummary& summary) const;

 private:
  StepLogOptions opts_;
  ThroughputBasis basis_;
  MetricsSink sink_;
  TensorBoardMonitor& tensorboard_;
  std::optional<StepMetrics> held_;
  double run_start_ = 0.0;
  std::vector<double> step_seconds_;  // every step written
  double tokens_per_s_sum_ = 0.0, step_sum_ = 0.0, exposed_sum_ = 0.0, busy_sum_ = 0.0;
};

}  // namespace so
