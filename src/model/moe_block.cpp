#include "so/model/moe_block.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "so/core/error.h"

namespace so {

namespace {

void check_spec(const MoeSpec& spec) {
  const MoeRouting& r = spec.routing;
  SO_CHECK(r.experts > 0 && r.top_k > 0 && r.top_k <= r.experts, "moe: num_experts_per_tok (", r.top_k,
           ") must be in [1, num_experts = ", r.experts, "]");
  SO_CHECK(spec.hidden > 0 && spec.intermediate > 0, "moe: hidden (", spec.hidden, ") and expert intermediate (",
           spec.intermediate, ") sizes must be positive");
}

constexpr int kKept = 12, kScratch = 8;

// Calls visit(buffer, bytes, tag, kept) for a block's kept buffers (`kept`, in the order listed)
// and the shared scratch (`sb`); either may be null (sizes only, visit gets null buffers). One
// list decides both the allocation and the plan.
template <class Visit>
void visit_buffers(DeviceBuffer* const* kept, MoeScratch* sb, const MoeSpec& spec, int64_t T, DType dt,
                   Visit&& visit) {  const int64_t E = spec.routing.experts, k = spec.routing.top_k, H = spec.hidden, I = spec.intermediate;
  const size_t e = dtype_size(dt), rows = static_cast<size_t>(T * k);
  const std::pair<const char*, size_t> kept_sizes[kKept] = {
      {"moe router logits", T * E * 4},       {"moe routing weights", rows * 4},
      {"moe routed experts", rows * 4},       {"moe slot order", rows * 4},
      {"moe slot rows", rows * 4},            {"moe expert offsets", (E + 1) * 4},
      {"moe ones (bias GEMMs)", rows * e},    {"moe dispatched tokens", rows * H * e},
      {"moe expert gate", rows * I * e},      {"moe expert up", rows * I * e},
      {"moe expert activation", rows * I * e}, {"moe expert outputs", rows * H * e}};
  for (int i = 0; i < kKept; ++i) visit(kept ? kept[i] : nullptr, kept_sizes[i].second, kept_sizes[i].first, true);
  DeviceBuffer* s[kScratch] = {};
  if (sb) {
    DeviceBuffer* list[kScratch] = {&sb->dy, &sb->dweights, &sb->dact, &sb->dgate, &sb->dup, &sb->dxs, &sb->dlogits,
                             &sb->dlogits_dt};
    std::copy(list, list + kScratch, s);
  }
  const std::pair<const char*, size_t> scratch_sizes[kScratch] = {
      {"moe expert output grad", rows * H * e}, {"moe routing weight grad", rows * 4},
      {"moe activation grad", rows * I * e},    {"moe gate grad", rows * I * e},
      {"moe up grad", rows * I * e},            {"moe dispatched token grad", rows * H * e},
      {"moe router logit grad", T * E * 4},     {"moe router logit grad (storage dtype)", T * E * e}};
  for (int i = 0; i < kScratch; ++i) visit(s[i], scratch_sizes[i].second, scratch_sizes[i].first, false);
}

}  // namespace

std::vector<MoeBuffer> MoeBlock::buffers(const MoeSpec& spec, int64_t max_tokens, DType dt) {
  std::vector<MoeBuffer> out;
  visit_buffers(nullptr, nullptr, spec, max_tokens, dt,
                [&](DeviceBuffer*, size_t bytes, const char* tag, bool kept) { out.push_back({tag, bytes, kept}); });
  return out;
}

MoeScratch::MoeScratch(Backend& backend, const MoeSpec& spec, int64_t max_tokens, DType dt) {
  check_spec(spec);
  visit_buffers(nullptr, this, spec, max_tokens, dt, [&](DeviceBuffer* b, size_t bytes, const char* tag, bool) {
    if (b) *b = backend.alloc(bytes, tag);
  });
}

MoeBlock::MoeBlock(Backend& backend, const MoeSpec& spec, int64_t max_tokens, DType dt)
    : backend_(backend), spec_(spec), dt_(dt), capacity_(max_tokens) {
  check_spec(spec);
  SO_CHECK(max_tokens > 0, "moe: max_tokens (", max_tokens, ") must be positive");
  rows_.assign(spec.routing.experts, 0);
  DeviceBuffer* const kept[kKept] = {&logits_, &weights_, &experts_, &slot_of_, &row_of_, &offsets_,
                            &ones_,   &xs_,      &gate_,    &up_,      &act_,    &y_};
  visit_buffers(kept, nullptr, spec, max_tokens, dt, [&](DeviceBuffer* b, size_t bytes, const char* tag, bool) {
    if (b) *b = backend.alloc(bytes, tag);
  });
  const size_t e = dtype_size(dt), rows = static_cast<size_t>(max_tokens * spec.routing.top_k);
  std::vector<char> ones(rows * e);
  const float one = 1.0f;
  const bf16 one_bf16 = f32_to_bf16(1.0f);
  const void* one_dt = dt == DType::F32 ? static_cast<const void*>(&one) : &one_bf16;
  for (size_t i = 0; i < rows; ++i) std::memcpy(ones.data() + i * e, one_dt, e);
  backend_.copy_h2d_sync(ones_.data(), ones.data(), ones.size(), backend_.stream(StreamKind::Compute));
}

void MoeBlock::check_params(const MoeParams& w, const char* what) const {
  const size_t E = static_cast<size_t>(spec_.routing.experts);
  SO_CHECK(w.router && w.gate.size() == E && w.up.size() == E && w.down.size() == E, "moe: ", what,
           " name the router and ", E, " experts' gate, up and down (got ", w.gate.size(), ", ", w.up.size(), ", ",
           w.down.size(), ")");
  SO_CHECK(w.gate_bias.size() == w.up_bias.size() && w.up_bias.size() == w.down_bias.size() &&
               (w.gate_bias.empty() || w.gate_bias.size() == E),
           "moe: ", what, " have expert biases for some projections or experts only");
}

// out[rows, N] = beta * out + in[rows, K] @ weight_e^T (+ bias_e) per expert's rows.
void MoeBlock::expert_gemm(Stream& s, void* out, const void* in, const std::vector<void*>& weight,
                           const std::vector<void*>& bias, int64_t N, int64_t K, float beta) {
  GroupedGemm g;
  g.rows = rows_.data();
  g.groups = spec_.routing.experts;
  g.ab = g.c = dt_;
  g.trans_b = true;
  g.N = N, g.K = K, g.A = in, g.C = out, g.beta = beta, g.per_group = weight.data();
  backend_.ops().grouped_gemm(s, g);
  if (!bias.empty()) {  // + ones[rows, 1] @ bias_e[1, N]
    g.trans_b = false;
    g.K = 1, g.A = ones_.data(), g.per_group = bias.data(), g.beta = 1.0f;
    backend_.ops().grouped_gemm(s, g);
  }
}

// dweight_e[M, N] += dout_e^T @ in_e and dbias_e[M] += the sum of dout_e's rows, per expert.
void MoeBlock::weight_grad(Stream& s, const std::vector<void*>& dweight, const std::vector<void*>& dbias,
                           const void* dout, const void* in, int64_t M, int64_t N) {
  GroupedGemm g;
  g.vary_k = true;
  g.rows = rows_.data();
  g.groups = spec_.routing.experts;
  g.ab = g.c = dt_;
  g.M = M, g.N = N, g.A = dout, g.B = in, g.per_group = dweight.data(), g.beta = 1.0f;
  backend_.ops().grouped_gemm(s, g);
  if (!dbias.empty()) {  // dbias_e[1, M] += ones^T @ dout_e
    g.M = 1, g.N = M, g.A = ones_.data(), g.B = dout, g.per_group = dbias.data();
    backend_.ops().grouped_gemm(s, g);
  }
}

void MoeBlock::forward(Stream& s, void* out, const void* x, const MoeParams& w, int64_t T, bool accumulate) {
  check_params(w, "weights");
  SO_CHECK(T > 0 && T <= capacity_, "moe: ", T, " tokens in a forward; the block holds buffers for ", capacity_);
  T_ = T;
  Ops& ops = backend_.ops();
  const MoeRouting& r = spec_.routing;
  const int64_t E = r.experts, k = r.top_k, H = spec_.hidden, I = spec_.intermediate;

  // Router logits in fp32 (transformers takes the softmax in fp32 too).
  ops.gemm(s, false, true, T, E, H, 1.0f, x, w.router, dt_, 0.0f, logits_.data(), DType::F32);
  if (w.router_bias)
    ops.gemm(s, false, false, T, E, 1, 1.0f, ones_.data(), w.router_bias, dt_, 1.0f, logits_.data(), DType::F32);
  ops.moe_route(s, r, weights_.as<float>(), experts_.as<int32_t>(), logits_.as<float>(), T);
  ops.moe_sort_slots(s, slot_of_.as<int32_t>(), row_of_.as<int32_t>(), offsets_.as<int32_t>(),
                     experts_.as<int32_t>(), T, k, E);
  std::vector<int32_t> offsets(E + 1);
  backend_.copy_d2h(offsets.data(), offsets_.data(), offsets.size() * 4, s);
  backend_.synchronize(s);
  for (int64_t e = 0; e < E; ++e) rows_[e] = offsets[e + 1] - offsets[e];

  ops.moe_dispatch(s, xs_.data(), x, slot_of_.as<int32_t>(), T, k, H, dt_);
  expert_gemm(s, gate_.data(), xs_.data(), w.gate, w.gate_bias, I, H, 0.0f);
  expert_gemm(s, up_.data(), xs_.data(), w.up, w.up_bias, I, H, 0.0f);
  if (spec_.activation == MoeSpec::Activation::SwiGLU)
    ops.swiglu_forward(s, act_.data(), gate_.data(), up_.data(), T * k * I, dt_);
  else
    ops.clamped_swiglu_forward(s, act_.data(), gate_.data(), up_.data(), T * k * I, spec_.glu_alpha,
                               spec_.glu_limit, dt_);
  expert_gemm(s, y_.data(), act_.data(), w.down, w.down_bias, H, I, 0.0f);
  ops.moe_combine(s, out, y_.data(), weights_.as<float>(), row_of_.as<int32_t>(), T, k, H, accumulate, dt_);
}

void MoeBlock::backward(Stream& s, MoeScratch& sc, void* dx, const MoeParams& w, const MoeParams& g,
                        const void* dout, const void* x, bool accumulate, const float* aux_dprob) {
  check_params(g, "gradients");
  Ops& ops = backend_.ops();
  const MoeRouting& r = spec_.routing;
  const int64_t T = T_, E = r.experts, k = r.top_k, H = spec_.hidden, I = spec_.intermediate;
  DeviceBuffer &dy = sc.dy, &dweights = sc.dweights, &dact = sc.dact, &dgate = sc.dgate, &dup = sc.dup,
               &dxs = sc.dxs, &dlogits = sc.dlogits, &dlogits_dt = sc.dlogits_dt;

  // Combine: the experts' outputs and the routing weights.
  ops.moe_combine_backward(s, dy.data(), dweights.as<float>(), dout, y_.data(), weights_.as<float>(),
                           slot_of_.as<int32_t>(), T, k, H, dt_);
  // Down projection, activation, gate and up projections, per expert.
  weight_grad(s, g.down, g.down_bias, dy.data(), act_.data(), H, I);
  GroupedGemm back;  // d(in)[rows, K] = d(out)[rows, N] @ weight_g[N, K]
  back.rows = rows_.data();
  back.groups = E;
  back.ab = back.c = dt_;
  back.N = I, back.K = H, back.A = dy.data(), back.C = dact.data(), back.per_group = w.down.data();
  ops.grouped_gemm(s, back);
  if (spec_.activation == MoeSpec::Activation::SwiGLU)
    ops.swiglu_backward(s, dgate.data(), dup.data(), dact.data(), gate_.data(), up_.data(), T * k * I, dt_);
  else
    ops.clamped_swiglu_backward(s, dgate.data(), dup.data(), dact.data(), gate_.data(), up_.data(), T * k * I,
                                spec_.glu_alpha, spec_.glu_limit, dt_);
  weight_grad(s, g.gate, g.gate_bias, dgate.data(), xs_.data(), I, H);
  weight_grad(s, g.up, g.up_bias, dup.data(), xs_.data(), I, H);
  back.N = H, back.K = I, back.A = dgate.data(), back.C = dxs.data(), back.per_group = w.gate.data(),
  back.beta = 0.0f;
  ops.grouped_gemm(s, back);
  back.A = dup.data(), back.per_group = w.up.data(), back.beta = 1.0f;
  ops.grouped_gemm(s, back);
  // Dispatch's backward: each token sums its k rows.
  ops.moe_combine(s, dx, dxs.data(), nullptr, row_of_.as<int32_t>(), T, k, H, accumulate, dt_);

  // Router: the weights' gradient through top-k and the softmax, then the linear layer.
  ops.moe_route_backward(s, r, dlogits.as<float>(), dweights.as<float>(), logits_.as<float>(),
                         experts_.as<int32_t>(), aux_dprob, T);
  ops.cast(s, dlogits_dt.data(), dt_, dlogits.data(), DType::F32, T * E);
  ops.gemm(s, false, false, T, H, E, 1.0f, dlogits_dt.data(), w.router, dt_, 1.0f, dx, dt_);
  ops.gemm(s, true, false, E, H, T, 1.0f, dlogits_dt.data(), x, dt_, 1.0f, g.router, dt_);
  if (g.router_bias)
    ops.gemm(s, true, false, 1, E, T, 1.0f, ones_.data(), dlogits_dt.data(), dt_, 1.0f, g.router_bias, dt_);
}

}  // namespace so
