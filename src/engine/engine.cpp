#include "so/engine/engine.h"

#include <numa.h>

#include <algorithm>
#include <cmath>
#include <cstring>

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
      timeline_(backend, opts.trace_path, opts.rank) {
  const OffloadConfig& off = opts.offload;
  first_device_bucket_ = off.mode == OffloadMode::None ? 0 : first_device_bucket(buckets_, off);
  device_end_ = first_device_bucket_ < buckets_.size() ? buckets_[first_device_bucket_].end : 0;
  const int64_t host_end = first_device_bucket_ > 0 ? buckets_.front().end : device_end_;

  int units = 0;
  for (const ParamInfo& p : layout.params) units = std::max(units, p.last_unit + 1);
  unit_buckets_.resize(static_cast<size_t>(units));
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (int id : buckets_[b].params) {
      const ParamInfo& p = layout.params[id];
      for (int u : {p.first_unit, p.last_unit})
        if (std::find(unit_buckets_[u].begin(), unit_buckets_[u].end(), b) == unit_buckets_[u].end())
          unit_buckets_[u].push_back(b);
    }

  const size_t n = static_cast<size_t>(layout.total), nd = static_cast<size_t>(device_end_);
  weights_ = backend.alloc(n * dtype_size(opts.dtype), "weights");
  grads_ = backend.alloc(n * dtype_size(opts.dtype), "gradients");
  master_ = backend.alloc(nd * sizeof(float), "fp32 master weights");
  exp_avg_ = backend.alloc(nd * sizeof(float), "adam exp_avg");
  exp_avg_sq_ = backend.alloc(nd * sizeof(float), "adam exp_avg_sq");
  bucket_sums_ = backend.alloc(buckets_.size() * sizeof(float), "bucket gradient norms");

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
    std::vector<Bucket> host(buckets_.begin(), buckets_.begin() + static_cast<ptrdiff_t>(first_device_bucket_));
    offload_ = std::make_unique<OffloadOptimizer>(backend, std::move(host), device_end_, host_end, weights_.data(),
                                                  grads_.data(), oo, *grace_, timeline_);
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
  return static_cast<char*>(weights_.data()) + info(id).offset * dtype_size(opts_.dtype);
}

void* Engine::grad(int id) { return static_cast<char*>(grads_.data()) + info(id).offset * dtype_size(opts_.dtype); }

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
    for (int64_t i = 0; i < p.numel; ++i)
      host[i] = p.is_norm ? 1.0f : static_cast<float>(std * random_normal(seed, id, static_cast<uint64_t>(i)));
    load_weight(static_cast<int>(id), host);
  }
}

void Engine::load_weight(int id, const std::vector<float>& values) {
  const ParamInfo& p = info(id);
  SO_CHECK(static_cast<int64_t>(values.size()) == p.numel, "engine: loading '", p.name, "' with ", values.size(),
           " values; it has ", p.numel);
  drain_optimizer();
  Stream& s = backend_.stream(StreamKind::Compute);
  if (on_host(p.offset))
    std::memcpy(offload_->master(p.offset), values.data(), values.size() * sizeof(float));
  else
    backend_.copy_h2d(master_.as<float>() + p.offset, values.data(), values.size() * sizeof(float), s);
  // The device copy in model dtype, rounded on the host the way every cast rounds.
  std::vector<char> dev(values.size() * dtype_size(opts_.dtype));
  if (opts_.dtype == DType::F32) {
    std::memcpy(dev.data(), values.data(), dev.size());
  } else {
    bf16* out = reinterpret_cast<bf16*>(dev.data());
    for (size_t i = 0; i < values.size(); ++i) out[i] = f32_to_bf16(values[i]);
  }
  backend_.copy_h2d(weight(id), dev.data(), dev.size(), s);
  backend_.synchronize(s);  // `values` and `dev` go away after return
}

