#include "so/train/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>
#include <tuple>

#include "so/core/error.h"
#include "so/core/round_up.h"
#include "so/core/units.h"
#include "so/engine/bucket.h"
#include "so/engine/cast_plan.h"
#include "so/engine/engine.h"
#include "so/engine/grad_ring.h"
#include "so/engine/offload_optimizer.h"
#include "so/engine/shard_layout.h"

namespace so {

namespace {

constexpr size_t kGiB = size_t{1} << 30;

struct Profile {
  const char* name;
  size_t device_bytes, host_bytes;  // host: the node's, shared by its GPUs (0: not known)
  int gpus_per_node;
  const char* what;
  CastSite cast;           // where "auto" casts are expected to land (both directions)
  double d2h_gbs, tflops;  // device-to-host link, dense bf16 peak
};
constexpr size_t kGB = 1000 * 1000 * 1000;
// Datasheet capacities: GH200 with 96 GB HBM3 or 144 GB HBM3e, each with 480 GB LPDDR5X; H100 SXM
// 80 GB (80 GiB usable as cudaMemGetInfo reports it). Casts: on NVLink-C2C the device casts and
// fp32 crosses (moving bytes is cheap, the CPU's cast pass is not); on PCIe bf16 crosses. Links:
// GH200's device-to-host as measured on GH200 nodes at its low end (170 GB/s), PCIe Gen5 x16 from
// pinned memory (55 GB/s); 989.4 TFLOP/s dense bf16 (H100 SXM, GH200).
constexpr Profile kProfiles[] = {
    {"gh200-96", 96 * kGB, 480 * kGB, 1, "GH200 superchip, 96 GB HBM3 + 480 GB LPDDR5X", CastSite::Device, 170, 989.4},
    {"gh200-144", 144 * kGB, 480 * kGB, 1, "GH200 superchip, 144 GB HBM3e + 480 GB LPDDR5X", CastSite::Device, 170,
     989.4},
    {"h100-80", 80 * kGiB, 0, 8, "H100 SXM 80 GB (host memory: give --plan-host-gib)", CastSite::Host, 55, 989.4},
};

// Replays the engine's hooks for one step on a sharded run (ZeRO stages 2-3): gathered weight
// buckets (stage 3) and full gradient buckets come and go; a released buffer counts until an
// allocation of a later hook call waits for it (Engine::settle_releases). Returns the most bytes
// alive at once.
class ZeroReplay {
 public:
  // every_micro: buckets [0, every_micro) are reduced after each micro-batch (offloaded buckets
  // summed on the host), the others after the step's last.
  ZeroReplay(const ParamLayout& layout, const std::vector<Bucket>& buckets, const ShardLayout& shards, int stage,
             size_t esz, size_t align, size_t every_micro)
      : layout_(layout),
        buckets_(buckets),
        stage_(stage),
        units_(bucket_units(layout, buckets)),
        every_micro_(every_micro) {
    for (size_t b = 0; b < buckets.size(); ++b)
      bytes_.push_back(round_up(static_cast<size_t>(shards.padded_size(b)) * esz, align));
    gathered_.assign(buckets.size(), 0);
    grads_.assign(buckets.size(), 0);
  }

  size_t peak(int micro_batches, bool checkpointing) {
    const int L = units_.units() - 2;
    // One step; with accumulation, a micro-batch that keeps its gradients, then the last one.
    for (int micro = std::min(micro_batches, 2); micro >= 1; --micro) {
      const bool last = micro == 1;
      in_backward_ = false;
      for (int u = 0; u <= L + 1; ++u) hook(), enter(u);
      grads_of_unit(L + 1);  // the head runs forward and backward under one before_unit
      after_backward(L + 1, last);
      for (int u = L; u >= 1; --u) {
        if (checkpointing) hook(), enter(u);
        hook(), enter(u);
        grads_of_unit(u);
        after_backward(u, last);
      }
      hook(), enter(0);
      grads_of_unit(0);
      after_backward(0, last);
    }
    for (size_t b = 0; b < buckets_.size(); ++b) hook(), gather(b), drop(b);  // Engine::finish
    return peak_;
  }

