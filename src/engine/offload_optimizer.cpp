#include "so/engine/offload_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "so/core/clock.h"
#include "so/core/error.h"
#include "so/optim/adamw.h"

namespace so {


OffloadOptimizer::OffloadOptimizer(Backend& backend, std::vector<Bucket> buckets, int64_t base, int64_t end,
                                   void* device_weights, void* device_grads, const Options& opts, GraceAdam& adam,
                                   StepTimeline& timeline)
    : backend_(backend), opts_(opts), adam_(adam), timeline_(timeline), base_(base), end_(end),
      device_weights_(device_weights), device_grads_(device_grads) {
  SO_CHECK(opts.mode != OffloadMode::None, "offload optimizer built for the on-device mode");
  const size_t n = static_cast<size_t>(end - base);
  const bool bf16 = opts.dtype == DType::BF16;
  host_grad_dtype_ = bf16 && opts.cast.grads == CastSite::Host ? DType::BF16 : DType::F32;
  OptimizerHostStateSpec hs;
  hs.elements = static_cast<int64_t>(n);
  hs.grad_dtype = host_grad_dtype_;
  hs.has_out = bf16 && opts.cast.weights == CastSite::Host;  // GraceAdam writes the bf16 weights
  hs.out_dtype = DType::BF16;
  hs.snapshot = opts.rollback == RollbackMode::Exact && opts.mode == OffloadMode::SuperOffload;
  hs.numa_node = opts.numa_node;
  hs.pin_with = opts.pin_memory ? &backend : nullptr;
  host_ = OptimizerHostState(hs);
  if (opts_.forward_order.empty())
    for (size_t i = buckets.size(); i-- > 0;) opts_.forward_order.push_back(i);
  std::vector<size_t> sorted = opts_.forward_order;
  std::sort(sorted.begin(), sorted.end());
  bool permutation = sorted.size() == buckets.size();
  for (size_t i = 0; permutation && i < sorted.size(); ++i) permutation = sorted[i] == i;
  SO_CHECK(permutation, "offload optimizer: forward_order is not a permutation of the ", buckets.size(),
           " offloaded buckets");
  SO_CHECK(opts_.decay_runs.size() == buckets.size(), "offload optimizer: weight-decay runs for ",
           opts_.decay_runs.size(), " of ", buckets.size(), " buckets");
  for (Bucket& b : buckets) {
    SO_CHECK(b.begin >= base && b.end <= end, "offloaded bucket [", b.begin, ", ", b.end, ") outside [", base, ", ",
             end, ")");
    ring_elems_ = std::max(ring_elems_, b.size());
    Slot s;
    s.bucket = std::move(b);
    s.grads_ready = backend.create_event();
    s.grads_on_host = backend.create_event();
    s.weights_on_device = backend.create_event();
    slots_.push_back(std::move(s));
  }
  if (bf16 && opts.cast.grads == CastSite::Device)
    grad_ring_ = backend.alloc(kRingSlots * ring_elems_ * 4, "fp32 gradient cast staging");
  if (bf16 && opts.cast.weights == CastSite::Device)
    weight_ring_ = backend.alloc(kRingSlots * ring_elems_ * 4, "fp32 weight cast staging");
  worker_ = std::thread([this] { run_worker(); });
}

OffloadOptimizer::~OffloadOptimizer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

size_t OffloadOptimizer::host_bytes() const { return host_.bytes(); }

void* OffloadOptimizer::host_grad(size_t i) const {
  return static_cast<char*>(host_.grads()) + offset(i) * dtype_size(host_grad_dtype_);
}

// ---- the worker thread ----------------------------------------------------------------------

void OffloadOptimizer::enqueue(Task t) {
  drained_ = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(t));
    ++busy_;
  }
  cv_.notify_one();
}

void OffloadOptimizer::run_worker() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
    if (tasks_.empty()) return;
    Task t = std::move(tasks_.front());
    tasks_.pop_front();
    const bool poisoned = error_ != nullptr;
    lock.unlock();
    if (!poisoned) {
      try {
        t();
      } catch (...) {
        lock.lock();
        if (!error_) error_ = std::current_exception();
        lock.unlock();
      }
    }
    lock.lock();
    --busy_;
    done_cv_.notify_all();
  }
}

void OffloadOptimizer::wait_until(const std::function<bool()>& ready) {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return error_ || ready(); });
  if (error_) std::rethrow_exception(error_);  // stays set: the optimizer state is unknown now
}

