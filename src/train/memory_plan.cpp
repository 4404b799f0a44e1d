#include "so/train/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>

#include "so/core/error.h"
#include "so/core/round_up.h"
#include "so/core/units.h"
#include "so/engine/bucket.h"
#include "so/engine/cast_plan.h"
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
};
constexpr size_t kGB = 1000 * 1000 * 1000;
// Datasheet capacities: GH200 with 96 GB HBM3 or 144 GB HBM3e, each with 480 GB LPDDR5X; H100 SXM
// 80 GB (80 GiB usable as cudaMemGetInfo reports it).
constexpr Profile kProfiles[] = {
    {"gh200-96", 96 * kGB, 480 * kGB, 1, "GH200 superchip, 96 GB HBM3 + 480 GB LPDDR5X"},
    {"gh200-144", 144 * kGB, 480 * kGB, 1, "GH200 superchip, 144 GB HBM3e + 480 GB LPDDR5X"},
    {"h100-80", 80 * kGiB, 0, 8, "H100 SXM 80 GB (host memory: give --plan-host-gib)"},
};

// Replays the engine's hooks for one step on a sharded run (ZeRO stages 2-3): gathered weight
// buckets (stage 3) and full gradient buckets come and go; a released buffer counts until an
// allocation of a later hook call waits for it (Engine::settle_releases). Returns the most bytes
// alive at once.
class ZeroReplay {
 public:
  ZeroReplay(const ParamLayout& layout, const std::vector<Bucket>& buckets, const ShardLayout& shards, int stage,
             size_t esz, size_t align)
      : layout_(layout), buckets_(buckets), stage_(stage), units_(bucket_units(layout, buckets)) {
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
    if (!last_micro) return;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      if (buckets_[b].ready_unit != unit) continue;
      touch_grads(b);  // a bucket nobody wrote still reduces
      grads_[b] = 0;
      release(bytes_[b]);
    }
  }

  const ParamLayout& layout_;
  const std::vector<Bucket>& buckets_;
  int stage_;
  BucketUnits units_;
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
  plan.mlp_tile = LlamaModel::mlp_tile(mo);
  plan.offload_checkpoints = cfg.offload_checkpoints;
  const size_t a = m.alignment;

  // The model's buffers, grouped by what they are.
  std::map<ActivationTerm, std::pair<size_t, int>> groups;
  for (const ActivationBuffer& b : LlamaModel::activation_buffers(cfg.model, mo, plan.sp)) {
    auto& g = groups[b.term];
    g.first += round_up(b.bytes, a);
    ++g.second;
  }
  for (const auto& [term, g] : groups) plan.device.push_back({activation_term_name(term), g.first, str_cat(g.second, " buffers")});

  // The engine's state (Engine::Engine), as this rank holds it.
  const ParamLayout layout = ParamLayout::for_model(cfg.model);
  const std::vector<Bucket> buckets = make_buckets(layout, cfg.bucket_size);
  const int stage = world > 1 ? cfg.zero_stage : 3;
  const ShardLayout shards = make_shard_layout(buckets, stage >= 1 ? world : 1, stage >= 1 ? rank : 0);
  const OffloadConfig& off = cfg.offload;
  const size_t first_dev = off.mode == OffloadMode::None ? 0 : first_device_bucket(buckets, off);
  const int64_t dev_end = first_dev > 0 ? shards.buckets[first_dev - 1].shard_begin : shards.total;
  const size_t esz = dtype_size(cfg.dtype);
  const size_t n = static_cast<size_t>(shards.total), nd = static_cast<size_t>(dev_end);
  const char* shard_note = shards.sharded() ? "this rank's ZeRO shard" : "whole model";
  plan.device.push_back({"weights", round_up(n * esz, a), str_cat(n, " x ", dtype_name(cfg.dtype), ", ", shard_note)});
  plan.device.push_back({"gradients", round_up(n * esz, a), str_cat(n, " x ", dtype_name(cfg.dtype), ", ", shard_note)});
  plan.device.push_back({"optimizer state on the device (fp32 master, exp_avg, exp_avg_sq)", 3 * round_up(nd * 4, a),
                         str_cat(nd, " elements x 12 bytes")});
  plan.device.push_back({"bucket gradient norms", round_up(buckets.size() * 4, a), str_cat(buckets.size(), " buckets")});
  if (off.mode == OffloadMode::SuperOffload && off.rollback == RollbackMode::Exact && nd > 0)
    plan.device.push_back({"exact-rollback snapshot (device buckets)", round_up(3 * nd * 4, a), ""});
  const bool sharded = shards.sharded();
  size_t whole = 0;
  for (size_t b = 0; b < buckets.size(); ++b) whole += round_up(static_cast<size_t>(shards.padded_size(b)) * esz, a);
  if (sharded && stage <= 2) plan.device.push_back({"gathered weights (ZeRO stage 1-2 keep the whole model)", whole, ""});
  if (sharded && stage == 1) plan.device.push_back({"full gradients (ZeRO stage 1 keeps them)", whole, ""});

  // What comes and goes: the cast probe at start-up, or the cast rings plus ZeRO's buckets in
  // flight plus CUDA's attention workspace — whichever is larger at its moment.
  size_t probe = 0, rings = 0, zero = 0, cuda_ws = 0;
  if (off.mode != OffloadMode::None) {
    int64_t largest = 0;
    for (size_t b = 0; b < first_dev; ++b) largest = std::max(largest, shards.buckets[b].shard_size);
    const size_t pn = static_cast<size_t>(cast_probe_elements(largest));
    probe = round_up(pn * 2, a) + round_up(pn * 4, a);
    if (cfg.dtype != DType::F32) {
      const size_t ring = round_up(OffloadOptimizer::kRingSlots * static_cast<size_t>(largest) * 4, a);
      rings = (off.cast_grads != CastSite::Host ? ring : 0) + (off.cast_weights != CastSite::Host ? ring : 0);
    }
  }
  if (sharded && stage >= 2)
    zero = ZeroReplay(layout, buckets, shards, stage, esz, a).peak(static_cast<int>(batch.accumulation),
                                                                  cfg.activation_checkpointing);
  if (m.cuda) {
    const LlamaModel::AttentionShape at = LlamaModel::attention_shape(cfg.model, mo, plan.sp);
    size_t bytes = static_cast<size_t>(at.B * at.Hq * at.S) * 4;  // the flash backward's fp32 rowsum(dout * out)
    if (m.backend) {
      bytes = LlamaModel::attention_workspace_bytes(m.backend->ops(), cfg.model, mo, plan.sp);
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
  const size_t running = rings + zero + cuda_ws;
  if (probe > running) {
    plan.device.push_back({"link/cast probe at start-up (transient)", probe, "freed before training"});
  } else {
    if (rings)
      plan.device.push_back({"fp32 cast staging rings", rings,
                             off.cast_grads == CastSite::Auto || off.cast_weights == CastSite::Auto
                                 ? "counted as if the start-up measurement picks device casts"
                                 : ""});
    if (zero)
      plan.device.push_back({"ZeRO buckets in flight (gathered weights + full gradients)", zero,
                             str_cat("most at once, replaying stage ", stage, "'s schedule")});
    if (cuda_ws)
      plan.device.push_back({"CUDA attention workspace", cuda_ws,
                             m.backend ? "one, kept by the compute stream from the first step"
                                       : "estimated for another machine (cuDNN sizes it there)"});
  }
  for (const PlanTerm& t : plan.device) plan.device_peak += t.bytes;

  // Host: offloaded optimizer state (p, m, v, gradients and bf16 weights) and checkpoints.
  const size_t host_elems = n - nd;
  if (host_elems > 0) {
    const bool exact = off.mode == OffloadMode::SuperOffload && off.rollback == RollbackMode::Exact;
    plan.host.push_back({"offloaded optimizer state", host_elems * (16 + (exact ? 12 : 0)),
                         str_cat(host_elems, " elements x ", exact ? 28 : 16, " bytes (p, m, v, gradients",
                                 exact ? ", rollback snapshot" : "", ")")});
  }
  const size_t host_ckpt = LlamaModel::host_checkpoint_bytes(cfg.model, mo);
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
  return (m.device_bytes == 0 || p.device_peak <= m.device_bytes) && (m.host_bytes == 0 || p.host_total <= m.host_bytes);
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
  std::string out = str_cat("memory plan: ", cfg.model.num_parameters() / 1e6, "M parameters, ", cfg.model.num_layers,
                            " layers, ", dtype_name(cfg.dtype), "; ", world, " ranks = dp ", plan.dp, " x sp ", plan.sp,
                            ", ", world > 1 ? str_cat("ZeRO stage ", cfg.zero_stage) : std::string("one rank: nothing sharded"), "; ", plan.seq_len, " tokens per sequence (",
                            plan.seq_len / plan.sp, " per rank) x micro-batch ", plan.micro_batch,
                            "; activation checkpointing ", cfg.activation_checkpointing ? "on" : "off",
                            ", checkpoints ", plan.offload_checkpoints ? "offloaded to the host" : "on the device",
                            ", MLP tile ", plan.mlp_tile, " tokens",
                            plan.mlp_tile < plan.micro_batch * plan.seq_len / plan.sp ? "" : " (untiled)",
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
             m.host_bytes ? str_cat(plan.host_total <= m.host_bytes ? "fits in " : "does NOT fit in ", mib(m.host_bytes),
                                    " MiB")
                          : "host size not known");
  if (m.device_bytes) {
    const int64_t s_max = largest_fitting(cfg, world, m, INT32_MAX, plan.sp,
                                          [](RunConfig& c, int64_t v) { c.data.seq_len = v; });
    const int64_t l_max = largest_fitting(cfg, world, m, 8 * cfg.model.num_layers, 1,
                                          [](RunConfig& c, int64_t v) { c.model.num_layers = v; });
    out += str_cat("largest that fits with these settings: ", s_max ? str_cat(s_max, " tokens per sequence") : "none",
                   "; ", l_max ? str_cat(l_max, l_max == 8 * cfg.model.num_layers ? " or more" : "", " layers of this width at ",
                                         plan.seq_len, " tokens")
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
  j["model"] = {{"layers", m.num_layers}, {"hidden", m.hidden_size}, {"intermediate", m.intermediate_size},
                {"heads", m.num_heads}, {"kv_heads", m.num_kv_heads}, {"head_dim", m.head_dim},
                {"vocab", m.vocab_size}, {"qk_norm", m.qk_norm}, {"tied", m.tie_word_embeddings},
                {"parameters", layout.total}};
  j["dtype"] = dtype_name(cfg.dtype);
  j["seq_len"] = cfg.data.seq_len;
  j["micro_batch"] = batch.micro;
  j["accumulation"] = batch.accumulation;
  j["world"] = world, j["dp"] = plan.dp, j["sp"] = plan.sp;
  j["zero_stage"] = world > 1 ? cfg.zero_stage : 3;
  j["buckets"] = buckets.size();
  j["bucket_size"] = cfg.bucket_size;
  j["offload"] = {{"mode", offload_mode_name(cfg.offload.mode)}, {"ratio", cfg.offload.ratio},
                  {"host_params", host_params}, {"device_params", layout.total - host_params},
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
  if (!cfg.offload_checkpoints_auto && !cfg.mlp_tile_auto) return "";
  const bool want_offload = cfg.offload_checkpoints_auto, want_tile = cfg.mlp_tile_auto;
  cfg.offload_checkpoints_auto = cfg.mlp_tile_auto = false;
  if (want_offload) cfg.offload_checkpoints = false;
  if (want_tile) cfg.mlp_tile_tokens = 0;
  if (want_offload && cfg.activation_checkpointing && !fits(cfg, world, m)) cfg.offload_checkpoints = true;
  if (want_tile && !fits(cfg, world, m)) {
    // Powers of two from the largest below the rank's tokens down to 16: the first that fits.
    const int64_t tokens = resolve_batch_sizes(cfg, dp_size_of(cfg, world)).micro * cfg.data.seq_len /
                           cfg.sequence_parallel_size;
    int64_t tile = 16;
    while (tile * 2 < tokens) tile *= 2;
    for (cfg.mlp_tile_tokens = tile; cfg.mlp_tile_tokens > 16 && !fits(cfg, world, m);) cfg.mlp_tile_tokens /= 2;
  }
  return str_cat("memory (auto): activation checkpoints ",
                 cfg.offload_checkpoints ? "offloaded to the host" : "on the device", ", MLP ",
                 cfg.mlp_tile_tokens ? str_cat("in tiles of ", cfg.mlp_tile_tokens, " tokens") : "untiled");
}

}  // namespace so
