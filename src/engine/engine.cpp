#include "so/engine/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "so/core/cpu_affinity.h"
#include "so/core/error.h"
#include "so/core/random.h"
#include "so/optim/clip_decision.h"

namespace so {

namespace {

std::string unit_name(int unit, int num_units) {
  if (unit == 0) return "embedding";
  if (unit == num_units - 1) return "head";
  return str_cat("layer ", unit - 1);
}

}  // namespace

Engine::Engine(Backend& backend, const ParamLayout& layout, const EngineOptions& opts, Communicator& comm)
    : backend_(backend),
      layout_(layout),
      opts_(opts),
      comm_(comm),
      stage_(comm.size() > 1 ? opts.zero_stage : 3),
      buckets_(make_buckets(layout, opts.bucket_size)),
      shards_(make_shard_layout(buckets_, stage_ >= 1 ? comm.size() : 1, stage_ >= 1 ? comm.rank() : 0)),
      timeline_(backend, opts.trace_path, opts.rank) {
  SO_CHECK(opts.zero_stage >= 0 && opts.zero_stage <= 3, "engine: ZeRO stage ", opts.zero_stage,
           " is not 0, 1, 2 or 3");
  keep_gathered_ = shards_.sharded() && stage_ <= 2;
  keep_full_grads_ = shards_.sharded() && stage_ == 1;
  all_reduce_grads_ = comm.size() > 1 && stage_ <= 1;
  const OffloadConfig& off = opts.offload;
  const size_t nb = buckets_.size();
  first_device_bucket_ = off.mode == OffloadMode::None ? 0 : first_device_bucket(buckets_, off);
  // Device buckets' shards come first in the shard buffers, offloaded ones after them.
  device_end_ = first_device_bucket_ > 0 ? shards_.buckets[first_device_bucket_ - 1].shard_begin : shards_.total;
  // Buckets complete in the first layer's backward or later (units 1 and 0) are ready within the
  // last moments of backward: validation sums them on the device (below, end_step).
  first_device_sum_ = first_device_bucket_;
  while (first_device_sum_ > 0 && buckets_[first_device_sum_ - 1].ready_unit <= 1) --first_device_sum_;

  units_ = bucket_units(layout, buckets_);
  for (size_t b = 0; b < buckets_.size(); ++b)
    decay_runs_.push_back(decay_runs(layout, buckets_, shards_, b, opts.no_decay));

  // The link is measured before this engine allocates anything: the probe's buffers come and go
  // first (the memory planner's start-up term).
  CastPlan cast;
  if (off.mode != OffloadMode::None) {
    const SimdIsa isa = off.simd == "auto" ? default_simd_isa() : parse_simd_isa(off.simd);
    grace_ = std::make_unique<GraceAdam>(opts.optimizer_cores, isa);
    numa_node_ = opts.numa_node >= 0 ? opts.numa_node : offload_numa_node(opts.optimizer_cores);
    if (opts.cast) {
      cast = *opts.cast;
    } else {
      CastPlanRequest cr;
      cr.model_dtype = opts.dtype;
      cr.grads = off.cast_grads, cr.weights = off.cast_weights;
      for (size_t b = 0; b < first_device_bucket_; ++b)
        cr.bucket_elements = std::max(cr.bucket_elements, shards_.buckets[b].shard_size);
      cr.numa_node = numa_node_;
      cr.pin_memory = off.pin_memory;
      cast = plan_casts(backend, *grace_, cr);
    }
    cast_report_ = cast.report;
  }

  const size_t n = static_cast<size_t>(shards_.total), nd = static_cast<size_t>(device_end_);
  const size_t esz = dtype_size(opts.dtype);
  const char* suffix = shards_.sharded() ? " (shard)" : "";
  weights_ = backend.alloc(n * esz, str_cat("weights", suffix).c_str());
  grads_ = backend.alloc(nd * esz, str_cat("gradients of the device-stepped buckets", suffix).c_str());
  SO_CHECK(opts.accumulation >= 1, "engine: ", opts.accumulation, " micro-batches per step");
  const std::vector<GradRingUse> uses =
      grad_ring_uses(layout, buckets_, shards_, first_device_bucket_, stage_, esz, backend.allocation_granularity());
  ring_ = plan_grad_ring(uses, opts.grad_ring_depth);
  ring_use_.assign(nb, SIZE_MAX);
  for (size_t i = 0; i < uses.size(); ++i) ring_use_[uses[i].bucket] = i;
  if (ring_.bytes > 0) ring_buf_ = backend.alloc(ring_.bytes, "gradients of offloaded buckets in flight (ring)");
  accumulate_on_host_ = !uses.empty() && opts.accumulation > 1;
  // Summed on the host, the step's gradients exist only there.
  if (accumulate_on_host_) first_device_sum_ = first_device_bucket_;
  grads_touched_.assign(nb, 0);
  master_ = backend.alloc(nd * sizeof(float), "fp32 master weights");
  exp_avg_ = backend.alloc(nd * sizeof(float), "adam exp_avg");
  exp_avg_sq_ = backend.alloc(nd * sizeof(float), "adam exp_avg_sq");
  bucket_sums_ = backend.alloc(nb * sizeof(float), "bucket gradient norms");
  decides_on_device_ = off.mode == OffloadMode::None;
  if (decides_on_device_) {
    decision_ = backend.alloc(device_validation_bytes(comm.size()), "step validation");
    decision_host_ = HostBuffer(sizeof(ClipDecision), -1, &backend, "step validation (host copy)", 0, false);
    decision_copied_ = backend.create_event();
  }
  for (size_t b = 0; b < nb; ++b) {
    reduced_ev_.push_back(backend.create_event());
    stepped_ev_.push_back(backend.create_event());
    frozen_.push_back(std::make_unique<Frozen>());
  }
  for (size_t b = 0; b < nb; ++b) frozen_[b]->saved = saves_bucket(b);
  weights_waited_.assign(nb, 1);
  // The forward reads the buckets by their first unit (ties: the later bucket first, which holds
  // the earlier parameters of that unit in backward-order packing).
  for (size_t b = 0; b < nb; ++b) forward_order_.push_back(b);
  std::sort(forward_order_.begin(), forward_order_.end(),
            [&](size_t a, size_t b) { return units_.lo[a] != units_.lo[b] ? units_.lo[a] < units_.lo[b] : a > b; });
  if (off.mode == OffloadMode::SuperOffload && off.rollback == RollbackMode::Exact && nd > 0)
    device_snapshot_ = backend.alloc(3 * nd * sizeof(float), "exact-rollback snapshot (device buckets)");
  for (size_t b = 0; b < nb && !shards_.sharded(); ++b)
    SO_CHECK(shards_.buckets[b].shard_begin == buckets_[b].begin, "engine: unsharded layout differs from the flat one");
  if (comm.size() > 1) {
    gathered_.resize(nb);
    full_grads_.resize(nb);
    gathered_fresh_.assign(nb, 0);
    gather_used_.assign(nb, 0);
    full_grads_zeroed_.assign(nb, 0);
    for (size_t b = 0; b < nb; ++b) gathered_ev_.push_back(backend.create_event());
    comm.attach(backend);
    // Stages 1-2 keep the whole model's weights (and stage 1 its gradients) on every rank.
    for (size_t b = 0; b < nb; ++b) {
      const size_t bytes = static_cast<size_t>(shards_.padded_size(b)) * dtype_size(opts.dtype);
      if (keep_gathered_) gathered_[b] = backend.alloc(bytes, "weights (whole model: ZeRO stage 1-2)");
      if (keep_full_grads_) full_grads_[b] = backend.alloc(bytes, "gradients (whole model: ZeRO stage 1)");
    }
  }

  if (off.mode != OffloadMode::None) {
    OffloadOptimizer::Options oo;
    oo.dtype = opts.dtype;
    oo.mode = off.mode;
    oo.rollback = off.rollback;
    oo.cast = cast;
    oo.pin_memory = off.pin_memory;
    oo.numa_node = numa_node_;
    oo.accumulate = accumulate_on_host_;
    oo.change_state = [this](size_t b, int64_t iteration, const AdamArrays& a, bool unconditional_step,
                             const AdamPass& pass) {  // offloaded bucket i is engine bucket i
      change_state(b, iteration, a, unconditional_step, nullptr, pass);
    };
    oo.host_sums = first_device_sum_;
    oo.decay_runs.assign(decay_runs_.begin(), decay_runs_.begin() + static_cast<std::ptrdiff_t>(first_device_bucket_));
    for (size_t b : forward_order_)
      if (b < first_device_bucket_) oo.forward_order.push_back(b);
    // The offload pipeline works on this rank's shards: bucket ranges in shard coordinates.
    std::vector<Bucket> host;
    for (size_t b = 0; b < first_device_bucket_; ++b) {
      Bucket s = buckets_[b];
      s.begin = shards_.buckets[b].shard_begin;
      s.end = s.begin + shards_.buckets[b].shard_size;
      host.push_back(std::move(s));
    }
    offload_ = std::make_unique<OffloadOptimizer>(backend, std::move(host), device_end_, shards_.total, weights_.data(),
                                                  oo, *grace_, timeline_);
  }
}

Engine::~Engine() {
  try {
    drain_optimizer();
  } catch (...) {
  }
}

const ParamInfo& Engine::info(int id) const {
  SO_CHECK(id >= 0 && id < static_cast<int>(layout_.params.size()), "engine: parameter id ", id, " out of range");
  return layout_.params[id];
}

void* Engine::weight(int id) {
  const ParamInfo& p = info(id);
  const size_t esz = dtype_size(opts_.dtype);
  if (!shards_.sharded()) return static_cast<char*>(weights_.data()) + p.offset * esz;
  const size_t b = units_.param_bucket[id];
  SO_CHECK(gathered_[b], "engine: weights of '", p.name, "' (bucket ", b, ") read while not gathered");
  return static_cast<char*>(gathered_[b].data()) + (p.offset - buckets_[b].begin) * esz;
}

void* Engine::grad(int id) {
  const ParamInfo& p = info(id);
  const size_t esz = dtype_size(opts_.dtype);
  const size_t b = units_.param_bucket[id];
  Stream& compute = backend_.stream(StreamKind::Compute);
  if (!shards_.sharded()) {
    // Backward accumulates straight into the bucket's gradients, zeroed at its first write: an
    // offloaded bucket's in the ring once the copies of what its range held last are done, a
    // device bucket's once its last step (which read them) is done.
    char* base = ring_range(b);
    const int64_t first = base ? buckets_[b].begin : 0;
    if (!base) base = grads_.as<char>();
    if (!grads_touched_[b]) {
      if (offloaded(b))
        wait_ring_free(b, compute);
      else
        backend_.wait(compute, *stepped_ev_[b]);
      backend_.memset_zero(base + (buckets_[b].begin - first) * esz, static_cast<size_t>(buckets_[b].size()) * esz,
                           compute);
      grads_touched_[b] = 1;
    }
    return base + (p.offset - first) * esz;
  }
  // The full gradient buffer of a bucket exists from its first gradient to its reduce-scatter
  // (stages 2-3), or always (stage 1: zeroed at its first gradient of each step, once the last
  // step's all-reduce and shard copy are done with it).
  const size_t bytes = static_cast<size_t>(shards_.padded_size(b)) * esz;
  if (!full_grads_[b]) {
    settle_releases();
    full_grads_[b] = backend_.alloc(bytes, "gradient bucket (full, until reduce-scatter)");
    backend_.memset_zero(full_grads_[b].data(), bytes, compute);
  } else if (keep_full_grads_ && !full_grads_zeroed_[b]) {
    backend_.wait(compute, *reduced_ev_[b]);
    if (offloaded(b)) backend_.wait(compute, offload_->grads_copied(b));  // its shard went to the host from here
    backend_.memset_zero(full_grads_[b].data(), bytes, compute);
  }
  full_grads_zeroed_[b] = 1;
  return static_cast<char*>(full_grads_[b].data()) + (p.offset - buckets_[b].begin) * esz;
}

char* Engine::ring_range(size_t b) {
  const size_t use = ring_use_[b];
  return use == SIZE_MAX ? nullptr : ring_buf_.as<char>() + ring_.offset[use];
}

void Engine::wait_ring_free(size_t b, Stream& s) {
  for (size_t use : ring_.waits_for[ring_use_[b]]) {
    const size_t prior = ring_.bucket[use];
    backend_.wait(s, offload_->grads_copied(prior));
    if (prior >= first_device_sum_) backend_.wait(s, *reduced_ev_[prior]);  // and its sum on the device
  }
}

size_t Engine::state_bytes() const {
  size_t kept = 0;
  for (size_t b = 0; b < gathered_.size(); ++b)
    kept += (keep_gathered_ ? gathered_[b].bytes() : 0) + (keep_full_grads_ ? full_grads_[b].bytes() : 0);
  return weights_.bytes() + grads_.bytes() + ring_buf_.bytes() + master_.bytes() + exp_avg_.bytes() +
         exp_avg_sq_.bytes() + kept;
}

size_t Engine::host_state_bytes() const { return offload_ ? offload_->host_bytes() : 0; }

std::string Engine::describe() const {
  if (!offload_) return str_cat("optimizer: ", offload_mode_name(OffloadMode::None), ", ", buckets_.size(), " buckets");
  const int64_t host_params = layout_.total - device_end_;
  return str_cat(
      "optimizer: ", offload_mode_name(opts_.offload.mode), ", ", first_device_bucket_, " of ", buckets_.size(),
      " buckets (", 100.0 * host_params / layout_.total, "% of the parameters) stepped on the CPU by GraceAdam (",
      simd_isa_name(grace_->isa()), ", ", grace_->threads(), " threads on cores ",
      format_core_list(grace_->pool().cores()), grace_->pool().pinned() ? ", pinned" : ", not pinned", "), ",
      buckets_.size() - first_device_bucket_, " on the device; offloaded gradients through a ",
      ring_buf_.bytes() / (1024.0 * 1024.0), " MiB device ring (depth ", ring_.depth, ")",
      accumulate_on_host_ ? ", micro-batches summed on the host" : "", "; host state ",
      offload_->host_bytes() / (1024.0 * 1024.0), " MiB", opts_.offload.pin_memory ? " pinned" : "", "; rollback ",
      rollback_mode_name(opts_.offload.rollback),
      opts_.offload.mode == OffloadMode::SuperOffload && opts_.offload.rollback == RollbackMode::Inverse
          ? " (undoing a step leaves last-bit differences, ~1e-7 relative, in the state of a skipped step; "
            "offload_optimizer.rollback=exact undoes bitwise for 12 more host bytes per parameter)"
          : "",
      opts_.offload.mode == OffloadMode::SuperOffload
          ? (opts_.offload.speculation == Speculation::Always ? "; speculation always" : "; speculation adaptive")
          : "",
      "\n", cast_report_);
}

void Engine::drain_optimizer() {
  if (offload_) offload_->drain();
  backend_.synchronize_all();
}

void Engine::init_weights(uint64_t seed, float std) {
  std::vector<float> host;
  for (size_t id = 0; id < layout_.params.size(); ++id) {
    const ParamInfo& p = layout_.params[id];
    host.resize(static_cast<size_t>(p.numel));
    // Counter-based normals: slices are independent, so a billion-parameter model's samples are
    // drawn on every core of the process instead of one.
    const int64_t slices = std::clamp<int64_t>(p.numel >> 20, 1, std::thread::hardware_concurrency());
    std::vector<std::thread> workers;
    for (int64_t w = 0; w < slices; ++w)
      workers.emplace_back([&, w] {
        for (int64_t i = p.numel * w / slices; i < p.numel * (w + 1) / slices; ++i)
          host[i] = p.is_norm   ? 1.0f
                    : p.is_bias ? 0.0f
                                : static_cast<float>(std * random_normal(seed, id, static_cast<uint64_t>(i)));
      });
    for (std::thread& t : workers) t.join();
    load_weight(static_cast<int>(id), host);
  }
}

float* Engine::state_ptr(int64_t e, OptimState which) {
  if (on_host(e))
    return which == OptimState::Master   ? offload_->master(e)
           : which == OptimState::ExpAvg ? offload_->exp_avg(e)
                                         : offload_->exp_avg_sq(e);
  const DeviceBuffer& buf = which == OptimState::Master   ? master_
                            : which == OptimState::ExpAvg ? exp_avg_
                                                          : exp_avg_sq_;
  return buf.as<float>() + e;
}

size_t Engine::bucket_of(int id) const {
  info(id);
  return units_.param_bucket[id];
}

AdamArrays Engine::device_arrays(size_t b, bool with_snapshot) {
  const int64_t e = shards_.buckets[b].shard_begin;
  const size_t esz = dtype_size(opts_.dtype);
  AdamArrays a{master_.as<float>() + e,
               exp_avg_.as<float>() + e,
               exp_avg_sq_.as<float>() + e,
               static_cast<char*>(grads_.data()) + e * esz,
               opts_.dtype,
               static_cast<char*>(weights_.data()) + e * esz,
               opts_.dtype};
  if (with_snapshot && device_snapshot_) {
    float* snap = device_snapshot_.as<float>();
    a.snapshot_p = snap + e, a.snapshot_m = snap + device_end_ + e, a.snapshot_v = snap + 2 * device_end_ + e;
  }
  return a;
}

ParamSlice Engine::saved_slice(int id, int rank) const {
  const ParamInfo& p = info(id);
  if (!shards_.sharded()) return rank == 0 ? ParamSlice{0, p.numel} : ParamSlice{};
  const size_t b = units_.param_bucket[id];
  const std::optional<OwnedPart> part = owned_part(shards_, buckets_[b], b, p.offset, p.numel, rank);
  return part ? ParamSlice{part->src, part->n} : ParamSlice{};
}

ParamSlice Engine::owned_slice(int id) const {
  const ParamInfo& p = info(id);
  const size_t b = units_.param_bucket[id];
  const std::optional<OwnedPart> part = owned_part(shards_, buckets_[b], b, p.offset, p.numel);
  return part ? ParamSlice{part->src, part->n} : ParamSlice{};
}

void Engine::load_weight(int id, const std::vector<float>& values) {
  const ParamInfo& p = info(id);
  SO_CHECK(static_cast<int64_t>(values.size()) == p.numel, "engine: loading '", p.name, "' with ", values.size(),
           " values; it has ", p.numel);
  const ParamSlice mine = owned_slice(id);
  write_owned(id, OptimState::Master, 0, values.data() + mine.first, mine.count);
}

void Engine::write_owned(int id, OptimState which, int64_t first, const float* values, int64_t n) {
  const ParamInfo& p = info(id);
  const size_t b = units_.param_bucket[id];
  const std::optional<OwnedPart> part = owned_part(shards_, buckets_[b], b, p.offset, p.numel);
  const int64_t owned = part ? part->n : 0;
  SO_CHECK(first >= 0 && n >= 0 && first + n <= owned, "engine: writing values [", first, ", ", first + n, ") of '",
           p.name, "'; this rank owns ", owned);
  if (n == 0) return;
  drain_optimizer();
  // A load calls this for every 4 MiB piece; `values` and the staging buffer are reused after return.
  Stream& s = backend_.stream(StreamKind::Compute);
  const int64_t at = part->dst + first;
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  if (on_host(at))
    std::memcpy(state_ptr(at, which), values, bytes);
  else
    backend_.copy_h2d_sync(state_ptr(at, which), values, bytes, s);
  if (which == OptimState::Master) {
    // The device copy in model dtype, rounded on the host the way every cast rounds (fp32: the
    // values themselves; bf16 through a buffer kept between calls, so a load touches no new pages).
    const void* src = values;
    if (opts_.dtype != DType::F32) {
      write_staging_.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) write_staging_[i] = f32_to_bf16(values[i]);
      src = write_staging_.data();
    }
    backend_.copy_h2d_sync(static_cast<char*>(weights_.data()) + at * dtype_size(opts_.dtype), src,
                           static_cast<size_t>(n) * dtype_size(opts_.dtype), s);
    invalidate_gathered();
  }
}

