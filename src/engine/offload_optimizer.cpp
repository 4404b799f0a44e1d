#include "so/engine/offload_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "so/core/clock.h"
#include "so/core/error.h"
#include "so/optim/adamw.h"

namespace so {

OffloadOptimizer::OffloadOptimizer(Backend& backend, std::vector<Bucket> buckets, int64_t base, int64_t end,
                                   void* device_weights, const Options& opts, GraceAdam& adam, StepTimeline& timeline)
    : backend_(backend),
      opts_(opts),
      adam_(adam),
      timeline_(timeline),
      base_(base),
      end_(end),
      device_weights_(device_weights) {
  SO_CHECK(opts.mode != OffloadMode::None, "offload optimizer built for the on-device mode");
  const size_t n = static_cast<size_t>(end - base);
  const bool bf16 = opts.dtype == DType::BF16;
  link_grad_dtype_ = link_grad_dtype(opts);
  host_grad_dtype_ = host_grad_dtype(opts);
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
  int64_t largest = 0;
  for (Bucket& b : buckets) {
    SO_CHECK(b.begin >= base && b.end <= end, "offloaded bucket [", b.begin, ", ", b.end, ") outside [", base, ", ",
             end, ")");
    largest = std::max(largest, b.size());
    Slot s;
    s.bucket = std::move(b);
    s.grads_ready = backend.create_event();
    s.grads_on_host = backend.create_event();
    s.weights_on_device = backend.create_event();
    slots_.push_back(std::move(s));
  }
  stage_elems_ = cast_stage_elements(largest);
  if (bf16 && opts.cast.grads == CastSite::Device)
    grad_stage_ = backend.alloc(static_cast<size_t>(stage_elems_) * 4, "fp32 gradient cast staging");
  if (bf16 && opts.cast.weights == CastSite::Device)
    weight_stage_ = backend.alloc(static_cast<size_t>(stage_elems_) * 4, "fp32 weight cast staging");
  if (opts.accumulate) {
    for (int k = 0; k < kIncomingSlots; ++k) {
      incoming_.emplace_back(static_cast<size_t>(largest) * dtype_size(link_grad_dtype_), opts.numa_node, hs.pin_with,
                             "micro-batch gradients from the device", stream_skew(8 + k));
      incoming_copied_.push_back(backend.create_event());
    }
    incoming_busy_.assign(kIncomingSlots, 0);
  }
  worker_ = std::thread([this] { run_worker(tasks_); });
  if (opts.accumulate) adder_ = std::thread([this] { run_worker(adds_); });
}

OffloadOptimizer::~OffloadOptimizer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
  if (adder_.joinable()) adder_.join();
}

size_t OffloadOptimizer::host_bytes() const {
  size_t total = host_.bytes();
  for (const HostBuffer& b : incoming_) total += b.bytes();
  return total;
}

void* OffloadOptimizer::host_grad(size_t i) const {
  return static_cast<char*>(host_.grads()) + offset(i) * dtype_size(host_grad_dtype_);
}

// ---- the worker thread ----------------------------------------------------------------------

void OffloadOptimizer::enqueue(Task t, std::deque<Task>& queue) {
  drained_ = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue.push_back(std::move(t));
    ++busy_;
  }
  cv_.notify_all();
}

