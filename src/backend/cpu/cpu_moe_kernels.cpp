// Mixture-of-experts kernels of the CPU backend: routing, the sort of (token, choice) slots by
// expert, dispatch/combine, the per-expert GEMMs and GPT-OSS's clamped GLU. Arithmetic in fp32.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "cpu_kernels.h"
#include "src/backend/grouped_gemm.h"
#include "src/backend/moe_aux_loss.h"
#include "so/core/error.h"

namespace so::cpu {
namespace {

// softmax of z[0, n) into p, as torch computes it (max-subtracted, fp32).
void softmax(float* p, const float* z, int64_t n) {
  const float m = *std::max_element(z, z + n);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += (p[i] = std::exp(z[i] - m));
  for (int64_t i = 0; i < n; ++i) p[i] /= sum;
}

// The k largest of v[0, n), largest first; ties go to the lower index (documented in ops.h).
void top_k(int32_t* idx, const float* v, int64_t n, int64_t k) {
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  std::copy(order.begin(), order.begin() + k, idx);
}

float round_through(float x, DType dt) { return dt == DType::F32 ? x : bf16_to_f32(f32_to_bf16(x)); }

void check_routing(const MoeRouting& r) {
  SO_CHECK(r.experts > 0 && r.top_k > 0 && r.top_k <= r.experts, "moe: top_k (", r.top_k,
           ") must be in [1, experts = ", r.experts, "]");
}

}  // namespace

void moe_route(float* weights, int32_t* experts, const float* logits, int64_t T, const MoeRouting& r) {
  check_routing(r);
  const int64_t E = r.experts, k = r.top_k;
  std::vector<float> p(E), sel(k);
  for (int64_t t = 0; t < T; ++t) {
    const float* z = logits + t * E;
    float* w = weights + t * k;
    int32_t* e = experts + t * k;
    if (r.kind == MoeRouting::Kind::SoftmaxTopK) {
      softmax(p.data(), z, E);
      top_k(e, p.data(), E, k);
      float sum = 0.0f;
      for (int64_t j = 0; j < k; ++j) sum += (sel[j] = p[e[j]]);
      for (int64_t j = 0; j < k; ++j) w[j] = round_through(r.normalize ? sel[j] / sum : sel[j], r.weight_dtype);
    } else {
      top_k(e, z, E, k);
      for (int64_t j = 0; j < k; ++j) sel[j] = z[e[j]];
      softmax(w, sel.data(), k);
      for (int64_t j = 0; j < k; ++j) w[j] = round_through(w[j], r.weight_dtype);
    }
  }
}

void moe_route_backward(float* dlogits, const float* dweights, const float* logits, const int32_t* experts,
                        const float* aux_dprob, int64_t T, const MoeRouting& r) {
  check_routing(r);
  const int64_t E = r.experts, k = r.top_k;
  std::vector<float> p(E), dp(E), w(k), z_sel(k);
  // dz = p * (dp - <dp, p>): the softmax's backward.
  auto softmax_backward = [](float* dz, const float* p, const float* dp, int64_t n, bool accumulate) {
    float dot = 0.0f;
    for (int64_t i = 0; i < n; ++i) dot += dp[i] * p[i];
    for (int64_t i = 0; i < n; ++i) dz[i] = (accumulate ? dz[i] : 0.0f) + p[i] * (dp[i] - dot);
  };
  for (int64_t t = 0; t < T; ++t) {
    const float* z = logits + t * E;
    const float* dw = dweights + t * k;
    const int32_t* e = experts + t * k;
    float* dz = dlogits + t * E;
    softmax(p.data(), z, E);
    std::fill(dp.begin(), dp.end(), 0.0f);
    if (aux_dprob)
      for (int64_t i = 0; i < E; ++i) dp[i] = aux_dprob[i];
    if (r.kind == MoeRouting::Kind::SoftmaxTopK) {
      // w_j = v_j / S with v_j = p[e_j] and S = sum v (S = 1 without normalising).
      float S = 0.0f, dot = 0.0f;
      for (int64_t j = 0; j < k; ++j) S += p[e[j]];
      if (!r.normalize) S = 1.0f;
      for (int64_t j = 0; j < k; ++j) dot += dw[j] * p[e[j]] / S;
      for (int64_t j = 0; j < k; ++j) dp[e[j]] += r.normalize ? (dw[j] - dot) / S : dw[j];
      softmax_backward(dz, p.data(), dp.data(), E, false);
    } else {
      softmax_backward(dz, p.data(), dp.data(), E, false);  // the aux term alone (zero without it)
      for (int64_t j = 0; j < k; ++j) z_sel[j] = z[e[j]];
      softmax(w.data(), z_sel.data(), k);
      float dot = 0.0f;
      for (int64_t j = 0; j < k; ++j) dot += dw[j] * w[j];
      for (int64_t j = 0; j < k; ++j) dz[e[j]] += w[j] * (dw[j] - dot);
    }
  }
}

void moe_sort_slots(int32_t* slot_of, int32_t* row_of, int32_t* offsets, const int32_t* experts, int64_t T, int64_t k,
                    int64_t E) {
  std::fill(offsets, offsets + E + 1, 0);
  for (int64_t i = 0; i < T * k; ++i) {
    SO_CHECK(experts[i] >= 0 && experts[i] < E, "moe: expert id ", experts[i], " of slot ", i, " is outside [0, ", E,
             ")");
    ++offsets[experts[i] + 1];
  }
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  std::vector<int32_t> next(offsets, offsets + E);
  for (int64_t i = 0; i < T * k; ++i) {
    const int32_t p = next[experts[i]]++;
    slot_of[p] = static_cast<int32_t>(i);
    row_of[i] = p;
  }
}

template <typename T>
void moe_dispatch(T* dst, const T* x, const int32_t* slot_of, int64_t T_, int64_t k, int64_t H) {
  for (int64_t p = 0; p < T_ * k; ++p) std::memcpy(dst + p * H, x + (slot_of[p] / k) * H, sizeof(T) * H);
}

template <typename T>
void moe_combine(T* out, const T* y, const float* weights, const int32_t* row_of, int64_t T_, int64_t k, int64_t H,
                 bool accumulate) {
  std::vector<float> acc(H);
  for (int64_t t = 0; t < T_; ++t) {
    for (int64_t i = 0; i < H; ++i) acc[i] = accumulate ? to_f32(out[t * H + i]) : 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const float w = weights ? weights[t * k + j] : 1.0f;
      const T* row = y + static_cast<int64_t>(row_of[t * k + j]) * H;
      for (int64_t i = 0; i < H; ++i) acc[i] += w * to_f32(row[i]);
    }
    for (int64_t i = 0; i < H; ++i) out[t * H + i] = from_f32<T>(acc[i]);
  }
}

