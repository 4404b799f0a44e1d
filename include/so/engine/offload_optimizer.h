#pragma once
// The offloaded part of the optimizer: the fp32 master weights and Adam moments of the buckets
// stepped on the CPU, in NUMA-local pinned host memory, and the per-bucket pipeline
//   gradients complete -> (cast) -> D2H copy -> GraceAdam -> H2D copy -> (cast) -> device weights
// run by one optimizer thread (GraceAdam parallelises each bucket over its pool). With several
// micro-batches per step, each one's gradients are copied as backward completes them and added to
// the step's fp32 sums on the host by a second thread, so that the device holds none between
// micro-batches and a micro-batch's copies never wait behind the optimizer's work.
//
// Per step: begin_step; grads_ready(b) for each bucket as backward completes it; sums() for
// validation; finish_step(decision); then wait_weights(b) before the next forward reads b.
// Under SuperOffload the CPU steps a bucket as soon as its gradients arrive (speculation) if its
// own gradients are finite; finish_step rolls back and redoes it when validation clips, or rolls
// it back when the step is skipped. Under ZeRO-Offload every bucket waits for the decision.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "so/backend/backend.h"
#include "so/engine/optimizer_host_state.h"
#include "so/engine/bucket.h"
#include "so/engine/cast_plan.h"
#include "so/engine/decay_runs.h"
#include "so/engine/offload_config.h"
#include "so/engine/step_timeline.h"
#include "so/optim/grace_adam.h"

namespace so {

// What validation decided for a step.
struct StepDecision {
  bool skip = false;        // non-finite gradients somewhere: nothing may change
  float grad_scale = 1.0f;  // clipping coefficient (1 = no clipping)
};

class OffloadOptimizer {
 public:
  // Device cast staging: a bucket is cast and copied in chunks of this many elements through one
  // fp32 buffer per direction cast on the device (the cast and the copy of a direction share its
  // stream, so one chunk buffer is all they need; copies of 32 MiB run at the link's full speed).
  static constexpr int64_t kCastChunk = int64_t{1} << 23;
  static int64_t cast_stage_elements(int64_t largest_bucket) { return std::min(largest_bucket, kCastChunk); }
  // Host slots a micro-batch's gradients land in before they are added to the step's sums
  // (Options::accumulate): one being copied while the CPU adds the last.
  static constexpr int kIncomingSlots = 2;
  struct Options {
    DType dtype = DType::F32;  // model dtype of the device weights and gradients
    OffloadMode mode = OffloadMode::SuperOffload;
    RollbackMode rollback = RollbackMode::Inverse;
    CastPlan cast;
    bool pin_memory = true;
    int numa_node = -1;
    // Several micro-batches per step: each one's gradients are copied to the host as backward
    // completes them and added there in fp32 (the device keeps none between micro-batches).
    bool accumulate = false;
    // The order in which the next forward reads the buckets (a permutation of their indices):
    // validation's corrections run in this order, so the forward starts on the first bucket's new
    // weights while later ones are still being redone. Empty: descending index (buckets are built
    // in backward order, so the last one holds the first layers).
    std::vector<size_t> forward_order;
    // Buckets [0, host_sums) have their sums of squares taken here (sums()); the engine sums the
    // rest on the device, as their gradients are final only at the end of backward: the worker
    // neither sums nor speculates on those (it would only lengthen the tail of the step).
    size_t host_sums = SIZE_MAX;
    // Per bucket: the runs of its weight-decay groups (decay_runs), each stepped with its decay.
    std::vector<std::vector<DecayRun>> decay_runs;
    // Runs each pass that changes a bucket's state, on the optimizer thread: change_state(i, gen, a,
    // unconditional_step, pass) calls pass(a), or pass(a') with a' keeping the old state for a
    // checkpoint snapshot (Engine::change_state); may be empty (then pass(a) is called directly).
    std::function<void(size_t, int64_t, const AdamArrays&, bool, const AdamPass&)> change_state;
  };
  // The gradient dtype that crosses the link, and the one the host keeps for GraceAdam.
  static DType link_grad_dtype(const Options& o) {
    return o.dtype == DType::BF16 && o.cast.grads == CastSite::Host ? DType::BF16 : DType::F32;
  }
  static DType host_grad_dtype(const Options& o) { return o.accumulate ? DType::F32 : link_grad_dtype(o); }
  // buckets: the offloaded ones, covering [base, end) of the flat buffers; device_weights is the
  // whole flat device weight buffer (model dtype). The gradients come with grads_ready.
  OffloadOptimizer(Backend& backend, std::vector<Bucket> buckets, int64_t base, int64_t end, void* device_weights,
                   const Options& opts, GraceAdam& adam, StepTimeline& timeline);
  ~OffloadOptimizer();
  OffloadOptimizer(const OffloadOptimizer&) = delete;
  OffloadOptimizer& operator=(const OffloadOptimizer&) = delete;

  size_t num_buckets() const { return slots_.size(); }
  const Bucket& bucket(size_t i) const { return slots_[i].bucket; }
  int64_t base() const { return base_; }
  size_t host_bytes() const;
  // Host state of flat element `e` (base <= e < end); only while no step is in flight.
  float* master(int64_t e) { return host_.p() + (e - base_); }
  float* exp_avg(int64_t e) { return host_.m() + (e - base_); }
  float* exp_avg_sq(int64_t e) { return host_.v() + (e - base_); }

