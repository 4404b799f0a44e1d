#include "so/engine/step_timeline.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "so/core/error.h"
#include "so/core/log.h"

namespace so {

namespace {
const char* lane_name(Lane l) {
  switch (l) {
    case Lane::Compute: return "compute";
    case Lane::D2H: return "D2H copy";
    case Lane::H2D: return "H2D copy";
    case Lane::Optimizer: return "CPU optimizer";
    case Lane::Comm: return "collectives";
  }
  return "?";
}
}  // namespace

StepTimeline::StepTimeline(Backend& backend, std::string trace_path, int rank)
    : backend_(backend), trace_path_(std::move(trace_path)), rank_(rank) {}

StepTimeline::~StepTimeline() = default;

std::unique_ptr<Event> StepTimeline::record_compute() {
  std::unique_ptr<Event> e = backend_.create_event();
  backend_.record(*e, backend_.stream(StreamKind::Compute));
  return e;
}

StepTimeline::Window* StepTimeline::window(int64_t step) {
  for (Window& w : windows_)
    if (w.step == step) return &w;
  return nullptr;
}

void StepTimeline::begin_forward(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  current_step_ = step;
  windows_.push_back(Window{step, record_compute(), nullptr, {}, 0.0});
}

void StepTimeline::end_backward() {
  std::lock_guard<std::mutex> lock(mu_);
  if (Window* w = window(current_step_)) w->backward_end = record_compute();
}

void StepTimeline::mark_compute(const std::string& label) {
  if (!tracing()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (open_mark_begin_)
    spans_.push_back(Span{Lane::Compute, open_mark_, current_step_, std::move(open_mark_begin_), record_compute()});
  open_mark_ = label;
  open_mark_begin_ = label.empty() ? nullptr : record_compute();
}

void StepTimeline::compute_stall(const std::string& label, const std::function<void()>& wait) {
  std::unique_ptr<Event> before = record_compute();
  wait();
  std::unique_ptr<Event> after = record_compute();
  std::lock_guard<std::mutex> lock(mu_);
  Window* w = window(current_step_);
  SO_CHECK(w, "timeline: compute stall '", label, "' outside any step window");
  w->stalls.push_back(Stall{label, std::move(before), std::move(after)});
}

void StepTimeline::stream_span(Stream& s, Lane lane, const std::string& label, int64_t step,
                               const std::function<void()>& enqueue) {
  if (!tracing()) return enqueue();
  std::unique_ptr<Event> b = backend_.create_event(), e = backend_.create_event();
  backend_.record(*b, s);
  enqueue();
  backend_.record(*e, s);
  std::lock_guard<std::mutex> lock(mu_);
  spans_.push_back(Span{lane, label, step, std::move(b), std::move(e)});
}

void StepTimeline::host_span(Lane lane, const std::string& label, int64_t step, double t0, double t1) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Window* w = window(step)) w->optimizer_busy += t1 - t0;
  if (tracing()) spans_.push_back(Span{lane, label, step, nullptr, nullptr, t0, t1});
}

std::optional<StepTiming> StepTimeline::finish(int64_t step) {
  std::unique_lock<std::mutex> lock(mu_);
  if (windows_.empty() || windows_.front().step != step) return std::nullopt;
  Event* next = windows_.size() > 1 ? windows_[1].start.get() : closed_at_.get();
  if (!next) return std::nullopt;
  Window w = std::move(windows_.front());
  windows_.pop_front();
  lock.unlock();  // event times may block; the optimizer thread keeps recording meanwhile

  StepTiming t;
  t.step = step;
  const double start = backend_.event_time(*w.start), end = backend_.event_time(*next);
  const double bwd_end = w.backward_end ? backend_.event_time(*w.backward_end) : end;
  t.seconds = end - start;
  t.exposed_optimizer = std::max(0.0, end - bwd_end);
  std::vector<Span> stall_spans;
  for (Stall& st : w.stalls) {
    const double t0 = backend_.event_time(*st.before), t1 = backend_.event_time(*st.after);
    t.exposed_optimizer += t1 - t0;
    if (tracing()) stall_spans.push_back(Span{Lane::Compute, "wait: " + st.label, step, nullptr, nullptr, t0, t1});
  }
  t.optimizer_busy = w.optimizer_busy;
  if (tracing()) {
    stall_spans.push_back(Span{Lane::Compute, "optimizer exposed", step, nullptr, nullptr, bwd_end, end});
    lock.lock();
    for (Span& sp : stall_spans) spans_.push_back(std::move(sp));
  }
  return t;
}

void StepTimeline::close() {
  mark_compute("");
  std::lock_guard<std::mutex> lock(mu_);
  if (!closed_at_) closed_at_ = record_compute();
}

void StepTimeline::write_trace() {
  if (!tracing()) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (Span& sp : spans_)
    if (sp.begin) {
      sp.t0 = backend_.event_time(*sp.begin);
      sp.t1 = backend_.event_time(*sp.end);
    }
  double origin = 0.0;
  bool first = true;
  for (const Span& sp : spans_)
    if (first || sp.t0 < origin) origin = sp.t0, first = false;
  nlohmann::json events = nlohmann::json::array();
  for (Lane l : {Lane::Compute, Lane::D2H, Lane::H2D, Lane::Optimizer, Lane::Comm})
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", rank_},
                      {"tid", static_cast<int>(l)},
                      {"args", {{"name", lane_name(l)}}}});
  events.push_back(
      {{"ph", "M"}, {"name", "process_name"}, {"pid", rank_}, {"args", {{"name", str_cat("rank ", rank_)}}}});
  for (const Span& sp : spans_)
    events.push_back({{"ph", "X"},
                      {"name", sp.label},
                      {"pid", rank_},
                      {"tid", static_cast<int>(sp.lane)},
                      {"ts", (sp.t0 - origin) * 1e6},
                      {"dur", std::max(0.0, sp.t1 - sp.t0) * 1e6},
                      {"args", {{"step", sp.step}}}});
  std::ofstream out(trace_path_);
  SO_CHECK(out, "cannot write the trace file '", trace_path_, "'");
  out << nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() << "\n";
  SO_CHECK(out.good(), "writing the trace file '", trace_path_, "' failed");
  log_info(str_cat("trace: ", spans_.size(), " spans written to ", trace_path_));
}

}  // namespace so
