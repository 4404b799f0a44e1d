#include "so/engine/engine.h"

#include <numa.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "so/core/cpu_affinity.h"
#include "so/core/error.h"
#include "so/core/random.h"

namespace so {

namespace {

std::string unit_name(int unit, int num_units) {
  if (unit == 0) return "embedding";
  if (unit == num_units - 1) return "head";
  return str_cat("layer ", unit - 1);
}

int numa_node_of(const std::vector<int>& cores) {
  if (cores.empty() || numa_available() < 0) return -1;
  return numa_node_of_cpu(cores.front());
}

}  // namespace

Engine::Engine(Backend& backend, const ParamLayout& layout, const EngineOptions& opts, Communicator& comm)
    : backend_(backend), layout_(layout), opts_(opts), comm_(comm), buckets_(make_buckets(layout, opts.bucket_size)),
      shards_(make_shard_layout(buckets_, comm.size(), comm.rank())), timeline_(backend, opts.trace_path, opts.rank) {
  const OffloadConfig& off = opts.offload;
  const size_t nb = buckets_.size();
  first_device_bucket_ = off.mode == OffloadMode::None ? 0 : first_device_bucket(buckets_, off);
  // Device buckets' shards come first in the shard buffers, offloaded ones after them.
  device_end_ = first_device_bucket_ > 0 ? shards_.buckets[first_device_bucket_ - 1].shard_begin : shards_.total;

  int units = 0;
  for (const ParamInfo& p : layout.params) units = std::max(units, p.last_unit + 1);
  unit_buckets_.resize(static_cast<size_t>(units));
  bucket_lo_.assign(nb, units);
  bucket_hi_.assign(nb, -1);
  param_bucket_.assign(layout.params.size(), 0);
  for (size_t b = 0; b < nb; ++b)
    for (int id : buckets_[b].params) {
      const ParamInfo& p = layout.params[id];
      param_bucket_[id] = b;
      bucket_lo_[b] = std::min(bucket_lo_[b], p.first_unit);
      bucket_hi_[b] = std::max(bucket_hi_[b], p.last_unit);
      for (int u : {p.first_unit, p.last_unit})
        if (std::find(unit_buckets_[u].begin(), unit_buckets_[u].end(), b) == unit_buckets_[u].end())
          unit_buckets_[u].push_back(b);
    }

  const size_t n = static_cast<size_t>(shards_.total), nd = static_cast<size_t>(device_end_);
  const char* suffix = shards_.sharded() ? " (shard)" : "";
  weights_ = backend.alloc(n * dtype_size(opts.dtype), str_cat("weights", suffix).c_str());
  grads_ = backend.alloc(n * dtype_size(opts.dtype), str_cat("gradients", suffix).c_str());
  master_ = backend.alloc(nd * sizeof(float), "fp32 master weights");
  exp_avg_ = backend.alloc(nd * sizeof(float), "adam exp_avg");
  exp_avg_sq_ = backend.alloc(nd * sizeof(float), "adam exp_avg_sq");
  bucket_sums_ = backend.alloc(nb * sizeof(float), "bucket gradient norms");
  for (size_t b = 0; b < nb && !shards_.sharded(); ++b)
    SO_CHECK(shards_.buckets[b].shard_begin == buckets_[b].begin, "engine: unsharded layout differs from the flat one");
  if (shards_.sharded()) {
    gathered_.resize(nb);
    full_grads_.resize(nb);
    gather_used_.assign(nb, 0);
    for (size_t b = 0; b < nb; ++b) {
      gathered_ev_.push_back(backend.create_event());
      reduced_ev_.push_back(backend.create_event());
    }
    device_step_done_ = backend.create_event();
    comm.attach(backend);
  }

  if (off.mode != OffloadMode::None) {
    const SimdIsa isa = off.simd == "auto" ? default_simd_isa() : parse_simd_isa(off.simd);
    grace_ = std::make_unique<GraceAdam>(opts.optimizer_cores, isa);
    const CastPlan cast = plan_casts(backend, *grace_, opts.dtype, off.cast_grads, off.cast_weights);
    cast_report_ = cast.report;
    OffloadOptimizer::Options oo;
    oo.dtype = opts.dtype;
    oo.mode = off.mode;
    oo.rollback = off.rollback;
    oo.cast = cast;
    oo.pin_memory = off.pin_memory;
    oo.numa_node = opts.numa_node >= 0 ? opts.numa_node : numa_node_of(opts.optimizer_cores);
    // The offload pipeline works on this rank's shards: bucket ranges in shard coordinates.
    std::vector<Bucket> host;
    for (size_t b = 0; b < first_device_bucket_; ++b) {
      Bucket s = buckets_[b];
      s.begin = shards_.buckets[b].shard_begin;
      s.end = s.begin + shards_.buckets[b].shard_size;
      host.push_back(std::move(s));
    }
    offload_ = std::make_unique<OffloadOptimizer>(backend, std::move(host), device_end_, shards_.total,
                                                  weights_.data(), grads_.data(), oo, *grace_, timeline_);
    weights_waited_.assign(first_device_bucket_, 1);
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
  const size_t b = param_bucket_[id];
  SO_CHECK(gathered_[b], "engine: weights of '", p.name, "' (bucket ", b, ") read while not gathered");
  return static_cast<char*>(gathered_[b].data()) + (p.offset - buckets_[b].begin) * esz;
}

void* Engine::grad(int id) {
  const ParamInfo& p = info(id);
  const size_t esz = dtype_size(opts_.dtype);
  if (!shards_.sharded()) return static_cast<char*>(grads_.data()) + p.offset * esz;
  // The full gradient buffer of a bucket exists from its first gradient to its reduce-scatter.
  const size_t b = param_bucket_[id];
  if (!full_grads_[b]) {
    const size_t bytes = static_cast<size_t>(shards_.padded_size(b)) * esz;
    full_grads_[b] = backend_.alloc(bytes, "gradient bucket (full, until reduce-scatter)");
    backend_.memset_zero(full_grads_[b].data(), bytes, backend_.stream(StreamKind::Compute));
  }
  return static_cast<char*>(full_grads_[b].data()) + (p.offset - buckets_[b].begin) * esz;
}

size_t Engine::state_bytes() const {
  return weights_.bytes() + grads_.bytes() + master_.bytes() + exp_avg_.bytes() + exp_avg_sq_.bytes();
}

size_t Engine::host_state_bytes() const { return offload_ ? offload_->host_bytes() : 0; }

std::string Engine::describe() const {
  if (!offload_) return str_cat("optimizer: ", offload_mode_name(OffloadMode::None), ", ", buckets_.size(), " buckets");
  const int64_t host_params = layout_.total - device_end_;
  return str_cat("optimizer: ", offload_mode_name(opts_.offload.mode), ", ", first_device_bucket_, " of ",
                 buckets_.size(), " buckets (", 100.0 * host_params / layout_.total,
                 "% of the parameters) stepped on the CPU by GraceAdam (", simd_isa_name(grace_->isa()), ", ",
                 grace_->threads(), " threads on cores ", format_core_list(grace_->pool().cores()),
                 grace_->pool().pinned() ? ", pinned" : ", not pinned", "), ", buckets_.size() - first_device_bucket_,
                 " on the device; host state ", offload_->host_bytes() / (1024.0 * 1024.0), " MiB",
                 opts_.offload.pin_memory ? " pinned" : "", "; rollback ", rollback_mode_name(opts_.offload.rollback),
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
          host[i] = p.is_norm ? 1.0f : static_cast<float>(std * random_normal(seed, id, static_cast<uint64_t>(i)));
      });
    for (std::thread& t : workers) t.join();
    load_weight(static_cast<int>(id), host);
  }
}