 private:
  void hook() { ++calls_; }
  void alloc(size_t bytes) {
    while (!pending_.empty() && pending_.front().first < calls_) {
      pending_bytes_ -= pending_.front().second;
      pending_.pop_front();
    }
    alive_ += bytes;
    peak_ = std::max(peak_, alive_ + pending_bytes_);
  }
  void release(size_t bytes) {
    alive_ -= bytes;
    pending_.emplace_back(calls_, bytes);
    pending_bytes_ += bytes;
  }
  void gather(size_t b) {
    if (stage_ < 3 || gathered_[b]) return;
    gathered_[b] = 1;
    alloc(bytes_[b]);
  }
  void drop(size_t b) {
    if (stage_ < 3 || !gathered_[b]) return;
    gathered_[b] = 0;
    release(bytes_[b]);
  }
  void touch_grads(size_t b) {
    if (grads_[b]) return;
    grads_[b] = 1;
    alloc(bytes_[b]);
  }
  void enter(int unit) {
    for (size_t b = 0; b < buckets_.size(); ++b)
      if (in_backward_ ? units_.lo[b] > unit : units_.hi[b] < unit) drop(b);
    for (size_t b : units_.unit_buckets[unit]) gather(b);
    const int next = in_backward_ ? unit - 1 : unit + 1;
    if (next >= 0 && next < units_.units())
      for (size_t b : units_.unit_buckets[next]) gather(b);
  }
  // A parameter's gradient is first written in the backward of the last unit that reads it.
  void grads_of_unit(int unit) {
    for (size_t id = 0; id < layout_.params.size(); ++id)
      if (layout_.params[id].last_unit == unit) touch_grads(units_.param_bucket[id]);
  }
  void after_backward(int unit, bool last_micro) {
    hook();
    in_backward_ = unit > 0;
    if (unit == 0)
      for (size_t b = 0; b < buckets_.size(); ++b) drop(b);
    for (size_t b = 0; b < buckets_.size(); ++b) {
      if (buckets_[b].ready_unit != unit || (!last_micro && b >= every_micro_)) continue;
      touch_grads(b);  // a bucket nobody wrote still reduces
      grads_[b] = 0;
      release(bytes_[b]);
    }
  }

