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
void visit_buffers(DeviceBuffer* const* kept, MoeScratch* sb, const MoeSpec& spec, int64_t T, DType dt, Visit&& visit) {
  const int64_t E = spec.routing.experts, k = spec.routing.top_k, H = spec.hidden, I = spec.intermediate;
  const size_t e = dtype_size(dt), rows = static_cast<size_t>(T * k);
  // GPT-OSS's experts project to the interleaved gate_up [rows, 2I], kept in the gate buffer.
  const size_t gate_cols = spec.experts == MoeSpec::Experts::GptOssGLU ? 2 * I : I;
  const size_t up_cols = spec.experts == MoeSpec::Experts::GptOssGLU ? 0 : I;
  const std::pair<const char*, size_t> kept_sizes[kKept] = {{"moe router logits", T * E * 4},
                                                            {"moe routing weights", rows * 4},
                                                            {"moe routed experts", rows * 4},
                                                            {"moe slot order", rows * 4},
                                                            {"moe slot rows", rows * 4},
                                                            {"moe expert offsets", (E + 1) * 4},
                                                            {"moe ones (bias GEMMs)", rows * e},
                                                            {"moe dispatched tokens", rows * H * e},
                                                            {"moe expert gate", rows * gate_cols * e},
                                                            {"moe expert up", rows * up_cols * e},
                                                            {"moe expert activation", rows * I * e},
                                                            {"moe expert outputs", rows * H * e}};
  for (int i = 0; i < kKept; ++i)
    if (kept_sizes[i].second > 0) visit(kept ? kept[i] : nullptr, kept_sizes[i].second, kept_sizes[i].first, true);
  DeviceBuffer* s[kScratch] = {};
  if (sb) {
    DeviceBuffer* list[kScratch] = {&sb->dy,  &sb->dweights, &sb->dact,    &sb->dgate,
                                    &sb->dup, &sb->dxs,      &sb->dlogits, &sb->dlogits_dt};
    std::copy(list, list + kScratch, s);
  }
  const std::pair<const char*, size_t> scratch_sizes[kScratch] = {
      {"moe expert output grad", rows * H * e}, {"moe routing weight grad", rows * 4},
      {"moe activation grad", rows * I * e},    {"moe gate grad", rows * gate_cols * e},
      {"moe up grad", rows * up_cols * e},      {"moe dispatched token grad", rows * H * e},
      {"moe router logit grad", T * E * 4},     {"moe router logit grad (storage dtype)", T * E * e}};
  for (int i = 0; i < kScratch; ++i)
    if (scratch_sizes[i].second > 0) visit(s[i], scratch_sizes[i].second, scratch_sizes[i].first, false);
}

}  // namespace

std::vector<MoeBuffer> MoeBlock::buffers(const MoeSpec& spec, int64_t max_tokens, DType dt) {
  std::vector<MoeBuffer> out;
  visit_buffers(nullptr, nullptr, spec, max_tokens, dt, [&](DeviceBuffer*, size_t bytes, const char* tag, bool kept) {
    out.push_back({tag, bytes, kept});
  });
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
  const bool gpt_oss = spec_.experts == MoeSpec::Experts::GptOssGLU;
  const bool ok = w.router && w.down.size() == E &&
                  (gpt_oss ? w.gate_up.size() == E && w.gate_up_bias.size() == E && w.down_bias.size() == E
                           : w.gate.size() == E && w.up.size() == E);
  SO_CHECK(ok, "moe: ", what, " must name the router and every one of the ", E, " experts' ",
           gpt_oss ? "gate_up, down and their biases" : "gate, up and down", " (got ", w.gate.size(), " gate, ",
           w.up.size(), " up, ", w.gate_up.size(), " gate_up, ", w.down.size(), " down)");
}

GroupedGemm MoeBlock::expert_groups() const {
  GroupedGemm g;
  g.offsets = offsets_.as<int32_t>();  // moe_sort_slots' result, read on the device
  g.max_rows = T_ * spec_.routing.top_k;
  g.groups = spec_.routing.experts;
  g.ab = g.c = dt_;
  return g;
}

