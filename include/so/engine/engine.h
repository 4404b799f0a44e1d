#pragma once
// The engine owns every parameter-sized buffer — device weights and gradients in the model's
// dtype, fp32 master weights and Adam moments — as flat buffers cut into buckets, serves them
// to the model (ParamStore), receives its per-unit callbacks (ModelHooks), and runs the
// optimizer step: global-norm clipping and a finite check, then AdamW on the device for the
// device-resident buckets and through the OffloadOptimizer (ZeRO-Offload or SuperOffload) for
// the rest. One path for every mode: the modes differ only in where a bucket's state lives and
// when its CPU step starts.
//
// A training step:  begin_step(schedule, micro_batches) -> model.forward_backward(..., engine,
// engine) per micro-batch -> end_step() -> ... The next step's forward waits per bucket (events)
// for the weights it reads, not for the whole optimizer. When no bucket is stepped on the host,
// the step is validated on the device too (Ops::clip_decision) and the device AdamW reads the
// decision there: end_step returns without waiting for the device, and the host learns the result
// when it asks (step_result) or when the next step needs it: the step count that the learning
// rate schedule reads is known by the next end_step, which is where that step's optimizer launches.
// With offloaded buckets the CPU Adam needs the decision on the host: end_step waits for it.
//
// ZeRO stages, with more than one rank in `comm` (one rank: all stages are the same):
//   3: each rank keeps only its shard of every bucket's weights, gradients and optimizer state
//      (ShardLayout). Before a unit's forward or backward its buckets are all-gathered on the comm
//      stream (the next unit's prefetched meanwhile) and released when no later unit of the pass
//      reads them; a bucket's gradients are accumulated into a full-size buffer, reduce-scattered
//      (summed over all ranks: the loss is scaled by the global token count) into the rank's
//      shard when final, and that shard goes through the same optimizer path.
//   2: the same, but the gathered weights stay (every rank keeps the whole model): each bucket is
//      gathered once per step, after its update, and never released.
//   1: as 2, and each bucket's full gradients stay too: all-reduced instead of reduce-scattered,
//      the rank's shard copied out for its optimizer.
//   0: nothing sharded: gradients all-reduced in place, every rank steps every parameter.
// The stages differ only in what is kept whole; the step's logic is the same.
//
// Gradients on the device: the device-stepped buckets' for the whole step; an offloaded bucket's
// only from their first write (or their reduce-scatter) until their copy to the host is done, in
// the gradient ring (grad_ring.h), whose memory the next buckets reuse. With several micro-batches
// per step an offloaded bucket's gradients go to the host after each one and are summed there in
// fp32 (stage 1, which keeps every gradient bucket whole anyway, sums them on the device).
#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "parallel/communicator.h"
#include "so/backend/backend.h"
#include "so/backend/host_buffer.h"
#include "so/engine/bucket.h"
#include "so/engine/cast_plan.h"
#include "so/engine/decay_runs.h"
#include "so/engine/grad_ring.h"
#include "so/engine/offload_config.h"
#include "so/engine/offload_optimizer.h"
#include "so/engine/shard_layout.h"
#include "so/engine/step_timeline.h"
#include "so/model/model_interfaces.h"
#include "so/model/param_layout.h"
#include "so/optim/adamw.h"
#include "so/optim/grace_adam.h"

