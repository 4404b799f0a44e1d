#pragma once
// The memory planner: every byte a run holds on the device and on the host, per rank, from the
// config alone, before anything is allocated. `so_train --plan` prints it; train() refuses a run
// whose plan does not fit (naming the first term that does not) and resolves the "auto" values of
// train.activation_offload and train.mlp_tile_tokens from it.
//
// The device terms come from the code that allocates: the model's buffer list
// (DecoderModel::activation_buffers), the engine's bucket and shard layouts, and a replay of the
// engine's ZeRO-3 gather / reduce-scatter schedule under its release rule (Engine::settle_releases),
// so the predicted peak is the pool's measured peak, not an estimate (tests/plan/).
#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "so/engine/cast_plan.h"
#include "so/model/decoder_model.h"
#include "so/train/run_config.h"

namespace so {

struct MachineProfile {
  std::string name;
  size_t device_bytes = 0;               // 0 = unlimited
  size_t host_bytes = 0;                 // per rank; 0 = not known
  size_t alignment = 64;                 // the device allocator's rounding (CPU backend 64, CUDA 512)
  bool cuda = false;                     // CUDA kernels draw workspaces from the pool too
  Backend* backend = nullptr;            // this run's (machine_profile_of): its ops size their own workspaces
  bool deterministic_attention = false;  // other CUDA machines: as backend.deterministic_attention
  // Where the offload pipeline casts bf16 <-> fp32 when the config says "auto": what the run
  // measured on this machine (the trainer measures before it plans), or what a profile expects of
  // its link (GH200's NVLink-C2C: on the device; PCIe: on the host). Auto: not known, an error for
  // a bf16 offloaded plan.
  CastSite cast_grads = CastSite::Auto, cast_weights = CastSite::Auto;
  // For the gradient ring's depth: the link's device-to-host rate and the device's dense rate
  // (0: not known; the ring is then double-buffered).
  double d2h_gbs = 0, tflops = 0;
};

// An offloaded run's link and casts measured on this machine (measure_casts), before anything is
// planned: the profile's cast sites and link rate become the measured ones, its dense rate the
// backend's peak. Nothing without an offloaded optimizer.
std::optional<CastPlan> measure_offload_link(MachineProfile& m, const RunConfig& cfg, int world, int rank,
                                             const std::vector<int>& optimizer_cores);

// gh200-96, gh200-144, h100-80; host_bytes_per_rank 0 = the node's host memory shared by its GPUs
// (unknown for h100-80). Unknown names are an error listing these.
MachineProfile machine_profile(const std::string& name, size_t host_bytes_per_rank);
std::vector<std::string> machine_profile_names();
// The backend the run has: its capacity (device_memory_limit_mb on the CPU backend) and rounding.
MachineProfile machine_profile_of(Backend& backend);

struct PlanTerm {
  std::string name;
  size_t bytes = 0;
  std::string note;
};

struct MemoryPlan {
  int rank = 0, world = 1, dp = 1, sp = 1;
  int grad_ring_depth = 2;                                              // the engine's EngineOptions::grad_ring_depth
  CastSite cast_grads = CastSite::Host, cast_weights = CastSite::Host;  // as planned (bf16 offload)
  int64_t host_params = 0;                                              // parameters this rank steps on the host
  int64_t seq_len = 0, micro_batch = 1, mlp_tile = 0;
  bool offload_checkpoints = false;
  // Device terms in the order the pool fills: model buffers, engine state, then what comes and
  // goes (the largest of them at once is counted); device_peak is their sum.
  std::vector<PlanTerm> device;
  std::vector<PlanTerm> host;
  size_t device_peak = 0, host_total = 0;
};

// The model options a run uses (the trainer builds its model from these too).
ModelOptions model_options(const RunConfig& cfg, int64_t micro_batch, int sp_size);

// Rank `rank` of `world` (dp x sp from cfg.sequence_parallel_size). Auto values must be resolved.
// Every rank's plan is the same (ZeRO shards are padded to one size); the rank names the errors.
// async_saves: the run saves checkpoints asynchronously (host room to copy the state aside).
MemoryPlan plan_memory(const RunConfig& cfg, int world, int rank, const MachineProfile& m, bool async_saves = false);
// The cast sites a run uses: the config's, or for "auto" the machine's (above). Refuses what is
// still unknown where it matters (bf16 with an offloaded optimizer).
std::pair<CastSite, CastSite> planned_cast_sites(const RunConfig& cfg, const MachineProfile& m);

// The gradient ring's depth (grad_ring.h): completions between a range's release and its reuse,
// enough for the copy of a bucket to the host to finish behind the backward of those in between:
// 1 + ceil(copy time of the offloaded gradients / backward time of a micro-batch) at half the
// device's dense rate, at least 2 (a bucket copied while the next is written), at most 4.
int grad_ring_depth(const RunConfig& cfg, int world, const MachineProfile& m);

// The device term at which the running sum first passes the profile's capacity; none if it fits.
std::optional<std::string> first_term_over(const MemoryPlan& plan, const MachineProfile& m);
// The table: terms, totals, whether each memory holds them, the largest sequence length and layer
// count that would fit, and as its last line "device peak X MiB".
std::string format_plan(const RunConfig& cfg, int world, const MemoryPlan& plan, const MachineProfile& m);

// The run as the performance model sees it (jobs/sweeps/perf_model.py): shape, batch, mesh,
// ZeRO stage, optimizer placement (parameters stepped on the host and on the device), features,
// and the plan's device and host totals.
nlohmann::json plan_json(const RunConfig& cfg, int world, const MemoryPlan& plan);

// Turns train.activation_offload / train.mlp_tile_tokens "auto" into values: checkpoints are
// offloaded (with checkpointing) and then the MLP tiled (largest power-of-two tile) only as far as
// needed to fit the profile. Returns what it chose, for the start-up line ("" if nothing was auto).
std::string resolve_auto_memory(RunConfig& cfg, int world, const MachineProfile& m);

}  // namespace so