float* Engine::state_ptr(int64_t e, OptimState which) {
  if (on_host(e))
    return which == OptimState::Master ? offload_->master(e)
           : which == OptimState::ExpAvg ? offload_->exp_avg(e)
                                         : offload_->exp_avg_sq(e);
  const DeviceBuffer& buf = which == OptimState::Master ? master_ : which == OptimState::ExpAvg ? exp_avg_ : exp_avg_sq_;
  return buf.as<float>() + e;
}

ParamSlice Engine::owned_slice(int id) const {
  const ParamInfo& p = info(id);
  const size_t b = param_bucket_[id];
  const std::optional<OwnedPart> part = owned_part(shards_, buckets_[b], b, p.offset, p.numel);
  return part ? ParamSlice{part->src, part->n} : ParamSlice{};
}

void Engine::load_weight(int id, const std::vector<float>& values) {
  const ParamInfo& p = info(id);
  SO_CHECK(static_cast<int64_t>(values.size()) == p.numel, "engine: loading '", p.name, "' with ", values.size(),
           " values; it has ", p.numel);
  const ParamSlice mine = owned_slice(id);
  write_owned(id, OptimState::Master,
              std::vector<float>(values.begin() + mine.first, values.begin() + mine.first + mine.count));
}

void Engine::write_owned(int id, OptimState which, const std::vector<float>& values) {
  const ParamInfo& p = info(id);
  const size_t b = param_bucket_[id];
  const std::optional<OwnedPart> part = owned_part(shards_, buckets_[b], b, p.offset, p.numel);
  SO_CHECK(static_cast<int64_t>(values.size()) == (part ? part->n : 0), "engine: writing ", values.size(),
           " values of '", p.name, "'; this rank owns ", part ? part->n : 0);
  if (!part) return;
  drain_optimizer();
  Stream& s = backend_.stream(StreamKind::Compute);
  const size_t n = values.size();
  if (on_host(part->dst))
    std::memcpy(state_ptr(part->dst, which), values.data(), n * sizeof(float));
  else
    backend_.copy_h2d(state_ptr(part->dst, which), values.data(), n * sizeof(float), s);
  std::vector<char> dev;
  if (which == OptimState::Master) {
    // The device copy in model dtype, rounded on the host the way every cast rounds.
    dev.resize(n * dtype_size(opts_.dtype));
    if (opts_.dtype == DType::F32) {
      std::memcpy(dev.data(), values.data(), dev.size());
    } else {
      bf16* out = reinterpret_cast<bf16*>(dev.data());
      for (size_t i = 0; i < n; ++i) out[i] = f32_to_bf16(values[i]);
    }
    backend_.copy_h2d(static_cast<char*>(weights_.data()) + part->dst * dtype_size(opts_.dtype), dev.data(),
                      dev.size(), s);
  }
  backend_.synchronize(s);  // `values` and `dev` go away after return
}