namespace so {

struct EngineOptions {
  DType dtype = DType::F32;
  int zero_stage = 3;                      // 0..3: what is sharded over the ranks (above)
  int64_t bucket_size = int64_t{1} << 22;  // elements
  float grad_clip = 0.0f;                  // max global norm; 0 = off
  AdamWParams adam;                        // lr is given per step
  // Per parameter id: 1 = stepped without weight decay (HF Trainer's second parameter group:
  // norms, biases). Empty: every parameter decays with adam.weight_decay.
  std::vector<char> no_decay;
  OffloadConfig offload;
  std::vector<int> optimizer_cores;  // GraceAdam's pool; empty = one unpinned thread
  int numa_node = -1;                // for offloaded host state; -1 = local
  std::string trace_path;            // Chrome trace of every step; empty = none
  int rank = 0;
  int accumulation = 1;          // micro-batches per step (begin_step's): above 1, offloaded buckets sum on the host
  int grad_ring_depth = 2;       // completions before a gradient ring range is reused (the planner's)
  std::optional<CastPlan> cast;  // measured already (the trainer's, before its memory plan); else measured here
};

struct StepResult {
  double grad_norm = 0.0;   // global, before clipping
  float clip_coef = 1.0f;   // factor applied to the gradients
  bool skipped = false;     // non-finite gradients: nothing was updated
  double lr = 0.0;          // the step's learning rate (the schedule's at its start)
  int64_t steps_taken = 0;  // optimizer steps applied, this one included when not skipped
};

// A step's learning rate and Adam (beta1, beta2) (none: the configured betas), for a step that
// follows `steps_taken` applied optimizer steps (the trainer's schedule).
struct StepHyperparameters {
  double lr = 0.0;
  std::optional<std::pair<double, double>> betas;
};
using StepSchedule = std::function<StepHyperparameters(int64_t steps_taken)>;

enum class OptimState { Master, ExpAvg, ExpAvgSq };

// The part of one parameter this rank owns: elements [first, first + count) of the flattened
// tensor (count 0: none). The whole tensor without ZeRO-3.
struct ParamSlice {
  int64_t first = 0, count = 0;
};

class Engine final : public ParamStore, public ModelHooks {
  struct Frozen;  // a bucket's checkpoint snapshot, with the private state below

 public:
  Engine(Backend& backend, const ParamLayout& layout, const EngineOptions& opts, Communicator& comm);
  ~Engine() override;

  void* weight(int param_id) override;
  void* grad(int param_id) override;
  void before_unit(int unit) override;
  void before_backward(int unit) override;
  void after_backward(int unit) override;
  void copy_span(Stream& s, const char* what, int layer, const std::function<void()>& enqueue) override;

  // Hugging Face initialisation: normal(0, std) for matrices, ones for norms; counter-based, so
  // identical whatever the world size.
  void init_weights(uint64_t seed, float std);
  void load_weight(int param_id, const std::vector<float>& values);
  // Whole parameters on every rank (collective under ZeRO-3); wait for the optimizer.
  std::vector<float> read_state(int param_id, OptimState which);
  std::vector<float> read_weight(int param_id) { return read_state(param_id, OptimState::Master); }
  std::vector<float> read_grad(int param_id);  // the last step's gradients, widened to fp32

  // Checkpoints: this rank's part of each tensor, without any collective.
  ParamSlice owned_slice(int param_id) const;
  // The part of a parameter that `rank` writes to a checkpoint: its owned slice, except that under
  // stage 0 (every rank holds the same whole state) rank 0 alone writes. Computable for any rank.
  ParamSlice saved_slice(int param_id, int rank) const;
  size_t bucket_of(int param_id) const;
  int64_t bucket_shard_begin(size_t b) const { return shards_.buckets[b].shard_begin; }
  int64_t bucket_shard_size(size_t b) const { return shards_.buckets[b].shard_size; }

  // A snapshot of the optimizer state for a checkpoint: freeze_state() (between steps) waits for
  // nothing; the writer's with_frozen(b, read) waits until bucket b's state is final for the step
  // that saved (the CPU optimizer may still be finishing it, as it does beside the next forward)
  // and calls read(frozen) once, with bucket b's state as of the saving step. Device state is
  // staged to host memory at the freeze or read in place (DeviceSnapshot). Host state is read in
  // place until the first change a later step makes to the bucket (change_state) puts it aside,
  // unless with_frozen(b) took it already: a CPU Adam step writes the old values aside in its own
  // pass, other changes copy the bucket first. Each copy() holds the bucket only while it copies
  // its piece, so an optimizer step reaching a bucket the writer is still on waits for one piece
  // (not the bucket's disk write), puts the bucket aside and goes on; the writer reads the rest
  // from that copy. Read in place, device memory goes by a D2H copy straight into the caller's
  // buffer, and the writer's only copy is the one into its I/O buffer. Staged and put-aside copies
  // go into host memory kept from one save to the next (reserve_snapshot_space), whose pages exist
  // already: fresh pages cost a step more to fault in than the copy itself.
  class FrozenBucket {
   public:
    int64_t size() const { return n_; }  // values per part: bucket_shard_size(b)
    // Bytes [byte_offset, byte_offset + bytes) of one part of the bucket's shard into dst.
    void copy(OptimState part, size_t byte_offset, size_t bytes, void* dst) const;