  // iteration: increases by one per call (skipped steps are retried under a new iteration);
  // hp carries lr and the optimizer step number the step will have if it is applied.
  // speculate: whether this step's buckets may be stepped before validation (SuperOffload).
  void begin_step(int64_t iteration, const AdamWParams& hp, bool speculate);
  int64_t rollbacks() const { return rollbacks_.load(); }  // buckets rolled back so far
  // Completes when bucket i's last gradient copy has read the device gradients (their memory may
  // then be written again).
  Event& grads_copied(size_t i) { return *slots_[i].grads_on_host; }
  // Bucket i's gradients of one micro-batch are at `src` (device, model dtype, the bucket's
  // elements) once `producer` (the compute stream, or the comm stream that reduced them) reaches
  // this point. The optimizer steps the bucket after the step's last one; without `accumulate`
  // every call is a step's last.
  void grads_ready(size_t i, Stream& producer, const void* src, bool first_micro, bool last_micro);
  // The gradients of bucket i as the optimizer read them in the last step, widened to fp32.
  std::vector<float> read_grads(size_t i);
  // Per-bucket sums of squared gradients of buckets [0, count) (fp32, as the device ops compute
  // them); waits for those.
  std::vector<float> sums(size_t count);
  // Hands validation's decision to the optimizer thread and returns: the buckets are finalised
  // (stepped, redone with the clip coefficient, or rolled back) one pass each, in forward order.
  void finish_step(const StepDecision& d);
  // The compute stream waits until bucket i's weights from the last finished step are on the
  // device (the host first waits until the optimizer has issued that copy).
  void wait_weights(size_t i, Stream& compute);
  // The last step validation decided (-1: none yet); its buckets may still be being finalised.
  int64_t decided_iteration();
  // Host waits until bucket i's state is final for step `iteration` (any thread; rethrows
  // optimizer errors).
  void wait_final(size_t i, int64_t iteration);
  // Host waits for every outstanding task and copy; rethrows optimizer errors.
  void drain();

 private:
  struct Slot {
    Bucket bucket;
    std::unique_ptr<Event> grads_ready, grads_on_host, weights_on_device;
    bool upload_in_flight = false;  // weights_on_device recorded and not yet synchronised by the worker
    bool speculated = false;        // the step of this generation is applied speculatively (scale 1)
    bool decided = false;           // the step of this generation is final
    int64_t summed_gen = -1, final_gen = -1;
    float sumsq = 0.0f;
  };
  using Task = std::function<void()>;

  void enqueue(Task t, std::deque<Task>& queue);
  void run_worker(std::deque<Task>& queue);
  void wait_until(const std::function<bool()>& ready);  // rethrows worker errors

  // Worker-thread steps of the pipeline.
  void process(size_t i, int64_t gen, const AdamWParams& hp, bool speculate);
  void finalize(size_t i, int64_t gen, const AdamWParams& hp, const StepDecision& d);
  void apply(size_t i, const AdamWParams& hp, int64_t gen, bool speculative);
  // pass(a) through Options::change_state when there is one.
  void change_state(size_t i, int64_t gen, const AdamArrays& a, bool unconditional_step, const AdamPass& pass);
  void upload(size_t i, int64_t gen);
  void settle_upload(size_t i);
  void publish_final(size_t i, int64_t gen);
  // One bucket's device gradients (model dtype) to host memory in the link's dtype, or its new
  // weights back, cast on the device in chunks where the plan says so.
  void copy_grads_to_host(void* dst, const void* src, int64_t n, Stream& d2h);
  void copy_weights_to_device(void* dst, const float* master, const void* out, int64_t n, Stream& h2d);

  int64_t offset(size_t i) const { return slots_[i].bucket.begin - base_; }
  void* host_grad(size_t i) const;

  Backend& backend_;
  Options opts_;
  GraceAdam& adam_;
  StepTimeline& timeline_;
  int64_t base_, end_;
  void* device_weights_;
  DType link_grad_dtype_;  // what crosses the link
  DType host_grad_dtype_;  // what GraceAdam reads (fp32 sums when accumulating)
  std::vector<Slot> slots_;
  OptimizerHostState host_;                 // p, m, v, gradients, bf16 weights out, exact-rollback snapshot
  DeviceBuffer grad_stage_, weight_stage_;  // device-side cast staging, one chunk each
  int64_t stage_elems_ = 0;
  // Accumulation: micro-batch gradients land here (link dtype, the largest bucket each) and are
  // added to the step's sums by the worker; a slot is taken again once that add is done.
  std::vector<HostBuffer> incoming_;
  std::vector<std::unique_ptr<Event>> incoming_copied_;
  std::vector<char> incoming_busy_;  // shared with the worker (mu_)
  size_t next_incoming_ = 0;

  // Shared between the main thread and the worker.
  std::mutex mu_;
  std::condition_variable cv_;       // worker: new task
  std::condition_variable done_cv_;  // main: progress
  std::deque<Task> tasks_;           // the optimizer thread's
  std::deque<Task> adds_;            // the accumulating thread's (Options::accumulate)
  bool stop_ = false;
  int64_t busy_ = 0;  // tasks queued or running
  std::exception_ptr error_;
  int64_t gen_ = -1;        // step being worked on (main thread's view)
  AdamWParams hp_;          // of step gen_, with grad_scale 1 (main thread only)
  bool speculate_ = false;  // of step gen_ (main thread only)
  std::atomic<int64_t> rollbacks_{0};
  bool drained_ = true;       // main thread: no task enqueued (no event recorded) since drain()
  int64_t decided_gen_ = -1;  // the last step validation decided, and how
  StepDecision decision_;
  std::thread worker_, adder_;
};

}  // namespace so
