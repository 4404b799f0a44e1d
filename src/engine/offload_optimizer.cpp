#include "so/engine/offload_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "so/core/clock.h"
#include "so/core/error.h"

namespace so {

namespace {
constexpr int kRingSlots = 2;  // device cast staging: one bucket in flight while the next is cast
}

OffloadOptimizer::OffloadOptimizer(Backend& backend, std::vector<Bucket> buckets, int64_t base, int64_t end,
                                   void* device_weights, void* device_grads, const Options& opts, GraceAdam& adam,
                                   StepTimeline& timeline)
    : backend_(backend), opts_(opts), adam_(adam), timeline_(timeline), base_(base), end_(end),
      device_weights_(device_weights), device_grads_(device_grads) {
  SO_CHECK(opts.mode != OffloadMode::None, "offload optimizer built for the on-device mode");
  const size_t n = static_cast<size_t>(end - base);
  const bool bf16 = opts.dtype == DType::BF16;
  host_grad_dtype_ = bf16 && opts.cast.grads == CastSite::Host ? DType::BF16 : DType::F32;
  Backend* pin = opts.pin_memory ? &backend : nullptr;
  master_ = HostBuffer(n * 4, opts.numa_node, pin, "offloaded fp32 master weights");
  exp_avg_ = HostBuffer(n * 4, opts.numa_node, pin, "offloaded adam exp_avg");
  exp_avg_sq_ = HostBuffer(n * 4, opts.numa_node, pin, "offloaded adam exp_avg_sq");
  grads_ = HostBuffer(n * dtype_size(host_grad_dtype_), opts.numa_node, pin, "offloaded gradients");
  if (bf16 && opts.cast.weights == CastSite::Host)
    weights_out_ = HostBuffer(n * 2, opts.numa_node, pin, "bf16 weights for the device");
  if (opts.rollback == RollbackMode::Exact && opts.mode == OffloadMode::SuperOffload)
    snapshot_ = HostBuffer(n * 12, opts.numa_node, nullptr, "exact-rollback snapshot");
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

size_t OffloadOptimizer::host_bytes() const {
  return master_.bytes() + exp_avg_.bytes() + exp_avg_sq_.bytes() + grads_.bytes() + weights_out_.bytes() +
         snapshot_.bytes();
}

void* OffloadOptimizer::host_grad(size_t i) const {
  return static_cast<char*>(grads_.data()) + offset(i) * dtype_size(host_grad_dtype_);
}

// ---- the worker thread ----------------------------------------------------------------------

void OffloadOptimizer::enqueue(Task t) {
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
  const int64_t n = s.bucket.size();
  const double t0 = now_seconds();
  const float sumsq = static_cast<float>(adam_.sum_squares(host_grad(i), host_grad_dtype_, n));
  timeline_.host_span(Lane::Optimizer, str_cat("norm b", i), gen, t0, now_seconds());
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
  if (!speculate || !std::isfinite(sumsq)) return;
  if (snapshot_.data()) {
    float* snap = snapshot_.as<float>() + 3 * offset(i);
    std::memcpy(snap, master(s.bucket.begin), n * 4);
    std::memcpy(snap + n, exp_avg(s.bucket.begin), n * 4);
    std::memcpy(snap + 2 * n, exp_avg_sq(s.bucket.begin), n * 4);
  }
  apply(i, hp, gen, "adam (speculative)");
  s.speculated = true;
  upload(i, gen);
}

void OffloadOptimizer::finalize(size_t i, int64_t gen, AdamWParams hp, const StepDecision& d) {
  Slot& s = slots_[i];
  if (s.decided) return;
  hp.grad_scale = d.grad_scale;
  if (s.speculated) {
    if (d.skip || d.grad_scale != 1.0f) {
      undo(i, hp, gen);
      if (!d.skip) apply(i, hp, gen, "adam (redo, clipped)");
      upload(i, gen);
    }
  } else if (!d.skip) {
    apply(i, hp, gen, "adam");
    upload(i, gen);
  }
  s.decided = true;
  publish_final(i, gen);
}

void OffloadOptimizer::apply(size_t i, const AdamWParams& hp, int64_t gen, const char* what) {
  settle_upload(i);
  const Bucket& b = slots_[i].bucket;
  const bool out = weights_out_.data() != nullptr;
  const double t0 = now_seconds();
  adam_.step(master(b.begin), exp_avg(b.begin), exp_avg_sq(b.begin), host_grad(i), host_grad_dtype_,
             out ? weights_out_.as<bf16>() + offset(i) : nullptr, DType::BF16, b.size(), hp);
  timeline_.host_span(Lane::Optimizer, str_cat(what, " b", i), gen, t0, now_seconds());
}

void OffloadOptimizer::undo(size_t i, const AdamWParams& hp_final, int64_t gen) {
  settle_upload(i);
  ++rollbacks_;
  const Bucket& b = slots_[i].bucket;
  const int64_t n = b.size();
  const double t0 = now_seconds();
  if (snapshot_.data()) {
    const float* snap = snapshot_.as<float>() + 3 * offset(i);
    std::memcpy(master(b.begin), snap, n * 4);
    std::memcpy(exp_avg(b.begin), snap + n, n * 4);
    std::memcpy(exp_avg_sq(b.begin), snap + 2 * n, n * 4);
  } else {
    AdamWParams hp = hp_final;
    hp.grad_scale = 1.0f;  // the speculative step's
    adam_.rollback(master(b.begin), exp_avg(b.begin), exp_avg_sq(b.begin), host_grad(i), host_grad_dtype_, n, hp);
  }
  if (weights_out_.data()) adam_.cast(weights_out_.as<bf16>() + offset(i), DType::BF16, master(b.begin), DType::F32, n);
  timeline_.host_span(Lane::Optimizer, str_cat("rollback b", i), gen, t0, now_seconds());
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
    if (weights_out_.data()) {
      backend_.copy_h2d(dst, weights_out_.as<bf16>() + offset(i), n * 2, h2d);
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

std::vector<float> OffloadOptimizer::sums() {
  wait_until([&] {
    for (const Slot& s : slots_)
      if (s.summed_gen != gen_) return false;
    return true;
  });
  std::vector<float> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const Slot& s : slots_) out.push_back(s.sumsq);
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
  for (size_t i = 0; i < slots_.size(); ++i) enqueue([this, i, gen, hp, d] { finalize(i, gen, hp, d); });
}

void OffloadOptimizer::wait_weights(size_t i, Stream& compute) {
  wait_until([&] { return slots_[i].final_gen >= decided_gen_; });
  backend_.wait(compute, *slots_[i].weights_on_device);
}

void OffloadOptimizer::drain() {
  wait_until([&] { return busy_ == 0; });
  for (Slot& s : slots_) {
    backend_.synchronize(*s.grads_on_host);
    backend_.synchronize(*s.weights_on_device);
  }
}

}  // namespace so