  const ParamLayout& layout_;
  const std::vector<Bucket>& buckets_;
  int stage_;
  BucketUnits units_;
  size_t every_micro_;
  std::vector<size_t> bytes_;
  std::vector<char> gathered_, grads_;
  bool in_backward_ = false;
  int64_t calls_ = 0;
  size_t alive_ = 0, pending_bytes_ = 0, peak_ = 0;
  std::deque<std::pair<int64_t, size_t>> pending_;
};

int64_t dp_size_of(const RunConfig& cfg, int world) {
  SO_CHECK(cfg.sequence_parallel_size >= 1 && world % cfg.sequence_parallel_size == 0, "plan: ", world,
           " ranks are not divisible by sequence_parallel_size (", cfg.sequence_parallel_size, ")");
  return world / cfg.sequence_parallel_size;
}

}  // namespace

std::vector<std::string> machine_profile_names() {
  std::vector<std::string> names;
  for (const Profile& p : kProfiles) names.emplace_back(p.name);
  return names;
}

MachineProfile machine_profile(const std::string& name, size_t host_bytes_per_rank) {
  MachineProfile m;
  for (const Profile& p : kProfiles) {
    if (name != p.name) continue;
    m.name = str_cat(p.name, ": ", p.what);
    m.device_bytes = p.device_bytes;
    m.host_bytes = host_bytes_per_rank ? host_bytes_per_rank : p.host_bytes / p.gpus_per_node;
    m.alignment = 512;
    m.cuda = true;
    m.cast_grads = m.cast_weights = p.cast;
    m.d2h_gbs = p.d2h_gbs;
    m.tflops = p.tflops;
    return m;
  }
  std::string known;
  for (const std::string& n : machine_profile_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error(str_cat("plan: unknown machine profile '", name, "'; known: ", known));
}

MachineProfile machine_profile_of(Backend& backend) {
  MachineProfile m;
  m.backend = &backend;
  m.name = str_cat("this ", backend.name(), " backend");
  m.device_bytes = backend.memory_stats().capacity;
  m.alignment = backend.allocation_granularity();
  m.cuda = !backend.device_is_host();
  return m;
}

std::optional<CastPlan> measure_offload_link(MachineProfile& m, const RunConfig& cfg, int world, int rank,
                                             const std::vector<int>& optimizer_cores) {
  if (cfg.offload.mode == OffloadMode::None) return std::nullopt;
  SO_CHECK(m.backend != nullptr, "plan: measuring the link needs this machine's backend");
  const std::vector<Bucket> buckets = make_buckets(ParamLayout::for_model(cfg.model), cfg.bucket_size);
  const int stage = world > 1 ? cfg.zero_stage : 3;
  const ShardLayout shards = make_shard_layout(buckets, stage >= 1 ? world : 1, stage >= 1 ? rank : 0);
  int64_t largest = 0;  // what one copy over the link moves
  for (size_t b = 0; b < first_device_bucket(buckets, cfg.offload); ++b)
    largest = std::max(largest, shards.buckets[b].shard_size);
  // A device too small for the probe cannot hold the run either: its casts are planned on the host
  // (no staging) and the plan refuses the run with its table, not the probe with an allocation error.
  const size_t probe = static_cast<size_t>(cast_probe_elements(largest)) * 6;
  if (m.device_bytes > 0 && probe > m.device_bytes - std::min(m.device_bytes, m.backend->memory_stats().in_use)) {
    m.cast_grads = m.cast_weights = CastSite::Host;
    return std::nullopt;
  }
  CastPlan c = measure_casts(*m.backend, cfg.offload, cfg.dtype, largest, optimizer_cores);
  m.cast_grads = c.grads, m.cast_weights = c.weights;
  m.d2h_gbs = c.d2h_gbs;
  m.tflops = m.backend->peak_tflops(cfg.dtype);
  return c;
}

ModelOptions model_options(const RunConfig& cfg, int64_t micro_batch, int sp_size) {
  ModelOptions mo;
  mo.dtype = cfg.dtype;
  mo.micro_batch = micro_batch;
  mo.seq_len = cfg.data.seq_len / sp_size;
  mo.activation_checkpointing = cfg.activation_checkpointing;
  mo.offload_checkpoints = cfg.offload_checkpoints;
  mo.mlp_tile_tokens = cfg.mlp_tile_tokens;
  mo.loss_chunk_tokens = cfg.loss_chunk_tokens;
  mo.z_loss = cfg.z_loss;
  mo.dropout_seed = cfg.seed;
  return mo;
}

std::pair<CastSite, CastSite> planned_cast_sites(const RunConfig& cfg, const MachineProfile& m) {
  const CastSite g = cfg.offload.cast_grads == CastSite::Auto ? m.cast_grads : cfg.offload.cast_grads;
  const CastSite w = cfg.offload.cast_weights == CastSite::Auto ? m.cast_weights : cfg.offload.cast_weights;
  SO_CHECK(g != CastSite::Auto && w != CastSite::Auto, "plan: where the offload pipeline casts on ", m.name,
           " is not known (measure it first, or set zero_optimization.offload_optimizer.cast_grads/cast_weights)");
  return {g, w};
}

int grad_ring_depth(const RunConfig& cfg, int world, const MachineProfile& m) {
  constexpr int kMin = 2, kMax = 4;
  if (cfg.offload.mode == OffloadMode::None || m.d2h_gbs <= 0 || m.tflops <= 0) return kMin;
  const int64_t dp = dp_size_of(cfg, world);
  const BatchSizes batch = resolve_batch_sizes(cfg, dp);
  const ParamLayout layout = ParamLayout::for_model(cfg.model);
  const std::vector<Bucket> buckets = make_buckets(layout, cfg.bucket_size);
  const size_t first_dev = first_device_bucket(buckets, cfg.offload);
  double offloaded = 0;
  for (size_t b = 0; b < first_dev; ++b) offloaded += static_cast<double>(buckets[b].size());
  const int stage = world > 1 ? cfg.zero_stage : 3;
  if (stage >= 1) offloaded /= world;  // this rank's shards
  const bool bf16_link =
      cfg.dtype == DType::BF16 &&
      (cfg.offload.cast_grads == CastSite::Auto ? m.cast_grads : cfg.offload.cast_grads) == CastSite::Host;
  const double copy_s = offloaded * (bf16_link ? 2 : 4) / (m.d2h_gbs * 1e9);
  const double tokens = static_cast<double>(batch.micro * cfg.data.seq_len / cfg.sequence_parallel_size);
  // Backward is two thirds of a step's FLOPs.
  const double backward_s =
      2.0 / 3.0 * train_flops_per_token(cfg.model, cfg.data.seq_len) * tokens / (0.5 * m.tflops * 1e12);
  const double ratio = copy_s / std::max(backward_s, 1e-12);
  return static_cast<int>(std::clamp(1.0 + std::ceil(ratio), double{kMin}, double{kMax}));
}

MemoryPlan plan_memory(const RunConfig& cfg, int world, int rank, const MachineProfile& m, bool async_saves) {
  SO_CHECK(!cfg.offload_checkpoints_auto && !cfg.mlp_tile_auto, "plan: auto values are not resolved");
  MemoryPlan plan;
  plan.world = world, plan.rank = rank;
  plan.sp = cfg.sequence_parallel_size;
  plan.dp = static_cast<int>(dp_size_of(cfg, world));
  SO_CHECK(cfg.data.seq_len % plan.sp == 0, "data.seq_len (", cfg.data.seq_len,
           ") is not divisible by sequence_parallel_size (", plan.sp, ")");
  const BatchSizes batch = resolve_batch_sizes(cfg, plan.dp);
  const ModelOptions mo = model_options(cfg, batch.micro, plan.sp);
  plan.seq_len = cfg.data.seq_len, plan.micro_batch = batch.micro;
  plan.mlp_tile = DecoderModel::mlp_tile(mo);
  plan.offload_checkpoints = cfg.offload_checkpoints;
  const size_t a = m.alignment;

  // The model's buffers, grouped by what they are.
  std::map<ActivationTerm, std::pair<size_t, int>> groups;
  for (const ActivationBuffer& b : DecoderModel::activation_buffers(cfg.model, mo, plan.sp)) {
    auto& g = groups[b.term];
    g.first += round_up(b.bytes, a);
    ++g.second;
  }
  for (const auto& [term, g] : groups)
    plan.device.push_back({activation_term_name(term), g.first, str_cat(g.second, " buffers")});

  // The engine's state (Engine::Engine), as this rank holds it.
  const ParamLayout layout = ParamLayout::for_model(cfg.model);
  const std::vector<Bucket> buckets = make_buckets(layout, cfg.bucket_size);
  const int stage = world > 1 ? cfg.zero_stage : 3;
  const ShardLayout shards = make_shard_layout(buckets, stage >= 1 ? world : 1, stage >= 1 ? rank : 0);
  const OffloadConfig& off = cfg.offload;
  const bool offload = off.mode != OffloadMode::None;
  const size_t first_dev = offload ? first_device_bucket(buckets, off) : 0;
  const int64_t dev_end = first_dev > 0 ? shards.buckets[first_dev - 1].shard_begin : shards.total;
  const size_t esz = dtype_size(cfg.dtype);
  const size_t n = static_cast<size_t>(shards.total), nd = static_cast<size_t>(dev_end);
  const char* shard_note = shards.sharded() ? "this rank's ZeRO shard" : "whole model";
  plan.host_params = static_cast<int64_t>(n - nd);
  plan.device.push_back({"weights", round_up(n * esz, a), str_cat(n, " x ", dtype_name(cfg.dtype), ", ", shard_note)});
  plan.device.push_back({"gradients of the device-stepped buckets", round_up(nd * esz, a),
                         str_cat(nd, " x ", dtype_name(cfg.dtype), nd < n ? " (offloaded buckets' go to the host)" : "",
                                 ", ", shard_note)});
  const std::vector<GradRingUse> uses = grad_ring_uses(layout, buckets, shards, first_dev, stage, esz, a);
  plan.grad_ring_depth = grad_ring_depth(cfg, world, m);
  const GradRing ring = plan_grad_ring(uses, plan.grad_ring_depth);
  if (ring.bytes > 0)
    plan.device.push_back(
        {"gradients of offloaded buckets in flight (ring)", ring.bytes,
         str_cat(uses.size(), " buckets through it, depth ", plan.grad_ring_depth, ": each from its ",
                 shards.sharded() ? "reduce-scatter" : "first gradient", " to its copy to the host")});
  plan.device.push_back({"optimizer state on the device (fp32 master, exp_avg, exp_avg_sq)", 3 * round_up(nd * 4, a),
                         str_cat(nd, " elements x 12 bytes")});
  plan.device.push_back(
      {"bucket gradient norms", round_up(buckets.size() * 4, a), str_cat(buckets.size(), " buckets")});
  if (!offload)
    plan.device.push_back({"step validation", round_up(Engine::device_validation_bytes(world), a),
                           "norm, skip flag and clip coefficient, decided on the device"});
  if (off.mode == OffloadMode::SuperOffload && off.rollback == RollbackMode::Exact && nd > 0)
    plan.device.push_back({"exact-rollback snapshot (device buckets)", round_up(3 * nd * 4, a), ""});
  const bool sharded = shards.sharded();
  size_t whole = 0;
  for (size_t b = 0; b < buckets.size(); ++b) whole += round_up(static_cast<size_t>(shards.padded_size(b)) * esz, a);
  if (sharded && stage <= 2)
    plan.device.push_back({"gathered weights (ZeRO stage 1-2 keep the whole model)", whole, ""});
  if (sharded && stage == 1) plan.device.push_back({"full gradients (ZeRO stage 1 keeps them)", whole, ""});
  // Cast staging (OffloadOptimizer): one fp32 chunk per direction cast on the device.
  int64_t largest = 0;
  for (size_t b = 0; b < first_dev; ++b) largest = std::max(largest, shards.buckets[b].shard_size);
  if (offload && first_dev > 0 && cfg.dtype != DType::F32) {
    std::tie(plan.cast_grads, plan.cast_weights) = planned_cast_sites(cfg, m);
    const size_t chunk = round_up(static_cast<size_t>(OffloadOptimizer::cast_stage_elements(largest)) * 4, a);
    const std::string machine = m.name.substr(0, m.name.find(':'));
    for (const auto& [site, configured, what] : {std::tuple{plan.cast_grads, off.cast_grads, "gradients"},
                                                 std::tuple{plan.cast_weights, off.cast_weights, "weights"}})
      if (site == CastSite::Device)
        plan.device.push_back(
            {str_cat("fp32 cast staging (", what, ")"), chunk,
             str_cat("cast on the device (", configured == CastSite::Auto ? machine : "configured", "), in chunks of ",
                     OffloadOptimizer::cast_stage_elements(largest), " elements")});
  }
  // Buffers that come and go beside those: ZeRO's buckets in flight and CUDA's attention workspace
  // during the step; before it, the engine's link/cast probe, when only the model's buffers exist.
  size_t zero = 0, cuda_ws = 0;
  if (sharded && stage >= 2) {
    const size_t every_micro = !uses.empty() && batch.accumulation > 1 ? first_dev : 0;
    zero = ZeroReplay(layout, buckets, shards, stage, esz, a, every_micro)
               .peak(static_cast<int>(batch.accumulation), cfg.activation_checkpointing);
  }
  if (m.cuda) {
    const DecoderModel::AttentionShape at = DecoderModel::attention_shape(cfg.model, mo, plan.sp);
    size_t bytes = static_cast<size_t>(at.B * at.Hq * at.S) * 4;  // the flash backward's fp32 rowsum(dout * out)
    if (m.backend) {
      bytes = DecoderModel::attention_workspace_bytes(m.backend->ops(), cfg.model, mo, plan.sp);
    } else if (cfg.dtype == DType::BF16) {
      // Another machine, bf16: cuDNN's backward (the frontend's sizes) accumulates dQ in fp32 and
      // keeps a row sum, B x Hq x S x (D + 1) fp32 — with atomics, and deterministic on Hopper from
      // cuDNN 9.25 (ordered dQ). That machine's cuDNN may be older: deterministic then holds dP,
      // B x Hq x ceil64(S)^2 bf16, which the backend takes only within kDeterministicAttentionShare
      // of the device (cuda_ops.cpp, else our kernels' row sum).
      bytes = static_cast<size_t>(at.B * at.Hq * at.S) * static_cast<size_t>(at.D + 1) * 4;
      const size_t s64 = static_cast<size_t>((at.S + 63) / 64 * 64);
      const size_t det = static_cast<size_t>(at.B * at.Hq) * s64 * s64 * 2;
      if (m.deterministic_attention && (m.device_bytes == 0 || det <= m.device_bytes / kDeterministicAttentionShare))
        bytes = std::max(bytes, det);
    }
    cuda_ws = round_up(bytes, a);
  }
  if (zero)
    plan.device.push_back({"ZeRO buckets in flight (gathered weights + full gradients)", zero,
                           str_cat("most at once, replaying stage ", stage, "'s schedule")});
  if (cuda_ws)
    plan.device.push_back({"CUDA attention workspace", cuda_ws,
                           m.backend ? "one, kept by the compute stream from the first step"
                                     : "estimated for another machine (cuDNN sizes it there)"});
  for (const PlanTerm& t : plan.device) plan.device_peak += t.bytes;
  if (offload && first_dev > 0) {
    const size_t pn = static_cast<size_t>(cast_probe_elements(largest));
    size_t model_buffers = 0;
    for (const auto& [term, g] : groups) model_buffers += g.first;
    const size_t at_probe = model_buffers + round_up(pn * 2, a) + round_up(pn * 4, a);
    if (at_probe > plan.device_peak) {
      plan.device.push_back({"link/cast probe at start-up (transient)", at_probe - plan.device_peak,
                             "beyond the rest: the probe beside the model's buffers, before the engine allocates"});
      plan.device_peak = at_probe;
    }
  }

  // Host: offloaded optimizer state (OptimizerHostState and the offload pipeline's landing slots)
  // and checkpoints.
  const size_t host_elems = n - nd;
  if (host_elems > 0) {
    OffloadOptimizer::Options oo;
    oo.dtype = cfg.dtype;
    oo.cast.grads = plan.cast_grads, oo.cast.weights = plan.cast_weights;
    oo.accumulate = !uses.empty() && batch.accumulation > 1;
    const bool exact = off.mode == OffloadMode::SuperOffload && off.rollback == RollbackMode::Exact;
    const bool out = cfg.dtype == DType::BF16 && plan.cast_weights == CastSite::Host;
    const size_t grad_bytes = dtype_size(OffloadOptimizer::host_grad_dtype(oo));
    const size_t per = 12 + grad_bytes + (out ? 2 : 0) + (exact ? 12 : 0);
    plan.host.push_back({"offloaded optimizer state", host_elems * per,
                         str_cat(host_elems, " elements x ", per, " bytes (fp32 p, m, v; ",
                                 dtype_name(OffloadOptimizer::host_grad_dtype(oo)), " gradients",
                                 oo.accumulate ? " summed over micro-batches" : "",
                                 out ? "; bf16 weights for the device" : "", exact ? "; rollback snapshot" : "", ")")});
    if (oo.accumulate)
      plan.host.push_back({"micro-batch gradients landing from the device",
                           OffloadOptimizer::kIncomingSlots * static_cast<size_t>(largest) *
                               dtype_size(OffloadOptimizer::link_grad_dtype(oo)),
                           str_cat(OffloadOptimizer::kIncomingSlots, " x the largest offloaded bucket")});
  }
  const size_t host_ckpt = DecoderModel::host_checkpoint_bytes(cfg.model, mo);
  if (host_ckpt)
    plan.host.push_back({"activation checkpoints (pinned)", host_ckpt,
                         str_cat(cfg.model.num_layers, " layers x ", mo.micro_batch * mo.seq_len, " tokens x ",
                                 cfg.model.hidden_size, " x ", dtype_name(cfg.dtype))});
  if (async_saves)  // Engine::reserve_snapshot_space
    plan.host.push_back({"asynchronous checkpoint copies", n * 12,
                         str_cat(n, " elements x 12 bytes (p, m, v copied aside for a save in flight)")});
  for (const PlanTerm& t : plan.host) plan.host_total += t.bytes;
  return plan;
}

std::optional<std::string> first_term_over(const MemoryPlan& plan, const MachineProfile& m) {
  if (m.device_bytes == 0) return std::nullopt;
  size_t sum = 0;
  for (const PlanTerm& t : plan.device) {
    sum += t.bytes;
    if (sum > m.device_bytes)
      return str_cat("'", t.name, "' (", mib(t.bytes), " MiB) brings rank ", plan.rank, "'s device total to ", mib(sum),
                     " MiB, over the ", mib(m.device_bytes), " MiB of ", m.name);
  }
  return std::nullopt;
}

namespace {

bool fits(const RunConfig& cfg, int world, const MachineProfile& m) {
  const MemoryPlan p = plan_memory(cfg, world, 0, m);
  return (m.device_bytes == 0 || p.device_peak <= m.device_bytes) &&
         (m.host_bytes == 0 || p.host_total <= m.host_bytes);
}

// The largest multiple of `step` in [step, hi] for which set(v) fits (fitting shrinks as v grows);
// 0 if none.
template <class Set>
int64_t largest_fitting(const RunConfig& cfg, int world, const MachineProfile& m, int64_t hi, int64_t step, Set&& set) {
  RunConfig c = cfg;
  auto ok = [&](int64_t k) {
    set(c, k * step);
    try {
      return fits(c, world, m);
    } catch (const Error&) {
      return false;
    }
  };
  int64_t good = 1, bad = hi / step + 1;
  if (!ok(good)) return 0;
  while (bad - good > 1) {
    const int64_t mid = good + (bad - good) / 2;
    (ok(mid) ? good : bad) = mid;
  }
  return good * step;
}

std::string row(const std::string& name, size_t bytes, const std::string& note) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "  %-66s %10.1f MiB  %s\n", name.c_str(), mib(bytes), note.c_str());
  return buf;
}

}  // namespace

