#include "so/train/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "so/core/error.h"

namespace so {

MetricsSink::MetricsSink(const std::string& path, bool compact) : path_(path), compact_(compact) {
  if (path.empty()) return;
  jsonl_.open(path, std::ios::out | std::ios::app);
  SO_CHECK(jsonl_.good(), "cannot open metrics file '", path, "' for appending");
}

std::string format_duration(double seconds) {
  const auto s = static_cast<long long>(std::llround(std::max(0.0, seconds)));
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  return buf;
}

std::string format_step_line(const StepMetrics& m, int64_t total_steps, bool compact) {
  const std::string eval =
      m.evaluated ? str_cat(" | eval loss ", m.eval_loss, " ppl ", m.eval_perplexity, " (", m.eval_tokens, " tokens)")
                  : "";
  const std::string progress = eval + str_cat(" | elapsed ", format_duration(m.elapsed_s), ", ETA ",
                                              format_duration(m.eta_s), " (", total_steps - m.step, " steps left)");
  char buf[400];
  if (compact) {
    std::snprintf(buf, sizeof(buf), "step %5lld/%lld | loss %.4f | lr %.3e | grad-norm %.3f%s | %.0f tok/s",
                  static_cast<long long>(m.step), static_cast<long long>(total_steps), m.loss, m.lr, m.grad_norm,
                  m.skipped ? " (skipped: non-finite)" : "", m.tokens_per_s);
    return buf + progress;
  }
  std::snprintf(buf, sizeof(buf),
                "step %5lld/%lld | loss %.4f | lr %.3e | grad-norm %.3f%s | %.0f tok/s (%.0f supervised) | %.3f "
                "TFLOP/s | MFU %.1f%% "
                "(non-causal %.1f%%, of measured GEMM %.1f%%) | opt exposed %.1f ms (cpu %.1f ms) | mem %.1f MiB "
                "(peak %.1f)",
                static_cast<long long>(m.step), static_cast<long long>(total_steps), m.loss, m.lr, m.grad_norm,
                m.skipped ? " (skipped: non-finite)" : "", m.tokens_per_s, m.supervised_tokens_per_s, m.tflops,
                100.0 * m.mfu, 100.0 * m.mfu_noncausal, 100.0 * m.mfu_gemm, 1e3 * m.exposed_optimizer_s,
                1e3 * m.optimizer_busy_s, m.mem_mib, m.peak_mem_mib);
  return buf + progress;
}

std::vector<std::pair<std::string, double>> metric_scalars(const StepMetrics& m) {
  std::vector<std::pair<std::string, double>> s = {{"loss", m.loss},
                                                   {"lr", m.lr},
                                                   {"grad_norm", m.grad_norm},
                                                   {"skipped", m.skipped ? 1.0 : 0.0},
                                                   {"step_seconds", m.seconds},
                                                   {"exposed_optimizer_s", m.exposed_optimizer_s},
                                                   {"optimizer_busy_s", m.optimizer_busy_s},
                                                   {"tokens_per_s", m.tokens_per_s},
                                                   {"tflops", m.tflops},
                                                   {"mfu", m.mfu},
                                                   {"mfu_noncausal", m.mfu_noncausal},
                                                   {"mfu_gemm", m.mfu_gemm},
                                                   {"mem_mib", m.mem_mib},
                                                   {"peak_mem_mib", m.peak_mem_mib},
                                                   {"elapsed_s", m.elapsed_s},
                                                   {"eta_s", m.eta_s},
                                                   {"supervised_tokens", static_cast<double>(m.supervised_tokens)},
                                                   {"supervised_tokens_per_s", m.supervised_tokens_per_s}};
  if (m.evaluated)
    s.insert(s.end(), {{"eval_loss", m.eval_loss},
                       {"eval_perplexity", m.eval_perplexity},
                       {"eval_tokens", static_cast<double>(m.eval_tokens)}});
  if (m.moe)
    s.insert(s.end(), {{"expert_tokens_min", m.expert_tokens_min},
                       {"expert_tokens_max", m.expert_tokens_max},
                       {"expert_imbalance", m.expert_imbalance}});
  return s;
}

void MetricsSink::write(const StepMetrics& m, int64_t total_steps, bool print) {
  if (print) std::printf("%s\n", format_step_line(m, total_steps, compact_).c_str());
  if (!jsonl_.is_open()) return;
  nlohmann::json j = {{"step", m.step}};
  for (const auto& [name, value] : metric_scalars(m)) j[name] = value;
  j["skipped"] = m.skipped;  // a boolean in the file, the counts integers
  j["supervised_tokens"] = m.supervised_tokens;
  if (m.evaluated) j["eval_tokens"] = m.eval_tokens;
  jsonl_ << j.dump() << '\n';
  jsonl_.flush();
  SO_CHECK(jsonl_.good(), "writing metrics file '", path_, "' failed");
}

}  // namespace so