std::vector<float> Engine::read_owned(int id, OptimState which) {
  const ParamInfo& p = info(id);
  const size_t b = param_bucket_[id];
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
  SO_CHECK(!shards_.sharded(), "engine: read_grad reads the full gradients, which ZeRO-3 never keeps");
  const ParamInfo& p = info(id);
  Stream& s = backend_.stream(StreamKind::Compute);
  DeviceBuffer wide = backend_.alloc(p.numel * sizeof(float), "grad readback");
  backend_.ops().cast(s, wide.data(), DType::F32, grad(id), opts_.dtype, p.numel);
  std::vector<float> out(static_cast<size_t>(p.numel));
  backend_.copy_d2h(out.data(), wide.data(), out.size() * sizeof(float), s);
  backend_.synchronize(s);
  return out;
}

// ---- the step ---------------------------------------------------------------------------------

void Engine::begin_step(float lr, int micro_batches) {
  SO_CHECK(micro_batches > 0, "engine: a step needs at least one micro-batch, got ", micro_batches);
  ++iteration_;
  lr_ = lr;
  micro_batches_ = micro_batches;
  micro_done_ = 0;
  in_backward_ = false;
  timeline_.begin_forward(iteration_);
  timeline_.mark_compute("zero gradients");
  Stream& compute = backend_.stream(StreamKind::Compute);
  if (offload_) {
    AdamWParams hp = opts_.adam;
    hp.lr = lr;
    hp.step = steps_ + 1;
    const bool speculate = opts_.offload.mode == OffloadMode::SuperOffload &&
                           (opts_.offload.speculation == Speculation::Always || !last_step_redone_);
    speculative_steps_ += speculate;
    offload_->begin_step(iteration_, hp, speculate);
    std::fill(weights_waited_.begin(), weights_waited_.end(), 0);
  }
  // Unsharded, backward accumulates straight into the gradient buffer: zero it once the last
  // step's copies have read it. Sharded, full gradient buckets start zeroed when first touched.
  if (!shards_.sharded()) {
    for (size_t b = 0; b < first_device_bucket_; ++b) offload_->wait_grads_copied(b, compute);
    backend_.memset_zero(grads_.data(), grads_.bytes(), compute);
  }
}