void OffloadOptimizer::settle_upload(size_t i) {
  Slot& s = slots_[i];
  if (!s.upload_in_flight) return;
  backend_.synchronize(*s.weights_on_device);  // the copy engine may still read this bucket's host state
  s.upload_in_flight = false;
}

void OffloadOptimizer::process(size_t i, int64_t gen, const AdamWParams& hp, bool speculate) {
  Slot& s = slots_[i];
  backend_.synchronize(*s.grads_on_host);
  const bool summed_here = i < opts_.host_sums;
  float sumsq = 0.0f;
  if (summed_here) {
    const double t0 = now_seconds();
    sumsq = static_cast<float>(adam_.sum_squares(host_grad(i), host_grad_dtype_, s.bucket.size()));
    timeline_.host_span(Lane::Optimizer, str_cat("norm b", i), gen, t0, now_seconds());
  }
  StepDecision d;
  bool known;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s.sumsq = sumsq;
    s.summed_gen = gen;
    s.speculated = false;
    s.decided = false;
    known = decided_gen_ == gen;
    d = decision_;
  }
  done_cv_.notify_all();
  if (known) return finalize(i, gen, hp, d);
  // Speculate only on a bucket whose own gradients are finite: a NaN is never applied, so a
  // rollback never has to undo one.
  if (!speculate || !summed_here || !std::isfinite(sumsq)) return;
  apply(i, hp, gen, true);
  s.speculated = true;
  upload(i, gen);
}

void OffloadOptimizer::finalize(size_t i, int64_t gen, const AdamWParams& hp, const StepDecision& d) {
  Slot& s = slots_[i];
  if (s.decided) return;
  if (s.speculated) {
    // One pass over the bucket either way: back to the old state (skip), or straight from the
    // speculative state to the clipped one (redo), writing the device copy as it goes.
    if (d.skip || d.grad_scale != 1.0f) {
      settle_upload(i);
      ++rollbacks_;
      const double t0 = now_seconds();
      change_state(i, gen, host_.arrays(offset(i), true), false, [&](const AdamArrays& a) {
        for_each_decay_run(opts_.decay_runs[i], a, hp, [&](const AdamArrays& run, int64_t n, const AdamWParams& run_hp) {
          if (d.skip)
            adam_.rollback(run, n, run_hp);
          else
            adam_.redo(run, n, run_hp, d.grad_scale);
        });
      });
      timeline_.host_span(Lane::Optimizer, str_cat(d.skip ? "rollback b" : "adam (redo, clipped) b", i), gen, t0,
                          now_seconds());
      upload(i, gen);
    }
  } else if (!d.skip) {
    AdamWParams final_hp = hp;
    final_hp.grad_scale = d.grad_scale;
    apply(i, final_hp, gen, false);
    upload(i, gen);
  }
  s.decided = true;
  publish_final(i, gen);
}

// A step of bucket i; a speculative one keeps the old state for the exact rollback in the same pass.
void OffloadOptimizer::apply(size_t i, const AdamWParams& hp, int64_t gen, bool speculative) {
  settle_upload(i);
  const double t0 = now_seconds();
  change_state(i, gen, host_.arrays(offset(i), speculative), true,
               [&](const AdamArrays& a) {
                 for_each_decay_run(opts_.decay_runs[i], a, hp, [&](const AdamArrays& run, int64_t n,
                                                                    const AdamWParams& run_hp) { adam_.step(run, n, run_hp); });
               });
  timeline_.host_span(Lane::Optimizer, str_cat(speculative ? "adam (speculative) b" : "adam b", i), gen, t0,
                      now_seconds());
}

void OffloadOptimizer::change_state(size_t i, int64_t gen, const AdamArrays& a, bool unconditional_step,
                                    const AdamPass& pass) {
  if (opts_.change_state)
    opts_.change_state(i, gen, a, unconditional_step, pass);
  else
    pass(a);
}