std::vector<float> Engine::read_state(int id, OptimState which) {
  const ParamInfo& p = info(id);
  drain_optimizer();
  std::vector<float> out(static_cast<size_t>(p.numel));
  if (on_host(p.offset)) {
    const float* src = which == OptimState::Master   ? offload_->master(p.offset)
                       : which == OptimState::ExpAvg ? offload_->exp_avg(p.offset)
                                                     : offload_->exp_avg_sq(p.offset);
    std::memcpy(out.data(), src, out.size() * sizeof(float));
    return out;
  }
  const DeviceBuffer& buf = which == OptimState::Master ? master_ : which == OptimState::ExpAvg ? exp_avg_ : exp_avg_sq_;
  Stream& s = backend_.stream(StreamKind::Compute);
  backend_.copy_d2h(out.data(), buf.as<float>() + p.offset, out.size() * sizeof(float), s);
  backend_.synchronize(s);
  return out;
}

std::vector<float> Engine::read_grad(int id) {
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
    // The previous step's gradient copies must have read the gradients before they are zeroed.
    for (size_t b = 0; b < first_device_bucket_; ++b) offload_->wait_grads_copied(b, compute);
    std::fill(weights_waited_.begin(), weights_waited_.end(), 0);
  }
  backend_.memset_zero(grads_.data(), grads_.bytes(), compute);
}

void Engine::before_unit(int unit) {
  const int units = static_cast<int>(unit_buckets_.size());
  timeline_.mark_compute(str_cat(in_backward_ ? "recompute " : "forward ", unit_name(unit, units)));
  if (!offload_) return;
  Stream& compute = backend_.stream(StreamKind::Compute);
  for (size_t b : unit_buckets_[unit]) {
    if (b >= first_device_bucket_ || weights_waited_[b]) continue;
    timeline_.compute_stall(str_cat("weights b", b), [&] { offload_->wait_weights(b, compute); });
    weights_waited_[b] = 1;
  }
}

void Engine::after_backward(int unit) {
  const int units = static_cast<int>(unit_buckets_.size());
  in_backward_ = unit > 0;
  timeline_.mark_compute(unit > 0 ? str_cat("backward ", unit_name(unit - 1, units)) : "");
  const bool last_micro = micro_done_ == micro_batches_ - 1;
  if (unit == 0) ++micro_done_;
  if (!offload_ || !last_micro) return;
  for (size_t b = 0; b < first_device_bucket_; ++b)
    if (buckets_[b].ready_unit == unit) offload_->grads_ready(b);
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

  // Per-bucket sums of squares (device buckets here, offloaded ones by the CPU as their
  // gradients arrived), added in bucket order so every mode computes the same norm.
  std::vector<float> sums(buckets_.size(), 0.0f);
  const size_t nd = buckets_.size() - first_device_bucket_;
  if (nd > 0) {
    float* dev_sums = bucket_sums_.as<float>();
    backend_.memset_zero(dev_sums, nd * sizeof(float), s);
    for (size_t b = first_device_bucket_; b < buckets_.size(); ++b)
      ops.sum_squares(s, dev_sums + (b - first_device_bucket_), grad_at(buckets_[b].begin), buckets_[b].size(),
                      opts_.dtype);
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
    for (size_t b = first_device_bucket_; b < buckets_.size(); ++b) {
      const Bucket& bk = buckets_[b];
      ops.adamw(s, master_.as<float>() + bk.begin, exp_avg_.as<float>() + bk.begin, exp_avg_sq_.as<float>() + bk.begin,
                grad_at(bk.begin), opts_.dtype, static_cast<char*>(weights_.data()) + bk.begin * esz, opts_.dtype,
                bk.size(), hp);
    }
  }
  // ZeRO-Offload's step is synchronous, as in DeepSpeed: every bucket's weights are back on the
  // device before the next forward starts.
  if (opts_.offload.mode == OffloadMode::ZeroOffload) offload_->drain();
  return r;
}

void Engine::finish() {
  if (offload_) {
    Stream& compute = backend_.stream(StreamKind::Compute);
    for (size_t b = 0; b < first_device_bucket_; ++b)
      if (!weights_waited_[b]) {
        timeline_.compute_stall(str_cat("weights b", b), [&] { offload_->wait_weights(b, compute); });
        weights_waited_[b] = 1;
      }
  }
  timeline_.close();
  drain_optimizer();
}

}  // namespace so