void Engine::wait_offloaded_weights(size_t b) {
  if (!offload_ || b >= first_device_bucket_ || weights_waited_[b]) return;
  Stream& compute = backend_.stream(StreamKind::Compute);
  timeline_.compute_stall(str_cat("weights b", b), [&] { offload_->wait_weights(b, compute); });
  weights_waited_[b] = 1;
}

void Engine::gather(size_t b) {
  if (gathered_[b]) return;
  const size_t esz = dtype_size(opts_.dtype);
  const BucketShard& sh = shards_.buckets[b];
  gathered_[b] = backend_.alloc(static_cast<size_t>(shards_.padded_size(b)) * esz, "gathered weight bucket");
  gather_used_[b] = 0;
  Stream& comm = backend_.stream(StreamKind::Comm);
  // The shard must hold the last step's weights: from the CPU (offloaded) or the device step.
  if (offload_ && b < first_device_bucket_)
    offload_->wait_weights(b, comm);
  else
    backend_.wait(comm, *device_step_done_);
  timeline_.stream_span(comm, Lane::Comm, str_cat("all-gather b", b), iteration_, [&] {
    comm_.all_gather(comm, gathered_[b].data(), static_cast<char*>(weights_.data()) + sh.shard_begin * esz,
                     sh.shard_size, opts_.dtype);
  });
  backend_.record(*gathered_ev_[b], comm);
}

void Engine::use_gathered(size_t b) {
  gather(b);
  if (gather_used_[b]) return;
  Stream& compute = backend_.stream(StreamKind::Compute);
  timeline_.compute_stall(str_cat("gather b", b), [&] { backend_.wait(compute, *gathered_ev_[b]); });
  gather_used_[b] = 1;
}

void Engine::release_gathered(size_t b) {
  if (gathered_[b]) backend_.release_after(std::move(gathered_[b]), backend_.stream(StreamKind::Compute));
}

// Forward visits units 0, 1, ..., L+1 (the head runs forward and backward in one pass); backward
// L, ..., 0. A bucket is kept from the first to the last unit of the pass that reads it.
void Engine::enter_unit(int unit, bool backward) {
  if (!shards_.sharded()) {
    for (size_t b : unit_buckets_[unit]) wait_offloaded_weights(b);
    return;
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const bool done = backward ? bucket_lo_[b] > unit : bucket_hi_[b] < unit;
    if (done) release_gathered(b);
  }
  for (size_t b : unit_buckets_[unit]) use_gathered(b);
  const int next = backward ? unit - 1 : unit + 1;
  if (next >= 0 && next < static_cast<int>(unit_buckets_.size()))
    for (size_t b : unit_buckets_[next]) gather(b);  // prefetch: the all-gather overlaps this unit
}

void Engine::before_unit(int unit) {
  const int units = static_cast<int>(unit_buckets_.size());
  if (timeline_.tracing())  // labels cost a string per unit per step: only when someone reads them
    timeline_.mark_compute(str_cat(in_backward_ ? "recompute " : "forward ", unit_name(unit, units)));
  enter_unit(unit, in_backward_);
}

void Engine::before_backward(int unit) {
  if (shards_.sharded()) enter_unit(unit, true);
}

void Engine::after_backward(int unit) {
  const int units = static_cast<int>(unit_buckets_.size());
  in_backward_ = unit > 0;
  if (timeline_.tracing()) timeline_.mark_compute(unit > 0 ? str_cat("backward ", unit_name(unit - 1, units)) : "");
  const bool last_micro = micro_done_ == micro_batches_ - 1;
  if (unit == 0) {
    ++micro_done_;
    if (shards_.sharded())
      for (size_t b = 0; b < buckets_.size(); ++b) release_gathered(b);
  }
  if (!last_micro) return;
  Stream& compute = backend_.stream(StreamKind::Compute);
  Stream& comm = backend_.stream(StreamKind::Comm);
  const size_t esz = dtype_size(opts_.dtype);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (buckets_[b].ready_unit != unit) continue;
    Stream* producer = &compute;
    if (shards_.sharded()) {
      // Sum over every rank into this rank's shard, then drop the full bucket.
      const BucketShard& sh = shards_.buckets[b];
      grad(buckets_[b].params.front());  // a bucket nobody wrote still reduces (zeros)
      std::unique_ptr<Event> ready = backend_.create_event();
      backend_.record(*ready, compute);
      backend_.wait(comm, *ready);
      if (offload_ && b < first_device_bucket_) offload_->wait_grads_copied(b, comm);
      timeline_.stream_span(comm, Lane::Comm, str_cat("reduce-scatter b", b), iteration_, [&] {
        comm_.reduce_scatter(comm, static_cast<char*>(grads_.data()) + sh.shard_begin * esz, full_grads_[b].data(),
                             sh.shard_size, opts_.dtype, ReduceOp::Sum);
      });
      backend_.record(*reduced_ev_[b], comm);
      backend_.release_after(std::move(full_grads_[b]), comm);
      producer = &comm;
    }
    if (offload_ && b < first_device_bucket_) offload_->grads_ready(b, *producer);
  }
}