   private:
    friend class Engine;
    Backend* backend_ = nullptr;
    Frozen* frozen_ = nullptr;  // the lock, and the copy aside once there is one
    int64_t n_ = 0;
    const char* host_[3] = {};      // host state in place
    const char* device_[3] = {};    // otherwise
    Event* state_ready_ = nullptr;  // the saving step's device updates done (the D2H copies wait for it)
    std::unique_ptr<Event> copied_;
  };
  using FrozenReader = std::function<void(const FrozenBucket& frozen)>;
  // How a snapshot takes device-resident state: read in place by the writer (a synchronous save:
  // nothing changes it before the writer has it), or staged to host memory at once, behind the
  // saving step on the Snapshot stream and in the order the next step changes the buckets (an
  // asynchronous save: the copies overlap what runs next, and each of the next step's device
  // updates waits, on its stream, for its own bucket's copy only).
  enum class DeviceSnapshot { InPlace, Staged };
  void freeze_state(DeviceSnapshot device);
  void with_frozen(size_t b, const FrozenReader& read);
  // Room to copy every bucket this rank saves aside once (12 bytes per owned parameter; none on
  // ranks other than 0 when unsharded; pinned when state lives on the device); trainers saving
  // asynchronously reserve it before the first step.
  // A copy aside without it reserves it then.
  void reserve_snapshot_space();
  size_t snapshot_space_bytes() const { return snapshot_space_.bytes(); }
  std::vector<float> read_owned(int param_id, OptimState which);  // slice.count values
  // Master writes also refresh the device copy in model dtype (rounded as every cast rounds).
  // Elements [first, first + n) of this rank's owned part (owned_slice); loaders go by pieces
  // through one reused buffer, touching no new pages.
  void write_owned(int param_id, OptimState which, int64_t first, const float* values, int64_t n);
  bool last_step_redone() {
    resolve_step();
    return last_step_redone_;
  }
  // Resuming: the loop's and the optimizer's counters as the checkpoint recorded them.
  void restore_counters(int64_t iteration, int64_t steps_taken, bool last_step_redone) {
    resolve_step();  // a step still being decided is overwritten, not applied later
    iteration_ = iteration;
    steps_ = steps_taken;
    last_step_redone_ = last_step_redone;
  }

  // Opens a step: zeroes the gradients; the step's learning rate and betas come from `schedule` at
  // the optimizer steps applied before it (OneCycle also cycles the betas), asked when first needed:
  // here when CPU steps use them (speculation starts during backward), else in end_step, once the
  // previous step's result is known. The last of `micro_batches` backward passes hands the
  // gradients to the optimizer.
  void begin_step(StepSchedule schedule, int micro_batches = 1);
  // The same at a fixed learning rate (and betas).
  void begin_step(double lr, int micro_batches = 1, std::optional<std::pair<double, double>> betas = std::nullopt);
  // Validates (global norm, finite check) and applies the step. Skipped steps change nothing,
  // not even the step count. Returns once the step is enqueued (see the top of this file).
  void end_step();
  // The result of step `iteration` (1-based, as iteration()): the last ended step or the one before
  // it (the training loop reads a step's after the next step has ended). Waits for the last ended
  // step's validation when that ran on the device.
  StepResult step_result(int64_t iteration);
  StepResult step_result();  // the last ended step's
  // Waits for all optimizer work and closes the timeline (end of training, before reading state).
  void finish();
  // Between end_step and the next begin_step: a forward pass run now (evaluation) reads the weights
  // of the step just ended. Unsharded, the compute stream waits for every bucket's update (the
  // step's forward had already waited for the last ones); sharded, every gather waits for them anyway.
  void settle_weights();

