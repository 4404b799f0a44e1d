#pragma once
// One readable line per step on stdout (or a short one: --quiet), and the same record as JSON lines
// in a metrics file.
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace so {

struct StepMetrics {
  int64_t step = 0;
  double loss = 0.0;
  double lr = 0.0;
  double grad_norm = 0.0;
  bool skipped = false;
  double seconds = 0.0;              // the step's window on the compute lane
  double exposed_optimizer_s = 0.0;  // of it, idle waiting on the optimizer
  double optimizer_busy_s = 0.0;     // CPU optimizer work for this step (offload modes)
  double tokens_per_s = 0.0;
  int64_t supervised_tokens = 0;  // labels the step's loss is over (all tokens of windowed data)
  double supervised_tokens_per_s = 0.0;
  bool evaluated = false;  // validation after this step (train.eval_every, and at the end)
  double eval_loss = 0.0, eval_perplexity = 0.0;
  int64_t eval_tokens = 0;
  double tflops = 0.0;
  double mfu = 0.0;            // fraction of the configured (datasheet) peak, attention counted causally
  double mfu_noncausal = 0.0;  // the same counting attention over every (query, key) pair
  double mfu_gemm = 0.0;       // fraction of the GEMM rate measured on this device at start-up
  double mem_mib = 0.0;
  double peak_mem_mib = 0.0;
  double elapsed_s = 0.0;  // wall time since this run's first step began
  double eta_s = 0.0;      // the steps left at the mean time of this run's steps so far
  // Mixture of experts (written only for a model with MoE layers): the step's tokens per expert
  // over all ranks and micro-batches, the fewest and most any expert of any layer received, and the
  // worst layer's imbalance (its busiest expert's tokens over its mean: 1 is perfectly balanced).
  bool moe = false;
  double expert_tokens_min = 0.0, expert_tokens_max = 0.0, expert_imbalance = 0.0;
};

class MetricsSink {
 public:
  // empty: no file; compact: the short step line
  MetricsSink(const std::string& jsonl_path, bool compact);
  void write(const StepMetrics& m, int64_t total_steps, bool print);

 private:
  std::ofstream jsonl_;
  std::string path_;
  bool compact_ = false;
};

// The step's numbers as the JSONL file names them (skipped as 0 or 1), for the monitors.
std::vector<std::pair<std::string, double>> metric_scalars(const StepMetrics& m);

// The full line, or the compact one (progress, loss, lr, norm, throughput); both end with the
// elapsed time and the ETA.
std::string format_step_line(const StepMetrics& m, int64_t total_steps, bool compact = false);
std::string format_duration(double seconds);  // H:MM:SS

}  // namespace so