void OffloadOptimizer::run_worker(std::deque<Task>& queue) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue.empty(); });
    if (queue.empty()) return;
    Task t = std::move(queue.front());
    queue.pop_front();
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
        for_each_decay_run(opts_.decay_runs[i], a, hp,
                           [&](const AdamArrays& run, int64_t n, const AdamWParams& run_hp) {
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
  change_state(i, gen, host_.arrays(offset(i), speculative), true, [&](const AdamArrays& a) {
    for_each_decay_run(opts_.decay_runs[i], a, hp, [&](const AdamArrays& run, int64_t n, const AdamWParams& run_hp) {
      adam_.step(run, n, run_hp);
    });
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
  void* dst = static_cast<char*>(device_weights_) + b.begin * dtype_size(opts_.dtype);
  Stream& h2d = backend_.stream(StreamKind::H2D);
  const void* out = host_.out() ? static_cast<const bf16*>(host_.out()) + offset(i) : nullptr;
  timeline_.stream_span(h2d, Lane::H2D, str_cat("weights b", i), gen,
                        [&] { copy_weights_to_device(dst, master(b.begin), out, b.size(), h2d); });
  backend_.record(*s.weights_on_device, h2d);
  s.upload_in_flight = true;
}

void OffloadOptimizer::copy_weights_to_device(void* dst, const float* master, const void* out, int64_t n, Stream& h2d) {
  const size_t esz = dtype_size(opts_.dtype);
  if (out != nullptr) {
    backend_.copy_h2d(dst, out, static_cast<size_t>(n) * esz, h2d);
  } else if (weight_stage_) {
    for (int64_t at = 0; at < n; at += stage_elems_) {
      const int64_t m = std::min(stage_elems_, n - at);
      backend_.copy_h2d(weight_stage_.data(), master + at, static_cast<size_t>(m) * 4, h2d);
      backend_.ops().cast(h2d, static_cast<char*>(dst) + at * esz, opts_.dtype, weight_stage_.data(), DType::F32, m);
    }
  } else {
    backend_.copy_h2d(dst, master, static_cast<size_t>(n) * 4, h2d);
  }
}

void OffloadOptimizer::copy_grads_to_host(void* dst, const void* src, int64_t n, Stream& d2h) {
  const size_t esz = dtype_size(opts_.dtype);
  if (link_grad_dtype_ == opts_.dtype) {
    backend_.copy_d2h(dst, src, static_cast<size_t>(n) * esz, d2h);
    return;
  }
  for (int64_t at = 0; at < n; at += stage_elems_) {  // bf16 on the device, fp32 wanted: cast there, move fp32
    const int64_t m = std::min(stage_elems_, n - at);
    backend_.ops().cast(d2h, grad_stage_.data(), DType::F32, static_cast<const char*>(src) + at * esz, opts_.dtype, m);
    backend_.copy_d2h(static_cast<float*>(dst) + at, grad_stage_.data(), static_cast<size_t>(m) * 4, d2h);
  }
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

void OffloadOptimizer::grads_ready(size_t i, Stream& producer, const void* src, bool first_micro, bool last_micro) {
  SO_CHECK(opts_.accumulate || (first_micro && last_micro),
           "offload optimizer: built for one micro-batch per step, given gradients of several");
  Slot& s = slots_[i];
  const int64_t n = s.bucket.size();
  Stream& d2h = backend_.stream(StreamKind::D2H);
  backend_.record(*s.grads_ready, producer);
  backend_.wait(d2h, *s.grads_ready);
  const int64_t gen = gen_;
  const AdamWParams hp = hp_;
  const bool speculate = speculate_;
  if (!opts_.accumulate) {
    timeline_.stream_span(d2h, Lane::D2H, str_cat("grads b", i), gen,
                          [&] { copy_grads_to_host(host_grad(i), src, n, d2h); });
    backend_.record(*s.grads_on_host, d2h);
    enqueue([this, i, gen, hp, speculate] { process(i, gen, hp, speculate); }, tasks_);
    return;
  }
  // Into a free slot (the worker's add of its last micro-batch is done), then added on the host.
  const size_t k = next_incoming_++ % incoming_.size();
  wait_until([&] { return !incoming_busy_[k]; });
  {
    std::lock_guard<std::mutex> lock(mu_);
    incoming_busy_[k] = 1;
  }
  void* slot = incoming_[k].data();
  timeline_.stream_span(d2h, Lane::D2H, str_cat("grads b", i), gen, [&] { copy_grads_to_host(slot, src, n, d2h); });
  backend_.record(*incoming_copied_[k], d2h);
  backend_.record(*s.grads_on_host, d2h);
  // Added on a thread of their own, so that a micro-batch's gradients never wait behind the
  // optimizer's steps of the last one's.
  enqueue(
      [this, i, k, slot, n, gen, hp, speculate, first_micro, last_micro] {
        backend_.synchronize(*incoming_copied_[k]);
        auto* sums = static_cast<float*>(host_grad(i));
        const double t0 = now_seconds();
        if (first_micro)
          adam_.cast(sums, DType::F32, slot, link_grad_dtype_, n);
        else
          adam_.add(sums, slot, link_grad_dtype_, n);
        timeline_.host_span(Lane::Optimizer, str_cat("accumulate b", i), gen, t0, now_seconds());
        {
          std::lock_guard<std::mutex> lock(mu_);
          incoming_busy_[k] = 0;
        }
        done_cv_.notify_all();
        if (last_micro) enqueue([this, i, gen, hp, speculate] { process(i, gen, hp, speculate); }, tasks_);
      },
      adds_);
}

std::vector<float> OffloadOptimizer::read_grads(size_t i) {
  drain();
  const int64_t n = slots_[i].bucket.size();
  std::vector<float> out(static_cast<size_t>(n));
  adam_.cast(out.data(), DType::F32, host_grad(i), host_grad_dtype_, n);
  return out;
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
  for (size_t i : opts_.forward_order) enqueue([this, i, gen, hp, d] { finalize(i, gen, hp, d); }, tasks_);
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