// New weights of bucket i to the device: bf16 made by GraceAdam, or fp32 cast on the device, or
// (fp32 models) the master weights themselves.
void OffloadOptimizer::upload(size_t i, int64_t gen) {
  Slot& s = slots_[i];
  const Bucket& b = s.bucket;
  const int64_t n = b.size();
  const size_t esz = dtype_size(opts_.dtype);
  void* dst = static_cast<char*>(device_weights_) + b.begin * esz;
  Stream& h2d = backend_.stream(StreamKind::H2D);
  timeline_.stream_span(h2d, Lane::H2D, str_cat("weights b", i), gen, [&] {
    if (host_.out()) {
      backend_.copy_h2d(dst, static_cast<bf16*>(host_.out()) + offset(i), n * 2, h2d);
    } else if (weight_ring_) {
      float* slot = weight_ring_.as<float>() + (i % kRingSlots) * ring_elems_;
      backend_.copy_h2d(slot, master(b.begin), n * 4, h2d);
      backend_.ops().cast(h2d, dst, opts_.dtype, slot, DType::F32, n);
    } else {
      backend_.copy_h2d(dst, master(b.begin), n * 4, h2d);
    }
  });
  backend_.record(*s.weights_on_device, h2d);
  s.upload_in_flight = true;
}

void OffloadOptimizer::publish_final(size_t i, int64_t gen) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    slots_[i].final_gen = gen;
  }
  done_cv_.notify_all();
}

// ---- the main thread ------------------------------------------------------------------------

void OffloadOptimizer::begin_step(int64_t iteration, const AdamWParams& hp, bool speculate) {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_) std::rethrow_exception(error_);
  SO_CHECK(iteration > gen_, "offload optimizer: iteration ", iteration, " after ", gen_);
  gen_ = iteration;
  hp_ = hp;
  hp_.grad_scale = 1.0f;
  speculate_ = speculate && opts_.mode == OffloadMode::SuperOffload;
}

void OffloadOptimizer::grads_ready(size_t i, Stream& producer) {
  Slot& s = slots_[i];
  const Bucket& b = s.bucket;
  const int64_t n = b.size();
  const size_t esz = dtype_size(opts_.dtype);
  const void* src = static_cast<const char*>(device_grads_) + b.begin * esz;
  Stream& d2h = backend_.stream(StreamKind::D2H);
  backend_.record(*s.grads_ready, producer);
  backend_.wait(d2h, *s.grads_ready);
  timeline_.stream_span(d2h, Lane::D2H, str_cat("grads b", i), gen_, [&] {
    if (host_grad_dtype_ == opts_.dtype) {
      backend_.copy_d2h(host_grad(i), src, n * esz, d2h);
    } else {  // bf16 on the device, fp32 wanted: cast there, move fp32
      float* slot = grad_ring_.as<float>() + (i % kRingSlots) * ring_elems_;
      backend_.ops().cast(d2h, slot, DType::F32, src, opts_.dtype, n);
      backend_.copy_d2h(host_grad(i), slot, n * 4, d2h);
    }
  });
  backend_.record(*s.grads_on_host, d2h);
  const int64_t gen = gen_;
  const AdamWParams hp = hp_;
  const bool speculate = speculate_;
  enqueue([this, i, gen, hp, speculate] { process(i, gen, hp, speculate); });
}

std::vector<float> OffloadOptimizer::sums(size_t count) {
  SO_CHECK(count <= std::min(slots_.size(), opts_.host_sums), "offload optimizer: sums of ", count, " of ",
           slots_.size(), " buckets (", opts_.host_sums, " summed on the host)");
  wait_until([&] {
    for (size_t i = 0; i < count; ++i)
      if (slots_[i].summed_gen != gen_) return false;
    return true;
  });
  std::vector<float> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < count; ++i) out.push_back(slots_[i].sumsq);
  return out;
}

void OffloadOptimizer::finish_step(const StepDecision& d) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    decided_gen_ = gen_;
    decision_ = d;
  }
  const int64_t gen = gen_;
  const AdamWParams hp = hp_;
  for (size_t i : opts_.forward_order) enqueue([this, i, gen, hp, d] { finalize(i, gen, hp, d); });
}

void OffloadOptimizer::wait_weights(size_t i, Stream& compute) {
  wait_until([&] { return slots_[i].final_gen >= decided_gen_; });
  backend_.wait(compute, *slots_[i].weights_on_device);
}

int64_t OffloadOptimizer::decided_iteration() {
  std::lock_guard<std::mutex> lock(mu_);
  return decided_gen_;
}

void OffloadOptimizer::wait_final(size_t i, int64_t iteration) {
  wait_until([&] { return slots_[i].final_gen >= iteration; });
}

void OffloadOptimizer::drain() {
  wait_until([&] { return busy_ == 0; });
  if (drained_) return;  // loads drain before every piece they write
  for (Slot& s : slots_) {
    backend_.synchronize(*s.grads_on_host);
    backend_.synchronize(*s.weights_on_device);
  }
  drained_ = true;
}

}  // namespace so