  int64_t steps_taken() {
    resolve_step();
    return steps_;
  }
  int64_t iteration() const { return iteration_; }
  // Speculated buckets undone (rolled back or redone with the clip coefficient), offloaded and device ones.
  int64_t rollbacks() const { return (offload_ ? offload_->rollbacks() : 0) + device_rollbacks_; }
  int64_t speculative_steps() const { return speculative_steps_; }
  StepTimeline& timeline() { return timeline_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  size_t num_offloaded_buckets() const { return first_device_bucket_; }
  const ParamLayout& layout() const { return layout_; }
  const ShardLayout& shards() const { return shards_; }
  int zero_stage() const { return stage_; }
  // Device memory of weights, gradients and optimizer state this rank keeps for the whole run:
  // shards, the gradient ring, and under stages 0-2 the replicated parts (stage 3's transient
  // gathers not included).
  size_t state_bytes() const;
  size_t host_state_bytes() const;  // host memory of offloaded state
  // Device memory of the step's validation on the device (no bucket offloaded): the decision,
  // then this rank's sum and the ranks' sums (doubles, 8-byte aligned after it).
  static size_t device_validation_bytes(int ranks) { return sizeof(ClipDecision) + (1 + ranks) * sizeof(double); }
  std::string describe() const;  // one line: mode, placement, threads, casts

 private:
  const ParamInfo& info(int param_id) const;
  bool on_host(int64_t shard_element) const { return shard_element >= device_end_; }
  void drain_optimizer();
  // The step's learning rate and betas from the schedule (once per step; needs the previous result).
  void fix_step_hyperparameters();
  // Validation on the device: the decision (ClipDecision) enqueued on the comm stream after the
  // bucket sums, and copied to the host behind it.
  void decide_on_device();
  // The last ended step's result into the counters, once; waits for a device decision's copy.
  void resolve_step();
  // r (with the step's lr) as the last ended step's: the counters advanced.
  void apply_result(StepResult r);
  float* state_ptr(int64_t shard_element, OptimState which);
  // Gathers (stages 1-3): make bucket b's full weights available / make compute wait for them /
  // drop them (stage 3) or mark them stale after an update (stages 1-2).
  void gather(size_t b);
  void use_gathered(size_t b);
  void release_gathered(size_t b);
  void invalidate_gathered();
  // Stage 2-3 buffers go back stream-ordered (release_after). Each release is remembered with the
  // hook call it happened in, and an allocation first waits until those of earlier hook calls are
  // done: the host runs at most one hook ahead of the streams' frees, so the device pool never
  // holds more than the memory planner's schedule of them (plan_memory), whatever the timing.
  void release_stream_ordered(DeviceBuffer buf, Stream& s);
  void settle_releases();
  // Units u of the current pass: gather what u reads, prefetch the next unit's, drop the rest.
  void enter_unit(int unit, bool backward);
  void wait_stepped_weights(size_t b);  // unsharded: compute waits for bucket b's new weights
  bool offloaded(size_t b) const { return offload_ && b < first_device_bucket_; }
  // The ring range of offloaded bucket b (null when b does not use the ring: device buckets, stage 1).
  char* ring_range(size_t b);
  // Stream s waits until the copies (and device sums) of what bucket b's ring range last held have
  // read it.
  void wait_ring_free(size_t b, Stream& s);
  // Where this rank's reduced gradients of bucket b are read by its optimizer: the device buckets'
  // persistent buffer, the ring, or (stage 1) the rank's shard of the whole gradient bucket.
  char* reduced_grads(size_t b);
  // Bucket b's gradients of this micro-batch are final: reduced over the ranks, summed for
  // validation or stepped on the device, or handed to the offload pipeline.
  void complete_bucket(size_t b, bool first_micro, bool last_micro);
  // One Adam pass (AdamCall) over device bucket b's state on the comm stream, a call per
  // weight-decay run, guarded by the bucket's sum of squares when given, or by the device's
  // decision (which also gives the clip coefficient).
  void device_adam(size_t b, AdamCall call, const AdamWParams& hp, float final_scale, const float* guard,
                   const char* what, const ClipDecision* decision = nullptr);
  // Runs pass(a), a change of bucket b's state for step `iteration`: enqueued on stream `s` (device
  // state), or done on the host before it returns (s null: the CPU optimizer's host state). If the
  // bucket's frozen state is still wanted and the change is of a step after the saving one: a
  // staged bucket's pass waits for its staging copy; otherwise the state is put aside first, by the
  // pass itself when it runs on the host and is an `unconditional_step` (AdamCall::Step writing
  // every element whatever the gradients) whose snapshot is free, given the bucket's copy aside as
  // a's snapshot (one more store per value instead of a copy's load and store); by a copy before
  // the pass otherwise.
  void change_state(size_t b, int64_t iteration, AdamArrays a, bool unconditional_step, Stream* s,
                    const AdamPass& pass);
  AdamArrays device_arrays(size_t b, bool with_snapshot);  // a device bucket's state, grads and weights
  void allocate_snapshot_space();
  // Whether this rank's checkpoint writer saves any of bucket b (unsharded state: rank 0 alone).
  bool saves_bucket(size_t b) const;
  void copy_bucket_state(size_t b, float* out);  // p, m, v of bucket b's shard: 3 x shard_size values
  // The same of a device bucket, queued on the Snapshot stream behind the saving step's device updates;
  // `copied` is recorded after it.
  void queue_device_state(size_t b, float* out, Event& copied);

  Backend& backend_;
  const ParamLayout& layout_;
  EngineOptions opts_;
  Communicator& comm_;
  int stage_;                      // the ZeRO stage in effect (3 when there is one rank: no difference)
  bool keep_gathered_ = false;     // stages 1-2: gathered weights persist, re-gathered after each step
  bool keep_full_grads_ = false;   // stage 1: full gradient buckets persist (all-reduced)
  bool all_reduce_grads_ = false;  // stages 0-1 over several ranks: gradients all-reduced
  std::vector<Bucket> buckets_;
  ShardLayout shards_;
  size_t first_device_bucket_ = 0;     // buckets [0, this) are offloaded (first in backward order)
  size_t first_device_sum_ = 0;        // validation sums buckets [this, n) on the device, the rest on the CPU
  int64_t device_end_ = 0;             // device-resident optimizer state covers shard elements [0, this)
  BucketUnits units_;                  // which buckets each unit reads, and back
  std::vector<size_t> forward_order_;  // buckets in the order the forward first reads them
  std::vector<std::vector<DecayRun>> decay_runs_;  // per bucket: its shard's weight-decay groups

  DeviceBuffer weights_;  // model dtype, this rank's shards (all elements unsharded)
  DeviceBuffer grads_;    // model dtype, shard elements [0, device_end_): device-stepped buckets
  GradRing ring_;         // offloaded buckets' gradients in flight
  DeviceBuffer ring_buf_;
  std::vector<size_t> ring_use_;                // bucket -> its use in ring_ (SIZE_MAX: none)
  bool accumulate_on_host_ = false;             // offloaded buckets' micro-batches summed on the host
  std::vector<char> grads_touched_;             // written (zeroed first) this micro-batch (ring) / this step (grads_)
  DeviceBuffer master_, exp_avg_, exp_avg_sq_;  // fp32, shard elements [0, device_end_)
  std::vector<DeviceBuffer> gathered_, full_grads_;  // per bucket, full size: while in use (stage 3) or always
  std::vector<std::unique_ptr<Event>> gathered_ev_, reduced_ev_;
  std::vector<char> gathered_fresh_;                // gathered_[b] holds the current weights (a gather is issued)
  std::vector<char> gather_used_;                   // compute already waits for this gather
  std::vector<char> full_grads_zeroed_;             // stage 1: this step's zeroing of full_grads_[b] is issued
  std::vector<std::unique_ptr<Event>> stepped_ev_;  // device bucket b's last step done (comm stream)
  DeviceBuffer bucket_sums_;                        // fp32 per bucket validated on the device (first_device_sum_ on)
  // Validation on the device (no bucket stepped on the host): the decision, this rank's sum of the
  // bucket sums and every rank's (gathered), in backend memory; the decision's copy on the host.
  bool decides_on_device_ = false;
  DeviceBuffer decision_;
  HostBuffer decision_host_;
  std::unique_ptr<Event> decision_copied_;
  bool result_pending_ = false;  // the last ended step's device decision is not in the counters yet
  struct EndedStep {
    int64_t iteration = 0;
    StepResult result;  // its lr only while pending
  };
  EndedStep ended_[2];  // the step before the last ended one, and the last ended one
  StepSchedule schedule_;
  bool hyperparameters_fixed_ = false;  // spec_hp_ holds this step's lr and betas
  DeviceBuffer device_snapshot_;        // exact rollback of speculated device buckets: p, m, v [3][device_end_]
  StepTimeline timeline_;
  std::unique_ptr<GraceAdam> grace_;
  std::unique_ptr<OffloadOptimizer> offload_;
  std::string cast_report_;
  int numa_node_ = -1;  // of the offloaded host state

  // Asynchronous checkpoints: per bucket, whether the state as of freeze_state() is still wanted,
  // and whether the optimizer had to copy it aside (to its place in snapshot_space_) first.
  struct Frozen {
    std::mutex mu;
    bool wanted = false;
    bool aside = false;
    bool saved = false;  // fixed at construction: this rank's writer saves some of it (else nothing is staged or kept)
    float* copy = nullptr;  // 3 x shard_size values in snapshot_space_ (buckets this rank saves)
    // Device state staged to the copy aside by freeze_state: done when `copied` is (Snapshot stream).
    bool staged = false;
    std::unique_ptr<Event> copied;
  };
  HostBuffer snapshot_space_;
  std::atomic<int64_t> frozen_iteration_{-1};  // the saving step: its own changes are part of the snapshot
  int64_t frozen_offload_step_ = -1;           // the CPU optimizer's step the writer waits for
  std::unique_ptr<Event> frozen_ready_;        // on the comm stream after the saving step's device updates
  std::once_flag snapshot_space_reserved_;
  std::vector<std::unique_ptr<Frozen>> frozen_;
  std::vector<bf16> write_staging_;  // write_owned's model-dtype copy of master weights
  std::atomic<int64_t> frozen_wanted_{0};

  int64_t steps_ = 0;
  int64_t iteration_ = 0;
  int64_t speculative_steps_ = 0;
  int64_t device_rollbacks_ = 0;
  bool last_step_redone_ = false;  // validation clipped or skipped the previous step
  bool speculating_ = false;       // this step's buckets are stepped before validation (SuperOffload)
  AdamWParams spec_hp_;            // of the speculative steps: this step's lr and step, grad_scale 1
  // A device bucket is stepped speculatively when its gradients are final before the last moments
  // of backward (there is backward left to hide the step behind); the others right after validation.
  bool speculates_on_device(size_t b) const { return speculating_ && buckets_[b].ready_unit > 1; }
  int micro_batches_ = 1, micro_done_ = 0;
  bool in_backward_ = false;
  int64_t hook_calls_ = 0;  // before_unit / before_backward / after_backward calls so far
  std::deque<std::pair<int64_t, std::unique_ptr<Event>>> releases_;  // (hook call, freed when done)
  std::vector<char> weights_waited_;  // per bucket: compute waits for its new weights already (unsharded)
};

}  // namespace so
