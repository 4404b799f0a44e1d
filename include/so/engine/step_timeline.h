#pragma once
// What happened when, per training step, on the four lanes (compute, D2H, H2D, CPU optimizer):
// the source of the per-step "exposed optimizer time" (time the compute lane sits idle because
// of the optimizer) and, with --trace, of a Chrome/Perfetto trace.
//
// A step's window runs from the start of its forward to the start of the next step's forward
// on the compute lane. Its exposed optimizer time is the gap between the end of its backward and
// the next forward (validation, device-side steps, and any wait for the CPU), plus the time its
// own forward stalled waiting for weights the CPU optimizer had not yet returned.
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "so/backend/backend.h"

namespace so {

enum class Lane { Compute = 0, D2H = 1, H2D = 2, Optimizer = 3, Comm = 4 };

struct StepTiming {
  int64_t step = 0;
  double seconds = 0.0;            // window length on the compute lane
  double exposed_optimizer = 0.0;  // seconds the compute lane waited on the optimizer
  double optimizer_busy = 0.0;     // seconds the CPU optimizer worked on this step
};

class StepTimeline {
 public:
  // trace_path empty: only the exposure bookkeeping (a few events per step).
  StepTimeline(Backend& backend, std::string trace_path, int rank);
  ~StepTimeline();
  bool tracing() const { return !trace_path_.empty(); }

  void begin_forward(int64_t step);  // on the compute lane; closes the previous step's window
  void end_backward();               // on the compute lane
  // Compute-lane span boundary (tracing only): the lane is labelled `label` until the next mark.
  void mark_compute(const std::string& label);
  // Runs `wait` (which makes the compute lane wait, possibly blocking the host first) and
  // counts the compute lane's idle time across it as exposed optimizer time.
  void compute_stall(const std::string& label, const std::function<void()>& wait);
  // Runs `enqueue` (work on stream s) bracketed by events when tracing. Thread-safe.
  void stream_span(Stream& s, Lane lane, const std::string& label, int64_t step, const std::function<void()>& enqueue);
  // A span of host work on the optimizer lane (now_seconds() clock). Thread-safe.
  void host_span(Lane lane, const std::string& label, int64_t step, double t0, double t1);

  // The timing of `step` once its window is closed (the next begin_forward, or close()) and
  // the compute lane has passed that point; waits for those events.
  std::optional<StepTiming> finish(int64_t step);
  // Closes the last window (after the engine made the compute lane wait for all weights).
  void close();
  // Writes the Chrome trace (tracing only).
  void write_trace();

 private:
  struct Span {
    Lane lane;
    std::string label;
    int64_t step;
    std::unique_ptr<Event> begin, end;  // stream spans
    double t0 = 0, t1 = 0;              // host spans / resolved
  };
  struct Stall {
    std::string label;
    std::unique_ptr<Event> before, after;
  };
  struct Window {
    int64_t step;
    std::unique_ptr<Event> start, backward_end;
    std::vector<Stall> stalls;
    double optimizer_busy = 0.0;
  };
  std::unique_ptr<Event> record_compute();
  Window* window(int64_t step);

  Backend& backend_;
  std::string trace_path_;
  int rank_;
  std::mutex mu_;
  std::deque<Window> windows_;  // open windows, oldest first
  std::unique_ptr<Event> closed_at_;
  std::vector<Span> spans_;
  int64_t current_step_ = 0;
  std::string open_mark_;
  std::unique_ptr<Event> open_mark_begin_;
};

}  // namespace so