void MoeBlock::expert_gemm(Stream& s, void* out, const void* in, const std::vector<void*>& weight, bool linear,
                           const std::vector<void*>& bias, int64_t N, int64_t K, float beta) {
  GroupedGemm g = expert_groups();
  if (!bias.empty()) {  // out = beta * out + ones[rows, 1] @ bias_e[1, N]; the product adds onto it
    g.N = N, g.K = 1, g.A = ones_.data(), g.C = out, g.beta = beta, g.per_group = bias.data();
    backend_.ops().grouped_gemm(s, g);
    beta = 1.0f;
  }
  g.trans_b = linear;
  g.N = N, g.K = K, g.A = in, g.C = out, g.beta = beta, g.per_group = weight.data();
  backend_.ops().grouped_gemm(s, g);
}

void MoeBlock::weight_grad(Stream& s, const std::vector<void*>& dweight, const void* a, int64_t M, const void* b,
                           int64_t N) {
  GroupedGemm g = expert_groups();
  g.trans_a = true;  // vary_k
  g.M = M, g.N = N, g.A = a, g.B = b, g.per_group = dweight.data(), g.beta = 1.0f;
  backend_.ops().grouped_gemm(s, g);
}

void MoeBlock::bias_grad(Stream& s, const std::vector<void*>& dbias, const void* dout, int64_t N) {
  weight_grad(s, dbias, ones_.data(), 1, dout, N);
}

void MoeBlock::forward(Stream& s, void* out, const void* x, const MoeParams& w, int64_t T, bool accumulate) {
  check_params(w, "weights");
  SO_CHECK(T > 0 && T <= capacity_, "moe: ", T, " tokens in a forward; the block holds buffers for ", capacity_);
  T_ = T;
  Ops& ops = backend_.ops();
  const MoeRouting& r = spec_.routing;
  const int64_t E = r.experts, k = r.top_k, H = spec_.hidden, I = spec_.intermediate;

  // Router logits in fp32 (transformers takes the softmax in fp32 too).
  ops.gemm(s, Gemm::nt(T, E, H, x, w.router, logits_.data(), dt_).out_as(DType::F32));
  if (w.router_bias)
    ops.gemm(s, Gemm::nn(T, E, 1, ones_.data(), w.router_bias, logits_.data(), dt_, 1.0f).out_as(DType::F32));
  ops.moe_route(s, r, weights_.as<float>(), experts_.as<int32_t>(), logits_.as<float>(), T);
  ops.moe_sort_slots(s, slot_of_.as<int32_t>(), row_of_.as<int32_t>(), offsets_.as<int32_t>(), experts_.as<int32_t>(),
                     T, k, E);

  const MoeSlots slots{.T = T, .k = k, .H = H, .dtype = dt_};
  ops.moe_dispatch(s, slots, xs_.data(), x, slot_of_.as<int32_t>());
  if (spec_.experts == MoeSpec::Experts::SwiGLU) {
    expert_gemm(s, gate_.data(), xs_.data(), w.gate, true, {}, I, H, 0.0f);
    expert_gemm(s, up_.data(), xs_.data(), w.up, true, {}, I, H, 0.0f);
    ops.swiglu_forward(s, act_.data(), gate_.data(), up_.data(), T * k * I, dt_);
    expert_gemm(s, y_.data(), act_.data(), w.down, true, {}, H, I, 0.0f);
  } else {  // gate_ holds the interleaved gate_up [rows, 2I]
    expert_gemm(s, gate_.data(), xs_.data(), w.gate_up, false, w.gate_up_bias, 2 * I, H, 0.0f);
    ops.clamped_swiglu_forward(s, act_.data(), gate_.data(), T * k * I, spec_.glu_alpha, spec_.glu_limit, dt_);
    expert_gemm(s, y_.data(), act_.data(), w.down, false, w.down_bias, H, I, 0.0f);
  }
  ops.moe_combine(s, slots, out, y_.data(), weights_.as<float>(), row_of_.as<int32_t>(), accumulate);
}