std::vector<float> Engine::read_owned(int id, OptimState which) {
  const ParamInfo& p = info(id);
  const size_t b = units_.param_bucket[id];
  const std::optional<OwnedPart> part = owned_part(shards_, buckets_[b], b, p.offset, p.numel);
  std::vector<float> out(part ? static_cast<size_t>(part->n) : 0);
  if (!part) return out;
  drain_optimizer();
  if (on_host(part->dst)) {
    std::memcpy(out.data(), state_ptr(part->dst, which), out.size() * sizeof(float));
  } else {
    Stream& s = backend_.stream(StreamKind::Compute);
    backend_.copy_d2h(out.data(), state_ptr(part->dst, which), out.size() * sizeof(float), s);
    backend_.synchronize(s);
  }
  return out;
}

std::vector<float> Engine::read_state(int id, OptimState which) {
  const ParamInfo& p = info(id);
  const ParamSlice mine = owned_slice(id);
  const std::vector<float> part = read_owned(id, which);
  std::vector<float> out(static_cast<size_t>(p.numel), 0.0f);
  std::copy(part.begin(), part.end(), out.begin() + mine.first);
  if (!shards_.sharded()) return out;
  // Every rank contributes its part, zeros elsewhere: the sum is the whole tensor, exactly.
  std::vector<double> wide(out.begin(), out.end());
  comm_.all_reduce_sum(wide.data(), static_cast<int>(wide.size()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(wide[i]);
  return out;
}

std::vector<float> Engine::read_grad(int id) {
  SO_CHECK(!shards_.sharded(), "engine: read_grad reads the full gradients, which ZeRO stages 1-3 do not keep");
  const ParamInfo& p = info(id);
  const size_t b = units_.param_bucket[id];
  if (offloaded(b)) {  // gone from the device: the host's copy, as the optimizer read it
    drain_optimizer();
    const std::vector<float> all = offload_->read_grads(b);
    const auto at = all.begin() + (p.offset - buckets_[b].begin);
    return std::vector<float>(at, at + p.numel);
  }
  Stream& s = backend_.stream(StreamKind::Compute);
  backend_.wait(s, *reduced_ev_[b]);  // all-reduced (several ranks) and summed on the comm stream
  DeviceBuffer wide = backend_.alloc(p.numel * sizeof(float), "grad readback");
  backend_.ops().cast(s, wide.data(), DType::F32, grads_.as<char>() + p.offset * dtype_size(opts_.dtype), opts_.dtype,
                      p.numel);
  std::vector<float> out(static_cast<size_t>(p.numel));
  backend_.copy_d2h(out.data(), wide.data(), out.size() * sizeof(float), s);
  backend_.synchronize(s);
  return out;
}

// ---- checkpoint snapshots --------------------------------------------------------------------

namespace {
// A bucket's saved parts, in their order in its copy aside.
constexpr OptimState kSavedParts[] = {OptimState::Master, OptimState::ExpAvg, OptimState::ExpAvgSq};
}  // namespace

void Engine::queue_device_state(size_t b, float* out, Event& copied) {
  const int64_t begin = shards_.buckets[b].shard_begin, n = shards_.buckets[b].shard_size;
  Stream& snap = backend_.stream(StreamKind::Snapshot);
  backend_.wait(snap, *frozen_ready_);
  for (int k = 0; k < 3; ++k) backend_.copy_d2h(out + k * n, state_ptr(begin, kSavedParts[k]), n * sizeof(float), snap);
  backend_.record(copied, snap);
}

bool Engine::saves_bucket(size_t b) const {
  for (int id : buckets_[b].params)
    if (saved_slice(id, comm_.rank()).count > 0) return true;
  return false;
}

void Engine::copy_bucket_state(size_t b, float* out) {
  const int64_t begin = shards_.buckets[b].shard_begin, n = shards_.buckets[b].shard_size;
  if (on_host(begin)) {
    for (int k = 0; k < 3; ++k) std::memcpy(out + k * n, state_ptr(begin, kSavedParts[k]), n * sizeof(float));
    return;
  }
  // Nothing changes device state again until change_state's pass is issued.
  std::unique_ptr<Event> copied = backend_.create_event();
  queue_device_state(b, out, *copied);
  backend_.synchronize(*copied);
}

void Engine::reserve_snapshot_space() {
  std::call_once(snapshot_space_reserved_, [this] { allocate_snapshot_space(); });
}

// Takes no bucket lock: the copies' addresses are published by reserve_snapshot_space's call_once
// to every thread that calls it before using them (and to readers through the bucket lock of the
// thread that put the bucket aside). Locking here while change_state held a bucket's lock and
// another thread waited in call_once holding its own was the deadlock of 26c10ec.
void Engine::allocate_snapshot_space() {
  int64_t total = 0;
  bool device_state = false;
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (frozen_[b]->saved) {  // only what this rank's writer saves is ever copied aside
      total += 3 * shards_.buckets[b].shard_size;
      device_state |= !on_host(shards_.buckets[b].shard_begin);
    }
  if (total == 0) return;
  snapshot_space_ = HostBuffer(static_cast<size_t>(total) * sizeof(float), opts_.numa_node,
                               device_state ? &backend_ : nullptr, "checkpoint snapshot copies");
  float* at = snapshot_space_.as<float>();
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (frozen_[b]->saved) {
      frozen_[b]->copy = at;
      at += 3 * shards_.buckets[b].shard_size;
    }
}

void Engine::freeze_state(DeviceSnapshot device) {
  SO_CHECK(frozen_wanted_.load() == 0, "engine: a checkpoint snapshot is still being taken (", frozen_wanted_.load(),
           " buckets left)");
  // Nothing waits here: the CPU optimizer finishes the saving step's buckets beside the next
  // forward as usual, and the writer waits for each (with_frozen).
  frozen_offload_step_ = offload_ ? offload_->decided_iteration() : -1;
  if (!frozen_ready_) frozen_ready_ = backend_.create_event();
  backend_.record(*frozen_ready_, backend_.stream(StreamKind::Comm));
  if (device == DeviceSnapshot::Staged) reserve_snapshot_space();
  frozen_iteration_ = iteration_;    // before any bucket is wanted: see change_state
  for (size_t b : forward_order_) {  // staged in the order the next step changes them
    Frozen& f = *frozen_[b];
    std::lock_guard<std::mutex> lock(f.mu);
    f.wanted = true;
    f.aside = f.staged = false;
    if (device == DeviceSnapshot::Staged && f.saved && !on_host(shards_.buckets[b].shard_begin)) {
      if (!f.copied) f.copied = backend_.create_event();
      queue_device_state(b, f.copy, *f.copied);
      f.aside = f.staged = true;
    }
  }
  frozen_wanted_ = static_cast<int64_t>(frozen_.size());
}

void Engine::change_state(size_t b, int64_t iteration, AdamArrays a, bool unconditional_step, Stream* s,
                          const AdamPass& pass) {
  if (frozen_wanted_.load() == 0) return pass(a);
  // The saving step's own late changes (the CPU optimizer finalising its buckets) are part of the
  // snapshot; a bucket seen wanted here was set so after frozen_iteration_ (same lock).
  Frozen& f = *frozen_[b];
  if (!f.saved) return pass(a);  // this rank's writer saves none of it: nothing to keep
  // Never under a bucket lock: the first reservation may run here, beside other threads'
  // change_state calls holding their own buckets' locks.
  reserve_snapshot_space();
  const int64_t n = shards_.buckets[b].shard_size;
  std::unique_lock<std::mutex> lock(f.mu);                   // a writer's copy of a piece finishes first
  if (!f.wanted || iteration <= frozen_iteration_.load()) {  // nothing (more) to keep
    lock.unlock();
    return pass(a);
  }
  if (f.aside) {
    if (f.staged) {  // device state: its pass goes after the staging copy (the stream waits, not the host)
      SO_CHECK(s != nullptr, "engine: bucket ", b, " is staged device state but is changed off a stream");
      backend_.wait(*s, *f.copied);
    }
    lock.unlock();
    return pass(a);
  }
  if (!unconditional_step || a.has_snapshot() || s != nullptr) {
    copy_bucket_state(b, f.copy);
    f.aside = true;
    lock.unlock();
    return pass(a);
  }
  // The pass writes the old state aside itself; the writer reads it after the pass is done (the
  // lock is held until then).
  a.snapshot_p = f.copy, a.snapshot_m = f.copy + n, a.snapshot_v = f.copy + 2 * n;
  pass(a);
  f.aside = true;
}

void Engine::FrozenBucket::copy(OptimState part, size_t byte_offset, size_t bytes, void* dst) const {
  const int k = static_cast<int>(part);
  SO_CHECK(byte_offset + bytes <= static_cast<size_t>(n_) * sizeof(float), "engine: frozen bytes [", byte_offset, ", ",
           byte_offset + bytes, ") of a ", n_, "-value bucket");
  std::lock_guard<std::mutex> lock(frozen_->mu);  // change_state puts the bucket aside first, or after
  if (frozen_->aside) {
    if (frozen_->staged) backend_->synchronize(*frozen_->copied);
    std::memcpy(dst, reinterpret_cast<const char*>(frozen_->copy + k * n_) + byte_offset, bytes);
  } else if (host_[k] != nullptr) {
    std::memcpy(dst, host_[k] + byte_offset, bytes);
  } else {
    // Queued behind the saving step's device updates; the lock keeps later changes out.
    Stream& snap = backend_->stream(StreamKind::Snapshot);
    backend_->wait(snap, *state_ready_);
    backend_->copy_d2h(dst, device_[k] + byte_offset, bytes, snap);
    backend_->record(*copied_, snap);
    backend_->synchronize(*copied_);
  }
}

void Engine::with_frozen(size_t b, const FrozenReader& read) {
  SO_CHECK(b < frozen_.size(), "engine: with_frozen(", b, ") of ", frozen_.size(), " buckets");
  Frozen& f = *frozen_[b];
  {
    std::lock_guard<std::mutex> lock(f.mu);
    SO_CHECK(f.wanted, "engine: bucket ", b, "'s frozen state was taken already");
  }
  struct Release {  // whatever `read` does, the bucket is released
    Frozen& f;
    std::atomic<int64_t>& left;
    ~Release() {
      std::lock_guard<std::mutex> lock(f.mu);
      f.wanted = f.aside = false;
      --left;
    }
  } release{f, frozen_wanted_};
  if (!f.saved) return;  // this rank's writer saves none of it: nothing to wait for
  const int64_t begin = shards_.buckets[b].shard_begin, n = shards_.buckets[b].shard_size;
  if (offload_ && on_host(begin)) offload_->wait_final(b, frozen_offload_step_);
  FrozenBucket frozen;
  frozen.backend_ = &backend_;
  frozen.frozen_ = &f;
  frozen.state_ready_ = frozen_ready_.get();
  frozen.n_ = n;
  for (int k = 0; k < 3; ++k) {
    const char* state = reinterpret_cast<const char*>(state_ptr(begin, kSavedParts[k]));
    (on_host(begin) ? frozen.host_[k] : frozen.device_[k]) = state;
  }
  if (!on_host(begin)) frozen.copied_ = backend_.create_event();
  read(frozen);
}

// ---- the step ---------------------------------------------------------------------------------

void Engine::begin_step(double lr, int micro_batches, std::optional<std::pair<double, double>> betas) {
  begin_step([lr, betas](int64_t) { return StepHyperparameters{lr, betas}; }, micro_batches);
}

void Engine::begin_step(StepSchedule schedule, int micro_batches) {
  SO_CHECK(micro_batches > 0, "engine: a step needs at least one micro-batch, got ", micro_batches);
  SO_CHECK(micro_batches == 1 || accumulate_on_host_ || ring_buf_.bytes() == 0, "engine: ", micro_batches,
           " micro-batches in a step of an engine built for ", opts_.accumulation,
           " (EngineOptions::accumulation: offloaded gradients are summed on the host)");
  ++iteration_;
  micro_batches_ = micro_batches;
  micro_done_ = 0;
  in_backward_ = false;
  timeline_.begin_forward(iteration_);
  schedule_ = std::move(schedule);
  hyperparameters_fixed_ = false;
  // CPU steps (and SuperOffload's speculation) start during backward: they need the step's
  // hyperparameters now, and the previous step was decided on the host, so they are known.
  if (offload_) fix_step_hyperparameters();
  speculating_ = opts_.offload.mode == OffloadMode::SuperOffload &&
                 (opts_.offload.speculation == Speculation::Always || !last_step_redone_);
  speculative_steps_ += speculating_;
  if (offload_) offload_->begin_step(iteration_, spec_hp_, speculating_);
  std::fill(weights_waited_.begin(), weights_waited_.end(), 0);
  // Gradient buffers are zeroed at their first write (grad()), each after its own readers: nothing
  // here waits for the last step's device updates. The validation sums are accumulated on the comm
  // stream, behind the last step's device updates that read them.
  backend_.memset_zero(bucket_sums_.data(), (buckets_.size() - first_device_sum_) * sizeof(float),
                       backend_.stream(StreamKind::Comm));
  std::fill(full_grads_zeroed_.begin(), full_grads_zeroed_.end(), 0);
  std::fill(grads_touched_.begin(), grads_touched_.end(), 0);
}

void Engine::fix_step_hyperparameters() {
  if (hyperparameters_fixed_) return;
  resolve_step();
  const StepHyperparameters h = schedule_(steps_);
  spec_hp_ = opts_.adam;
  spec_hp_.lr = h.lr;
  if (h.betas) spec_hp_.beta1 = h.betas->first, spec_hp_.beta2 = h.betas->second;
  spec_hp_.step = steps_ + 1;
  hyperparameters_fixed_ = true;
}

void Engine::wait_stepped_weights(size_t b) {
  if (weights_waited_[b]) return;
  Stream& compute = backend_.stream(StreamKind::Compute);
  timeline_.compute_stall(str_cat("weights b", b), [&] {
    if (b < first_device_bucket_)
      offload_->wait_weights(b, compute);
    else
      backend_.wait(compute, *stepped_ev_[b]);
  });
  weights_waited_[b] = 1;
}

void Engine::gather(size_t b) {
  if (gathered_fresh_[b]) return;
  const size_t esz = dtype_size(opts_.dtype);
  const BucketShard& sh = shards_.buckets[b];
  if (!gathered_[b]) {
    settle_releases();
    gathered_[b] = backend_.alloc(static_cast<size_t>(shards_.padded_size(b)) * esz, "gathered weight bucket");
  }
  gather_used_[b] = 0;
  Stream& comm = backend_.stream(StreamKind::Comm);
  // The shard must hold the last step's weights: from the CPU (offloaded) or the device step. (That
  // step came after the last backward read of this bucket, so a kept buffer is free to overwrite.)
  if (offload_ && b < first_device_bucket_)
    offload_->wait_weights(b, comm);
  else
    backend_.wait(comm, *stepped_ev_[b]);
  timeline_.stream_span(comm, Lane::Comm, str_cat("all-gather b", b), iteration_, [&] {
    comm_.all_gather(comm, gathered_[b].data(), static_cast<char*>(weights_.data()) + sh.shard_begin * esz,
                     sh.shard_size, opts_.dtype);
  });
  backend_.record(*gathered_ev_[b], comm);
  gathered_fresh_[b] = 1;
}

void Engine::use_gathered(size_t b) {
  gather(b);
  if (gather_used_[b]) return;
  Stream& compute = backend_.stream(StreamKind::Compute);
  timeline_.compute_stall(str_cat("gather b", b), [&] { backend_.wait(compute, *gathered_ev_[b]); });
  gather_used_[b] = 1;
}

void Engine::release_gathered(size_t b) {
  if (keep_gathered_ || !gathered_[b]) return;
  release_stream_ordered(std::move(gathered_[b]), backend_.stream(StreamKind::Compute));
  gathered_fresh_[b] = 0;
}

void Engine::release_stream_ordered(DeviceBuffer buf, Stream& s) {
  backend_.release_after(std::move(buf), s);
  std::unique_ptr<Event> freed = backend_.create_event();
  backend_.record(*freed, s);
  releases_.emplace_back(hook_calls_, std::move(freed));
}

void Engine::settle_releases() {
  while (!releases_.empty() && releases_.front().first < hook_calls_) {
    backend_.synchronize(*releases_.front().second);
    releases_.pop_front();
  }
}

void Engine::invalidate_gathered() { std::fill(gathered_fresh_.begin(), gathered_fresh_.end(), 0); }

// Forward visits units 0, 1, ..., L+1 (the head runs forward and backward in one pass); backward
// L, ..., 0. A bucket is kept from the first to the last unit of the pass that reads it.
void Engine::enter_unit(int unit, bool backward) {
  if (!shards_.sharded()) {
    for (size_t b : units_.unit_buckets[unit]) wait_stepped_weights(b);
    return;
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const bool done = backward ? units_.lo[b] > unit : units_.hi[b] < unit;
    if (done) release_gathered(b);
  }
  for (size_t b : units_.unit_buckets[unit]) use_gathered(b);
  const int next = backward ? unit - 1 : unit + 1;
  if (next >= 0 && next < static_cast<int>(units_.unit_buckets.size()))
    for (size_t b : units_.unit_buckets[next]) gather(b);  // prefetch: the all-gather overlaps this unit
}

void Engine::before_unit(int unit) {
  ++hook_calls_;
  const int units = static_cast<int>(units_.unit_buckets.size());
  if (timeline_.tracing())  // labels cost a string per unit per step: only when someone reads them
    timeline_.mark_compute(str_cat(in_backward_ ? "recompute " : "forward ", unit_name(unit, units)));
  enter_unit(unit, in_backward_);
}

void Engine::before_backward(int unit) {
  ++hook_calls_;
  if (shards_.sharded()) enter_unit(unit, true);
}

void Engine::copy_span(Stream& s, const char* what, int layer, const std::function<void()>& enqueue) {
  const Lane lane = s.kind() == StreamKind::D2H ? Lane::D2H : s.kind() == StreamKind::H2D ? Lane::H2D : Lane::Compute;
  if (!timeline_.tracing()) return enqueue();
  timeline_.stream_span(s, lane, str_cat(what, " ", layer), iteration_, enqueue);
}

void Engine::after_backward(int unit) {
  ++hook_calls_;
  const int units = static_cast<int>(units_.unit_buckets.size());
  in_backward_ = unit > 0;
  if (timeline_.tracing()) timeline_.mark_compute(unit > 0 ? str_cat("backward ", unit_name(unit - 1, units)) : "");
  const bool first_micro = micro_done_ == 0, last_micro = micro_done_ == micro_batches_ - 1;
  if (unit == 0) {
    ++micro_done_;
    if (shards_.sharded())
      for (size_t b = 0; b < buckets_.size(); ++b) release_gathered(b);
  }
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (buckets_[b].ready_unit == unit && (last_micro || (offloaded(b) && accumulate_on_host_)))
      complete_bucket(b, first_micro, last_micro);
  if (unit == 0)  // the ring's buckets start again from zero in the next micro-batch
    for (size_t b = 0; b < buckets_.size(); ++b)
      if (ring_use_[b] != SIZE_MAX) grads_touched_[b] = 0;
}

char* Engine::reduced_grads(size_t b) {
  const size_t esz = dtype_size(opts_.dtype);
  if (char* ring = ring_range(b)) return ring;
  if (offloaded(b))  // stage 1: the rank's shard of the whole bucket, all-reduced in place
    return full_grads_[b].as<char>() + static_cast<size_t>(shards_.rank * shards_.buckets[b].shard_size) * esz;
  return grads_.as<char>() + shards_.buckets[b].shard_begin * esz;
}

void Engine::complete_bucket(size_t b, bool first_micro, bool last_micro) {
  Stream& compute = backend_.stream(StreamKind::Compute);
  Stream& comm = backend_.stream(StreamKind::Comm);
  const size_t esz = dtype_size(opts_.dtype);
  const BucketShard& sh = shards_.buckets[b];
  grad(buckets_[b].params.front());  // a bucket nobody wrote still reduces, and is copied (zeros)
  char* reduced = reduced_grads(b);
  Stream* producer = &compute;
  if (comm_.size() > 1) {
    std::unique_ptr<Event> ready = backend_.create_event();
    backend_.record(*ready, compute);
    backend_.wait(comm, *ready);
    if (shards_.sharded() && !keep_full_grads_ && offloaded(b)) wait_ring_free(b, comm);  // reduce-scattered into it
    // Sum over every rank: into this rank's shard (stages 2-3: reduce-scatter, then the full
    // bucket goes), or everywhere (stage 1: the device buckets' shards copied out for their
    // optimizer; stage 0: in place, every rank steps everything).
    const char* what = shards_.sharded() && !keep_full_grads_ ? "reduce-scatter b" : "all-reduce b";
    timeline_.stream_span(comm, Lane::Comm, str_cat(what, b), iteration_, [&] {
      if (!shards_.sharded()) {
        comm_.all_reduce(comm, reduced, sh.shard_size, opts_.dtype, ReduceOp::Sum);
      } else if (keep_full_grads_) {
        comm_.all_reduce(comm, full_grads_[b].data(), shards_.padded_size(b), opts_.dtype, ReduceOp::Sum);
        if (!offloaded(b))
          backend_.copy_d2d(reduced, full_grads_[b].as<char>() + shards_.rank * sh.shard_size * esz,
                            static_cast<size_t>(sh.shard_size) * esz, comm);
      } else {
        comm_.reduce_scatter(comm, reduced, full_grads_[b].data(), sh.shard_size, opts_.dtype, ReduceOp::Sum);
      }
    });
    if (shards_.sharded() && !keep_full_grads_) release_stream_ordered(std::move(full_grads_[b]), comm);
    producer = &comm;
  }
  if (b >= first_device_sum_) {
    // Beside the compute stream (so it overlaps the rest of backward where the hardware can):
    // the bucket's sum of squares for validation, and a device bucket's speculative step,
    // guarded by that sum (a bucket with non-finite gradients is never applied).
    if (producer == &compute) {
      std::unique_ptr<Event> ready = backend_.create_event();
      backend_.record(*ready, compute);
      backend_.wait(comm, *ready);
    }
    float* sum = bucket_sums_.as<float>() + (b - first_device_sum_);
    backend_.ops().sum_squares(comm, sum, reduced, sh.shard_size, opts_.dtype);
    if (!offloaded(b) && speculates_on_device(b))
      device_adam(b, AdamCall::Step, spec_hp_, 1.0f, sum, "adam (speculative, device) b");
  }
  // The copy to the host starts beside the sum (a ring range is free once both are done).
  if (offloaded(b)) offload_->grads_ready(b, *producer, reduced, first_micro, last_micro);
  if (producer == &comm || b >= first_device_sum_) backend_.record(*reduced_ev_[b], comm);
}

void Engine::device_adam(size_t b, AdamCall call, const AdamWParams& hp, float final_scale, const float* guard,
                         const char* what, const ClipDecision* decision) {
  Stream& comm = backend_.stream(StreamKind::Comm);
  // Guarded passes (speculative steps, their redo and rollback) keep or use the exact-rollback
  // snapshot; a plain step writes every element whatever the gradients.
  const bool guarded = guard != nullptr;
  change_state(b, iteration_, device_arrays(b, guarded), !guarded, &comm, [&](const AdamArrays& a) {
    timeline_.stream_span(comm, Lane::Comm, str_cat(what, b), iteration_, [&] {
      for_each_decay_run(decay_runs_[b], a, hp, [&](const AdamArrays& run, int64_t n, const AdamWParams& run_hp) {
        backend_.ops().adam(comm, call, run, n, run_hp, final_scale, guard, decision);
      });
    });
  });
}

void Engine::end_step() {
  SO_CHECK(micro_done_ == micro_batches_, "engine: end_step after ", micro_done_, " of ", micro_batches_,
           " backward passes");
  timeline_.end_backward();
  timeline_.mark_compute("optimizer (validation)");
  fix_step_hyperparameters();  // on the device path, the previous step's result is read here (long done)
  Stream& comm = backend_.stream(StreamKind::Comm);
  if (decides_on_device_) {
    // Nothing comes back to the host before the optimizer launches: the decision is made on the
    // comm stream behind the bucket sums, and each bucket's AdamW reads it there. The host
    // learns the result later (resolve_step).
    decide_on_device();
    const auto* decision = decision_.as<ClipDecision>();
    for (size_t b : forward_order_) {
      device_adam(b, AdamCall::Step, spec_hp_, 1.0f, nullptr, "adam (device) b", decision);
      backend_.record(*stepped_ev_[b], comm);
    }
    ended_[0] = ended_[1];
    ended_[1] = {iteration_, StepResult{}};
    ended_[1].result.lr = spec_hp_.lr;
    result_pending_ = true;
    invalidate_gathered();  // stages 1-2: every bucket is gathered again after its update
    return;
  }
  Stream& s = backend_.stream(StreamKind::Compute);
  const size_t nb = buckets_.size();
  const size_t first = first_device_sum_;
  for (size_t b = first; b < nb; ++b) backend_.wait(s, *reduced_ev_[b]);

  // Per-bucket sums of squares of this rank's gradients, added in bucket order so every mode
  // computes the same norm, then over ranks in rank order (clip_decision.h): the device buckets'
  // and the last offloaded ones' here (those became ready in the first layer's backward or the
  // embedding's: waiting for their copy to the host and the CPU's sum would put both on the
  // critical path; the op computes the same float), the other offloaded ones' by the CPU as their
  // gradients arrived.
  std::vector<float> sums(nb, 0.0f);
  if (nb > first) {  // computed in after_backward, beside the compute stream
    backend_.copy_d2h(sums.data() + first, bucket_sums_.data(), (nb - first) * sizeof(float), s);
    backend_.synchronize(s);
  }
  const std::vector<float> host = offload_->sums(first);
  std::copy(host.begin(), host.end(), sums.begin());
  // Each rank holds its shard of the reduced gradients: every rank's sum, each exact in its own
  // slot (the others add zeros), so all ranks add them in the same order. Stage 0 ranks hold all
  // of them already.
  const int ranks = shards_.sharded() ? comm_.size() : 1;
  std::vector<double> rank_sums(static_cast<size_t>(ranks), 0.0);
  rank_sums[shards_.sharded() ? comm_.rank() : 0] = sum_in_order(sums.data(), static_cast<int64_t>(nb));
  if (shards_.sharded()) comm_.all_reduce_sum(rank_sums.data(), ranks);
  const ClipDecision d = decide_clip(rank_sums.data(), ranks, opts_.grad_clip);
  StepResult r;
  r.grad_norm = d.grad_norm;
  r.skipped = d.skipped != 0;
  r.clip_coef = d.clip_coef;
  r.lr = spec_hp_.lr;
  ended_[0] = ended_[1];
  ended_[1].iteration = iteration_;
  offload_->finish_step(StepDecision{r.skipped, r.clip_coef});
  // The device buckets, as the offloaded ones, in the order the next forward reads them, beside
  // the compute stream (which waits per bucket before reading its weights, and zeroes the other
  // gradients meanwhile): speculated ones are left alone, redone with the clip coefficient or rolled
  // back (one pass each; a bucket whose own gradients were not finite was never stepped, and its
  // guard skips these calls too); the others are stepped now.
  for (size_t b : forward_order_) {
    if (b < first_device_bucket_) continue;
    const float* guard = bucket_sums_.as<float>() + (b - first);
    const bool speculated = speculates_on_device(b);
    if (speculated && (r.skipped || r.clip_coef != 1.0f)) {
      ++device_rollbacks_;
      device_adam(b, r.skipped ? AdamCall::Rollback : AdamCall::Redo, spec_hp_, r.clip_coef, guard,
                  r.skipped ? "rollback (device) b" : "adam (redo, device) b");
    } else if (!speculated && !r.skipped) {
      AdamWParams hp = spec_hp_;
      hp.grad_scale = r.clip_coef;
      device_adam(b, AdamCall::Step, hp, 1.0f, nullptr, "adam (device) b");
    }
    backend_.record(*stepped_ev_[b], comm);
  }
  apply_result(r);
  invalidate_gathered();  // stages 1-2: every bucket is gathered again after its update
  // ZeRO-Offload's step is synchronous, as in DeepSpeed: every bucket's weights are back on the
  // device before the next forward starts.
  if (opts_.offload.mode == OffloadMode::ZeroOffload) offload_->drain();
}

void Engine::decide_on_device() {
  Stream& comm = backend_.stream(StreamKind::Comm);
  auto* decision = decision_.as<ClipDecision>();
  auto* rank_sum = reinterpret_cast<double*>(decision + 1);
  double* rank_sums = rank_sum + 1;
  const int ranks = shards_.sharded() ? comm_.size() : 1;
  timeline_.stream_span(comm, Lane::Comm, "validation", iteration_, [&] {
    backend_.ops().sum_in_order(comm, rank_sum, bucket_sums_.as<float>(), static_cast<int64_t>(buckets_.size()));
    // The ranks' sums gathered as they are (two fp32 words per double: a gather moves bits and
    // adds nothing), then added in rank order, as the host's decision adds them.
    if (shards_.sharded()) comm_.all_gather(comm, rank_sums, rank_sum, 2, DType::F32);
    backend_.ops().clip_decision(comm, decision, shards_.sharded() ? rank_sums : rank_sum, ranks, opts_.grad_clip);
  });
  backend_.copy_d2h(decision_host_.data(), decision, sizeof(ClipDecision), comm);
  backend_.record(*decision_copied_, comm);
}

void Engine::resolve_step() {
  if (!result_pending_) return;
  backend_.synchronize(*decision_copied_);
  const ClipDecision& d = *decision_host_.as<ClipDecision>();
  StepResult r = ended_[1].result;
  r.grad_norm = d.grad_norm;
  r.skipped = d.skipped != 0;
  r.clip_coef = d.clip_coef;
  result_pending_ = false;
  apply_result(r);
}

void Engine::apply_result(StepResult r) {
  last_step_redone_ = r.skipped || r.clip_coef < 1.0f;
  if (!r.skipped) ++steps_;
  r.steps_taken = steps_;
  ended_[1].result = r;
}

StepResult Engine::step_result() { return step_result(ended_[1].iteration); }

StepResult Engine::step_result(int64_t iteration) {
  resolve_step();
  for (const EndedStep& e : ended_)
    if (e.iteration == iteration && iteration > 0) return e.result;
  throw Error(str_cat("engine: the result of step ", iteration, " is not kept (steps ", ended_[0].iteration, " and ",
                      ended_[1].iteration, " are)"));
}

void Engine::settle_weights() {
  if (shards_.sharded()) return;
  std::fill(weights_waited_.begin(), weights_waited_.end(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) wait_stepped_weights(b);
}

void Engine::finish() {
  // What the next forward would wait for counts against the last step.
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (shards_.sharded()) {
      ++hook_calls_;  // one bucket at a time: the last one's buffer goes before the next is taken
      use_gathered(b);
      release_gathered(b);
    } else {
      wait_stepped_weights(b);
    }
  }
  timeline_.close();
  drain_optimizer();
}

}  // namespace so