template <typename T>
void moe_combine_backward(T* dy, float* dweights, const T* dout, const T* y, const float* weights,
                          const int32_t* slot_of, int64_t T_, int64_t k, int64_t H) {
  for (int64_t p = 0; p < T_ * k; ++p) {
    const int32_t slot = slot_of[p];
    const T* g = dout + (slot / k) * H;
    const float w = weights[slot];
    float dot = 0.0f;
    for (int64_t i = 0; i < H; ++i) {
      const float gi = to_f32(g[i]);
      dot += gi * to_f32(y[p * H + i]);
      dy[p * H + i] = from_f32<T>(w * gi);
    }
    dweights[slot] = dot;
  }
}

void grouped_gemm(const GroupedGemm& g) {
  walk_grouped_gemm(
      g,
      [&](bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, const void* B, void* C) {
        gemm(ta, tb, M, N, K, g.alpha, A, B, g.ab, g.beta, C, g.c);
      },
      [](void* C, size_t bytes) { std::memset(C, 0, bytes); });
}

void moe_expert_stats(int64_t* counts_acc, double* tokens, double* probs, const float* logits, const int32_t* offsets,
                      int64_t T, int64_t E) {
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = offsets[e + 1] - offsets[e];
    if (counts_acc != nullptr) counts_acc[e] += n;
    if (tokens != nullptr) tokens[e] += static_cast<double>(n);
  }
  if (probs == nullptr) return;
  for (int64_t t = 0; t < T; ++t) {  // softmax over all experts, in fp32 as transformers
    const float* z = logits + t * E;
    const float mx = *std::max_element(z, z + E);
    float denom = 0.0f;
    for (int64_t e = 0; e < E; ++e) denom += std::exp(z[e] - mx);
    for (int64_t e = 0; e < E; ++e) probs[e] += std::exp(z[e] - mx) / denom;
  }
}

void moe_aux_loss(const MoeAuxLoss& a, float* loss_acc, float* dprob, double* tokens, double* probs) {
  apply_moe_aux_loss(a, loss_acc, dprob, tokens, probs);
}

template <typename T>
void clamped_swiglu_forward(T* out, const T* gate_up, int64_t n, float alpha, float limit) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = std::min(to_f32(gate_up[2 * i]), limit), u = std::clamp(to_f32(gate_up[2 * i + 1]), -limit, limit);
    out[i] = from_f32<T>(g / (1.0f + std::exp(-alpha * g)) * (u + 1.0f));
  }
}

template <typename T>
void clamped_swiglu_backward(T* dgate_up, const T* dout, const T* gate_up, int64_t n, float alpha, float limit) {
  for (int64_t i = 0; i < n; ++i) {
    const float g0 = to_f32(gate_up[2 * i]), u0 = to_f32(gate_up[2 * i + 1]), dy = to_f32(dout[i]);
    const float g = std::min(g0, limit), u = std::clamp(u0, -limit, limit);
    const float sig = 1.0f / (1.0f + std::exp(-alpha * g));
    // torch's clamp passes the gradient where the input is within the bounds, ends included.
    dgate_up[2 * i] = from_f32<T>(g0 <= limit ? dy * (u + 1.0f) * sig * (1.0f + alpha * g * (1.0f - sig)) : 0.0f);
    dgate_up[2 * i + 1] = from_f32<T>(u0 >= -limit && u0 <= limit ? dy * g * sig : 0.0f);
  }
}

#define SO_INSTANTIATE_MOE_KERNELS(T)                                                                          \
  template void moe_dispatch<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t);                      \
  template void moe_combine<T>(T*, const T*, const float*, const int32_t*, int64_t, int64_t, int64_t, bool);   \
  template void moe_combine_backward<T>(T*, float*, const T*, const T*, const float*, const int32_t*, int64_t, \
                                        int64_t, int64_t);                                                     \
  template void clamped_swiglu_forward<T>(T*, const T*, int64_t, float, float);                                \
  template void clamped_swiglu_backward<T>(T*, const T*, const T*, int64_t, float, float);
SO_INSTANTIATE_MOE_KERNELS(float)
SO_INSTANTIATE_MOE_KERNELS(bf16)

}  // namespace so::cpu
