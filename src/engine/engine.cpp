#include "so/engine/engine.h"

#include <cmath>

#include "so/core/error.h"
#include "so/core/random.h"

namespace so {

Engine::Engine(Backend& backend, const ParamLayout& layout, const EngineOptions& opts, Communicator& comm)
    : backend_(backend), layout_(layout), opts_(opts), comm_(comm), buckets_(make_buckets(layout, opts.bucket_size)) {
  const size_t n = static_cast<size_t>(layout.total);
  weights_ = backend.alloc(n * dtype_size(opts.dtype), "weights");
  grads_ = backend.alloc(n * dtype_size(opts.dtype), "gradients");
  master_ = backend.alloc(n * sizeof(float), "fp32 master weights");
  exp_avg_ = backend.alloc(n * sizeof(float), "adam exp_avg");
  exp_avg_sq_ = backend.alloc(n * sizeof(float), "adam exp_avg_sq");
  norm_acc_ = backend.alloc(sizeof(float), "grad norm");
}

Engine::~Engine() {
  try {
    backend_.synchronize_all();
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

// Master weights changed on the host side of the API: refresh the device copy in model dtype.
void Engine::upload_master(int64_t begin, int64_t n) {
  Stream& s = backend_.stream(StreamKind::Compute);
  backend_.ops().cast(s, static_cast<char*>(weights_.data()) + begin * dtype_size(opts_.dtype), opts_.dtype,
                      master_.as<float>() + begin, DType::F32, n);
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
  Stream& s = backend_.stream(StreamKind::Compute);
  backend_.copy_h2d(master_.as<float>() + p.offset, values.data(), values.size() * sizeof(float), s);
  upload_master(p.offset, p.numel);
  backend_.synchronize(s);  // `values` may go away after return
}

std::vector<float> Engine::read_weight(int id) {
  const ParamInfo& p = info(id);
  std::vector<float> out(static_cast<size_t>(p.numel));
  Stream& s = backend_.stream(StreamKind::Compute);
  backend_.copy_d2h(out.data(), master_.as<float>() + p.offset, out.size() * sizeof(float), s);
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

void Engine::zero_grads() { backend_.memset_zero(grads_.data(), grads_.bytes(), backend_.stream(StreamKind::Compute)); }

StepResult Engine::step(float lr) {
  Stream& s = backend_.stream(StreamKind::Compute);
  Ops& ops = backend_.ops();
  const size_t esz = dtype_size(opts_.dtype);
  auto grad_at = [&](int64_t e) { return static_cast<char*>(grads_.data()) + e * esz; };

  // Global norm over all ranks' gradients; a non-finite value anywhere makes it non-finite.
  backend_.memset_zero(norm_acc_.data(), sizeof(float), s);
  for (const Bucket& b : buckets_) ops.sum_squares(s, norm_acc_.as<float>(), grad_at(b.begin), b.size(), opts_.dtype);
  float local = 0.0f;
  backend_.copy_d2h(&local, norm_acc_.data(), sizeof(float), s);
  backend_.synchronize(s);
  double sumsq = local;
  comm_.all_reduce_sum(&sumsq, 1);

  StepResult r;
  r.grad_norm = std::sqrt(sumsq);
  if (!std::isfinite(r.grad_norm)) {
    r.skipped = true;
    return r;
  }
  // torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), applied only when < 1.
  if (opts_.grad_clip > 0.0f)
    r.clip_coef = static_cast<float>(std::min(1.0, opts_.grad_clip / (r.grad_norm + 1e-6)));

  ++steps_;
  AdamWParams hp = opts_.adam;
  hp.lr = lr;
  hp.step = steps_;
  hp.grad_scale = r.clip_coef;
  for (const Bucket& b : buckets_) {
    ops.adamw(s, master_.as<float>() + b.begin, exp_avg_.as<float>() + b.begin, exp_avg_sq_.as<float>() + b.begin,
              grad_at(b.begin), opts_.dtype, static_cast<char*>(weights_.data()) + b.begin * esz, opts_.dtype,
              b.size(), hp);
  }
  return r;
}

}  // namespace so
