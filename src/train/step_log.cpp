#include "so/train/step_log.h"

#include <algorithm>
#include <cstdio>

#include "so/core/clock.h"
#include "so/core/error.h"
#include "so/train/trainer.h"

namespace so {

StepLog::StepLog(const StepLogOptions& opts, const ThroughputBasis& basis, TensorBoardMonitor& tensorboard)
    : opts_(opts),
      basis_(basis),
      sink_(opts.lead ? opts.metrics_path : "", opts.quiet),
      tensorboard_(tensorboard),
      run_start_(now_seconds()) {}

void StepLog::hold(const StepMetrics& m) { held_ = m; }

void StepLog::write_held(StepTimeline& timeline) {
  if (!held_) return;
  StepMetrics m = *held_;
  held_.reset();
  const std::optional<StepTiming> t = timeline.finish(m.step);
  SO_CHECK(t, "timeline of step ", m.step, " is not complete");
  const double peak = basis_.peak_tflops, gemm_peak = basis_.gemm_tflops;
  m.seconds = t->seconds;
  m.exposed_optimizer_s = t->exposed_optimizer;
  m.optimizer_busy_s = t->optimizer_busy;
  m.tokens_per_s = basis_.tokens_per_step / m.seconds;
  m.supervised_tokens_per_s = static_cast<double>(m.supervised_tokens) / m.seconds;
  m.tflops = m.tokens_per_s * basis_.flops_per_token / 1e12;
  m.mfu = peak > 0 ? m.tflops / peak : 0.0;
  m.mfu_noncausal = peak > 0 ? m.tokens_per_s * basis_.flops_per_token_noncausal / 1e12 / peak : 0.0;
  m.mfu_gemm = gemm_peak > 0 ? m.tflops / gemm_peak : 0.0;
  m.elapsed_s = now_seconds() - run_start_;
  m.eta_s =
      m.elapsed_s / static_cast<double>(m.step - opts_.first_step + 1) * static_cast<double>(opts_.last_step - m.step);
  sink_.write(m, opts_.last_step,
              opts_.lead && (m.step % opts_.log_every == 0 || m.step == 1 || m.step == opts_.last_step || m.evaluated));
  std::fflush(stdout);
  if (tensorboard_.on()) {
    std::vector<std::pair<std::string, double>> scalars = metric_scalars(m);
    for (auto& [name, value] : scalars) name = "train/" + name;
    tensorboard_.scalars(m.step, scalars);
  }
  tokens_per_s_sum_ += m.tokens_per_s;
  step_seconds_.push_back(m.seconds);
  if (m.step > opts_.first_step)  // the first step of a run pays start-up effects
    step_sum_ += m.seconds, exposed_sum_ += m.exposed_optimizer_s, busy_sum_ += m.optimizer_busy_s;
}

void StepLog::summarize(TrainSummary& summary) const {
  const int64_t ran = static_cast<int64_t>(summary.losses.size());
  summary.step_seconds = step_seconds_;
  summary.mean_tokens_per_s = tokens_per_s_sum_ / std::max<int64_t>(1, ran);
  summary.mean_step_s = step_sum_ / std::max<int64_t>(1, ran - 1);
  summary.mean_exposed_optimizer_s = exposed_sum_ / std::max<int64_t>(1, ran - 1);
  summary.mean_optimizer_busy_s = busy_sum_ / std::max<int64_t>(1, ran - 1);
}

}  // namespace so