std::string format_plan(const RunConfig& cfg, int world, const MemoryPlan& plan, const MachineProfile& m) {
  std::string out =
      str_cat("memory plan: ", cfg.model.num_parameters() / 1e6, "M parameters, ", cfg.model.num_layers, " layers, ",
              dtype_name(cfg.dtype), "; ", world, " ranks = dp ", plan.dp, " x sp ", plan.sp, ", ",
              world > 1 ? str_cat("ZeRO stage ", cfg.zero_stage) : std::string("one rank: nothing sharded"), "; ",
              plan.seq_len, " tokens per sequence (", plan.seq_len / plan.sp, " per rank) x micro-batch ",
              plan.micro_batch, "; activation checkpointing ", cfg.activation_checkpointing ? "on" : "off",
              ", checkpoints ", plan.offload_checkpoints ? "offloaded to the host" : "on the device", ", MLP tile ",
              plan.mlp_tile, " tokens", plan.mlp_tile < plan.micro_batch * plan.seq_len / plan.sp ? "" : " (untiled)",
              "; optimizer ", offload_mode_name(cfg.offload.mode),
              cfg.offload.mode != OffloadMode::None ? str_cat(" ratio ", cfg.offload.ratio) : "", "\n");
  out += str_cat("machine: ", m.name, "\n");
  out += "device, per rank (ZeRO pads every rank's shards to the same size):\n";
  for (const PlanTerm& t : plan.device) out += row(t.name, t.bytes, t.note);
  out += row("total", plan.device_peak,
             m.device_bytes ? str_cat(plan.device_peak <= m.device_bytes ? "fits in " : "does NOT fit in ",
                                      mib(m.device_bytes), " MiB")
                            : "no device limit");
  out += "host, per rank:\n";
  for (const PlanTerm& t : plan.host) out += row(t.name, t.bytes, t.note);
  out += row("total", plan.host_total,
             m.host_bytes
                 ? str_cat(plan.host_total <= m.host_bytes ? "fits in " : "does NOT fit in ", mib(m.host_bytes), " MiB")
                 : "host size not known");
  if (plan.host_params > 0)
    out += str_cat(
        "host bytes per parameter: ", static_cast<double>(plan.host_total) / static_cast<double>(plan.host_params),
        " (", plan.host_params, " parameters stepped on this rank's CPU)\n");
  if (m.device_bytes) {
    const int64_t s_max =
        largest_fitting(cfg, world, m, INT32_MAX, plan.sp, [](RunConfig& c, int64_t v) { c.data.seq_len = v; });
    const int64_t l_max = largest_fitting(cfg, world, m, 8 * cfg.model.num_layers, 1,
                                          [](RunConfig& c, int64_t v) { c.model.num_layers = v; });
    out += str_cat("largest that fits with these settings: ", s_max ? str_cat(s_max, " tokens per sequence") : "none",
                   "; ",
                   l_max ? str_cat(l_max, l_max == 8 * cfg.model.num_layers ? " or more" : "",
                                   " layers of this width at ", plan.seq_len, " tokens")
                         : "no layer count",
                   "\n");
  }
  char peak[64];
  std::snprintf(peak, sizeof peak, "device peak %.1f MiB", mib(plan.device_peak));
  return out + peak + "\n";
}