StepResult Engine::end_step() {
  SO_CHECK(micro_done_ == micro_batches_, "engine: end_step after ", micro_done_, " of ", micro_batches_,
           " backward passes");
  timeline_.end_backward();
  timeline_.mark_compute("optimizer (validation, device buckets)");
  Stream& s = backend_.stream(StreamKind::Compute);
  Ops& ops = backend_.ops();
  const size_t esz = dtype_size(opts_.dtype);
  auto grad_at = [&](int64_t e) { return static_cast<char*>(grads_.data()) + e * esz; };
  const size_t nb = buckets_.size();
  if (shards_.sharded())
    for (size_t b = first_device_bucket_; b < nb; ++b) backend_.wait(s, *reduced_ev_[b]);

  // Per-bucket sums of squares of this rank's gradients (device buckets here, offloaded ones by
  // the CPU as their gradients arrived), added in bucket order so every mode computes the same
  // norm, then summed over ranks.
  std::vector<float> sums(nb, 0.0f);
  const size_t nd = nb - first_device_bucket_;
  if (nd > 0) {
    float* dev_sums = bucket_sums_.as<float>();
    backend_.memset_zero(dev_sums, nd * sizeof(float), s);
    for (size_t b = first_device_bucket_; b < nb; ++b)
      ops.sum_squares(s, dev_sums + (b - first_device_bucket_), grad_at(shards_.buckets[b].shard_begin),
                      shards_.buckets[b].shard_size, opts_.dtype);
    backend_.copy_d2h(sums.data() + first_device_bucket_, dev_sums, nd * sizeof(float), s);
    backend_.synchronize(s);
  }
  if (offload_) {
    const std::vector<float> host = offload_->sums();
    std::copy(host.begin(), host.end(), sums.begin());
  }
  double sumsq = 0.0;
  for (float x : sums) sumsq += x;
  comm_.all_reduce_sum(&sumsq, 1);  // global over ranks; a non-finite value anywhere stays non-finite

  StepResult r;
  r.grad_norm = std::sqrt(sumsq);
  r.skipped = !std::isfinite(r.grad_norm);
  // torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), applied only when < 1.
  if (!r.skipped && opts_.grad_clip > 0.0f)
    r.clip_coef = static_cast<float>(std::min(1.0, opts_.grad_clip / (r.grad_norm + 1e-6)));
  if (offload_) offload_->finish_step(StepDecision{r.skipped, r.clip_coef});
  last_step_redone_ = r.skipped || r.clip_coef < 1.0f;
  if (!r.skipped) {
    ++steps_;
    AdamWParams hp = opts_.adam;
    hp.lr = lr_;
    hp.step = steps_;
    hp.grad_scale = r.clip_coef;
    for (size_t b = first_device_bucket_; b < nb; ++b) {
      const int64_t e = shards_.buckets[b].shard_begin;
      ops.adamw(s, master_.as<float>() + e, exp_avg_.as<float>() + e, exp_avg_sq_.as<float>() + e, grad_at(e),
                opts_.dtype, static_cast<char*>(weights_.data()) + e * esz, opts_.dtype, shards_.buckets[b].shard_size,
                hp);
    }
  }
  if (shards_.sharded()) backend_.record(*device_step_done_, s);
  // ZeRO-Offload's step is synchronous, as in DeepSpeed: every bucket's weights are back on the
  // device before the next forward starts.
  if (opts_.offload.mode == OffloadMode::ZeroOffload) offload_->drain();
  return r;
}

void Engine::finish() {
  // What the next forward would wait for counts against the last step.
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (shards_.sharded()) {
      use_gathered(b);
      release_gathered(b);
    } else {
      wait_offloaded_weights(b);
    }
  }
  timeline_.close();
  drain_optimizer();
}

}  // namespace so