void MoeBlock::backward(Stream& s, MoeScratch& sc, void* dx, const MoeParams& w, const MoeParams& g, const void* dout,
                        const void* x, bool accumulate, const float* aux_dprob) {
  check_params(g, "gradients");
  Ops& ops = backend_.ops();
  const MoeRouting& r = spec_.routing;
  const int64_t T = T_, E = r.experts, k = r.top_k, H = spec_.hidden, I = spec_.intermediate;

  // Combine: the experts' outputs and the routing weights.
  const MoeSlots slots{.T = T, .k = k, .H = H, .dtype = dt_};
  ops.moe_combine_backward(s, slots, sc.dy.data(), sc.dweights.as<float>(), dout, y_.data(), weights_.as<float>(),
                           slot_of_.as<int32_t>());
  // The experts: d(in) = d(out) @ op(W)^T per expert, weights' gradients from the saved inputs.
  if (spec_.experts == MoeSpec::Experts::SwiGLU) {
    weight_grad(s, g.down, sc.dy.data(), H, act_.data(), I);  // down [H, I]
    expert_gemm(s, sc.dact.data(), sc.dy.data(), w.down, false, {}, I, H, 0.0f);
    ops.swiglu_backward(s, sc.dgate.data(), sc.dup.data(), sc.dact.data(), gate_.data(), up_.data(), T * k * I, dt_);
    weight_grad(s, g.gate, sc.dgate.data(), I, xs_.data(), H);
    weight_grad(s, g.up, sc.dup.data(), I, xs_.data(), H);
    expert_gemm(s, sc.dxs.data(), sc.dgate.data(), w.gate, false, {}, H, I, 0.0f);
    expert_gemm(s, sc.dxs.data(), sc.dup.data(), w.up, false, {}, H, I, 1.0f);
  } else {                                                    // sc.dgate holds the interleaved d(gate_up) [rows, 2I]
    weight_grad(s, g.down, act_.data(), I, sc.dy.data(), H);  // down [I, H]
    bias_grad(s, g.down_bias, sc.dy.data(), H);
    expert_gemm(s, sc.dact.data(), sc.dy.data(), w.down, true, {}, I, H, 0.0f);
    ops.clamped_swiglu_backward(s, sc.dgate.data(), sc.dact.data(), gate_.data(), T * k * I, spec_.glu_alpha,
                                spec_.glu_limit, dt_);
    weight_grad(s, g.gate_up, xs_.data(), H, sc.dgate.data(), 2 * I);  // gate_up [H, 2I]
    bias_grad(s, g.gate_up_bias, sc.dgate.data(), 2 * I);
    expert_gemm(s, sc.dxs.data(), sc.dgate.data(), w.gate_up, true, {}, H, 2 * I, 0.0f);
  }
  // Dispatch's backward: each token sums its k rows.
  ops.moe_combine(s, slots, dx, sc.dxs.data(), nullptr, row_of_.as<int32_t>(), accumulate);

  // Router: the weights' gradient through top-k and the softmax, then the linear layer.
  ops.moe_route_backward(s, r, sc.dlogits.as<float>(), sc.dweights.as<float>(), logits_.as<float>(),
                         experts_.as<int32_t>(), aux_dprob, T);
  ops.cast(s, sc.dlogits_dt.data(), dt_, sc.dlogits.data(), DType::F32, T * E);
  ops.gemm(s, Gemm::nn(T, H, E, sc.dlogits_dt.data(), w.router, dx, dt_, 1.0f));
  ops.gemm(s, Gemm::tn(E, H, T, sc.dlogits_dt.data(), x, g.router, dt_, 1.0f));
  if (g.router_bias) ops.gemm(s, Gemm::tn(1, E, T, ones_.data(), sc.dlogits_dt.data(), g.router_bias, dt_, 1.0f));
}

}  // namespace so