nlohmann::json plan_json(const RunConfig& cfg, int world, const MemoryPlan& plan) {
  const ModelConfig& m = cfg.model;
  const ParamLayout layout = ParamLayout::for_model(m);
  const std::vector<Bucket> buckets = make_buckets(layout, cfg.bucket_size);
  const size_t first_dev = cfg.offload.mode == OffloadMode::None ? 0 : first_device_bucket(buckets, cfg.offload);
  int64_t host_params = 0;
  for (size_t b = 0; b < first_dev; ++b) host_params += buckets[b].size();
  const BatchSizes batch = resolve_batch_sizes(cfg, plan.dp);
  nlohmann::json j;
  j["model"] = {{"layers", m.num_layers},    {"hidden", m.hidden_size},    {"intermediate", m.intermediate_size},
                {"heads", m.num_heads},      {"kv_heads", m.num_kv_heads}, {"head_dim", m.head_dim},
                {"vocab", m.vocab_size},     {"qk_norm", m.qk_norm},       {"tied", m.tie_word_embeddings},
                {"parameters", layout.total}};
  j["dtype"] = dtype_name(cfg.dtype);
  j["seq_len"] = cfg.data.seq_len;
  j["micro_batch"] = batch.micro;
  j["accumulation"] = batch.accumulation;
  j["world"] = world, j["dp"] = plan.dp, j["sp"] = plan.sp;
  j["zero_stage"] = world > 1 ? cfg.zero_stage : 3;
  j["buckets"] = buckets.size();
  j["bucket_size"] = cfg.bucket_size;
  j["offload"] = {{"mode", offload_mode_name(cfg.offload.mode)},
                  {"ratio", cfg.offload.ratio},
                  {"host_params", host_params},
                  {"device_params", layout.total - host_params},
                  {"cpu_cores_fraction", cfg.offload.cpu_cores_fraction}};
  j["grad_clip"] = cfg.grad_clip;
  j["activation_checkpointing"] = cfg.activation_checkpointing;
  j["offload_checkpoints"] = plan.offload_checkpoints;
  j["mlp_tile"] = plan.mlp_tile;
  j["flops_per_token"] = train_flops_per_token(m, cfg.data.seq_len);
  j["tokens_per_step"] = batch.global * cfg.data.seq_len;
  j["device_peak_bytes"] = plan.device_peak;
  j["host_bytes"] = plan.host_total;
  return j;
}

std::string resolve_auto_memory(RunConfig& cfg, int world, const MachineProfile& m) {
  std::string casts;
  // Gradients landing in fp32 take 4 host bytes per offloaded parameter, in bf16 2 (GraceAdam reads
  // either): where the host binds, "auto" takes the smaller even if the link measured the other faster.
  RunConfig least = cfg;  // the auto memory settings at their least host memory
  least.offload_checkpoints_auto = least.mlp_tile_auto = false;
  if (cfg.offload_checkpoints_auto) least.offload_checkpoints = false;
  if (cfg.mlp_tile_auto) least.mlp_tile_tokens = 0;
  if (cfg.offload.mode != OffloadMode::None && cfg.dtype == DType::BF16 && cfg.offload.cast_grads == CastSite::Auto &&
      m.cast_grads == CastSite::Device && m.host_bytes > 0 &&
      plan_memory(least, world, 0, m).host_total > m.host_bytes) {
    cfg.offload.cast_grads = CastSite::Host;
    casts = "gradients cast on the host (bf16 crosses the link: fp32 gradients would not fit the host memory)";
  }
  if (!cfg.offload_checkpoints_auto && !cfg.mlp_tile_auto) return casts.empty() ? "" : "memory (auto): " + casts;
  const bool want_offload = cfg.offload_checkpoints_auto, want_tile = cfg.mlp_tile_auto;
  cfg.offload_checkpoints_auto = cfg.mlp_tile_auto = false;
  if (want_offload) cfg.offload_checkpoints = false;
  if (want_tile) cfg.mlp_tile_tokens = 0;
  if (want_offload && cfg.activation_checkpointing && !fits(cfg, world, m)) cfg.offload_checkpoints = true;
  if (want_tile && !fits(cfg, world, m)) {
    // Powers of two from the largest below the rank's tokens down to 16: the first that fits.
    const int64_t tokens =
        resolve_batch_sizes(cfg, dp_size_of(cfg, world)).micro * cfg.data.seq_len / cfg.sequence_parallel_size;
    int64_t tile = 16;
    while (tile * 2 < tokens) tile *= 2;
    for (cfg.mlp_tile_tokens = tile; cfg.mlp_tile_tokens > 16 && !fits(cfg, world, m);) cfg.mlp_tile_tokens /= 2;
  }
  return str_cat("memory (auto): ", casts.empty() ? "" : casts + ", ", "activation checkpoints ",
                 cfg.offload_checkpoints ? "offloaded to the host" : "on the device", ", MLP ",
                 cfg.mlp_tile_tokens ? str_cat("in tiles of ", cfg.mlp_tile_tokens, " tokens") : "untiled");
}

}  // namespace so
