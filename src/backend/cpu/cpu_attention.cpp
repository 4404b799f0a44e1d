// Causal grouped-query attention, flash style: scores are produced one query row at a time over
// blocks of keys with an online softmax, so memory is O(S * D) per head and the S x S score
// matrix never exists. Backward recomputes probabilities from the saved log-sum-exp (FA2).
// The mask (documents, window, padding) narrows each row to the keys [first_key(i), last_key(i)];
// a row with none outputs zero. A sink adds one logit to the row's softmax after the keys (lse
// includes it, so backward needs nothing more).
// Dropout scales each P_ij by keep_ij / (1 - p) where it meets V (forward) or dO V^T (backward);
// lse and the normaliser stay the undropped softmax's.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_kernels.h"
#include "so/core/error.h"

namespace so::cpu {

namespace {

constexpr int64_t kKeyBlock = 64;

// Gathers head h of a [B*S, H*D] activation for sequence b into a dense fp32 [S, D] array.
template <typename T>
void load_head(std::vector<float>& dst, const T* src, int64_t b, int64_t h, int64_t S, int64_t H, int64_t D) {
  dst.resize(static_cast<size_t>(S * D));
  for (int64_t s = 0; s < S; ++s) {
    const T* row = src + ((b * S + s) * H + h) * D;
    for (int64_t d = 0; d < D; ++d) dst[s * D + d] = to_f32(row[d]);
  }
}

template <typename T>
void store_head(T* dst, const std::vector<float>& src, int64_t b, int64_t h, int64_t S, int64_t H, int64_t D) {
  for (int64_t s = 0; s < S; ++s) {
    T* row = dst + ((b * S + s) * H + h) * D;
    for (int64_t d = 0; d < D; ++d) row[d] = from_f32<T>(src[s * D + d]);
  }
}

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void check_shape(const AttentionShape& sh, const AttentionMask& mask) {
  SO_CHECK(sh.Hkv > 0 && sh.Hq % sh.Hkv == 0, "attention: ", sh.Hq, " query heads are not a multiple of ", sh.Hkv,
           " KV heads");
  SO_CHECK(mask.window >= 0, "attention: negative sliding window ", mask.window);
  if (mask.doc_start != nullptr) check_attention_doc_start(mask.doc_start, sh.B, sh.S);
  if (mask.key_end != nullptr) check_attention_key_end(mask.key_end, sh.B, sh.S);
  SO_CHECK(mask.dropout.p >= 0.0f && mask.dropout.p < 1.0f, "attention: dropout probability ", mask.dropout.p,
           " is not in [0, 1)");
}

// Dropout's factor for P[query i of sequence b, key j] of local head h: 0 or 1 / (1 - p).
struct DropFactor {
  const AttentionMask& mask;
  int64_t S;
  uint32_t threshold = mask.dropout.threshold();
  float scale = mask.dropout.scale();
  bool on() const { return mask.dropout.p > 0.0f; }
  float operator()(int64_t b, int64_t h, int64_t i, int64_t j) const {
    const DropoutMask& m = mask.dropout;
    return attention_dropout_keep(m.key, m.first_sample + b, S, i, mask.first_head + h, j, threshold) ? scale : 0.0f;
  }
};

// The first key query i of row b sees: its document's first token, and no further back than the
// window allows.
int64_t first_key(const AttentionMask& mask, int64_t b, int64_t i, int64_t S) {
  int64_t lo = mask.doc_start != nullptr ? mask.doc_start[b * S + i] : 0;
  if (mask.window > 0) lo = std::max(lo, i - mask.window + 1);
  return lo;
}

// The last key query i of row b sees: itself, or the row's last token before its padding.
int64_t last_key(const AttentionMask& mask, int64_t b, int64_t i) {
  return mask.key_end != nullptr ? std::min<int64_t>(i, mask.key_end[b] - 1) : i;
}

}  // namespace

template <typename T>
void attention_forward(T* out, float* lse, const T* q, const T* k, const T* v, const AttentionShape& sh,
                       const AttentionMask& mask) {
  check_shape(sh, mask);
  const T* sinks = static_cast<const T*>(mask.sinks);
  const int64_t S = sh.S, D = sh.D, group = sh.Hq / sh.Hkv;
  const DropFactor drop{mask, S};
  std::vector<float> K, V, Q, O(static_cast<size_t>(S * D)), scores(kKeyBlock);
  for (int64_t b = 0; b < sh.B; ++b) {
    for (int64_t kvh = 0; kvh < sh.Hkv; ++kvh) {
      load_head(K, k, b, kvh, S, sh.Hkv, D);
      load_head(V, v, b, kvh, S, sh.Hkv, D);
      for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        load_head(Q, q, b, h, S, sh.Hq, D);
        for (int64_t i = 0; i < S; ++i) {
          const float* qi = &Q[i * D];
          float* oi = &O[i * D];
          for (int64_t d = 0; d < D; ++d) oi[d] = 0.0f;
          float m = -INFINITY, l = 0.0f;
          const int64_t last = last_key(mask, b, i);
          for (int64_t j0 = first_key(mask, b, i, S); j0 <= last; j0 += kKeyBlock) {
            const int64_t n = std::min(kKeyBlock, last + 1 - j0);
            float mb = -INFINITY;
            for (int64_t c = 0; c < n; ++c) {
              scores[c] = dot(qi, &K[(j0 + c) * D], D) * sh.scale;
              mb = std::max(mb, scores[c]);
            }
            const float mnew = std::max(m, mb);
            const float corr = std::exp(m - mnew);
            l *= corr;
            for (int64_t d = 0; d < D; ++d) oi[d] *= corr;
            for (int64_t c = 0; c < n; ++c) {
              const float p = std::exp(scores[c] - mnew);
              l += p;
              const float pv = drop.on() ? p * drop(b, h, i, j0 + c) : p;
              const float* vj = &V[(j0 + c) * D];
              for (int64_t d = 0; d < D; ++d) oi[d] += pv * vj[d];
            }
            m = mnew;
          }
          // A row that sees no key (l = 0): zero output, lse -inf (then the sink's alone).
          float row_lse = m + std::log(l), inv_l = l > 0.0f ? 1.0f / l : 0.0f;
          if (sinks != nullptr) {  // the sink's share of the row leaves the keys' output scaled down
            const float sink = to_f32(sinks[h]);
            const float hi = std::max(row_lse, sink);
            const float with_sink = hi + std::log(std::exp(row_lse - hi) + std::exp(sink - hi));
            inv_l *= std::exp(row_lse - with_sink);
            row_lse = with_sink;
          }
          for (int64_t d = 0; d < D; ++d) oi[d] *= inv_l;
          lse[(b * sh.Hq + h) * S + i] = row_lse;
        }
        store_head(out, O, b, h, S, sh.Hq, D);
      }
    }
  }
}

template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                        const float* lse, const AttentionShape& sh, const AttentionMask& mask, T* dsinks_acc) {
  check_shape(sh, mask);
  const T* sinks = static_cast<const T*>(mask.sinks);
  SO_CHECK(sinks == nullptr || dsinks_acc != nullptr, "attention_backward: sinks without a dsinks_acc buffer");
  std::vector<float> dsinks(static_cast<size_t>(sh.Hq), 0.0f);
  const int64_t S = sh.S, D = sh.D, group = sh.Hq / sh.Hkv;
  const DropFactor drop{mask, S};
  std::vector<float> K, V, Q, dO, O, dQ(static_cast<size_t>(S * D)), dK(static_cast<size_t>(S * D)),
      dV(static_cast<size_t>(S * D)), Di(static_cast<size_t>(S));
  for (int64_t b = 0; b < sh.B; ++b) {
    for (int64_t kvh = 0; kvh < sh.Hkv; ++kvh) {
      load_head(K, k, b, kvh, S, sh.Hkv, D);
      load_head(V, v, b, kvh, S, sh.Hkv, D);
      std::fill(dK.begin(), dK.end(), 0.0f);
      std::fill(dV.begin(), dV.end(), 0.0f);
      for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        load_head(Q, q, b, h, S, sh.Hq, D);
        load_head(dO, dout, b, h, S, sh.Hq, D);
        load_head(O, out, b, h, S, sh.Hq, D);
        std::fill(dQ.begin(), dQ.end(), 0.0f);
        const float* L = lse + (b * sh.Hq + h) * S;
        for (int64_t i = 0; i < S; ++i) Di[i] = dot(&dO[i * D], &O[i * D], D);
        // d lse/d sink = p_sink; the sink's value is zero, so d loss/d sink = -sum_i p_sink,i * Di.
        if (sinks != nullptr)
          for (int64_t i = 0; i < S; ++i) dsinks[h] -= std::exp(to_f32(sinks[h]) - L[i]) * Di[i];
        for (int64_t i = 0; i < S; ++i) {
          const float* qi = &Q[i * D];
          const float* doi = &dO[i * D];
          float* dqi = &dQ[i * D];
          for (int64_t j = first_key(mask, b, i, S), last = last_key(mask, b, i); j <= last; ++j) {
            const float p = std::exp(dot(qi, &K[j * D], D) * sh.scale - L[i]);
            // Di = dO_i . O_i = sum_j P_ij f_ij dP_ij still, with f the dropout factor.
            const float f = drop.on() ? drop(b, h, i, j) : 1.0f;
            const float dp = dot(doi, &V[j * D], D) * f;
            const float ds = p * (dp - Di[i]) * sh.scale;
            const float pv = p * f;
            float* dvj = &dV[j * D];
            float* dkj = &dK[j * D];
            const float* kj = &K[j * D];
            for (int64_t d = 0; d < D; ++d) {
              dvj[d] += pv * doi[d];
              dqi[d] += ds * kj[d];
              dkj[d] += ds * qi[d];
            }
          }
        }
        store_head(dq, dQ, b, h, S, sh.Hq, D);
      }
      store_head(dk, dK, b, kvh, S, sh.Hkv, D);
      store_head(dv, dV, b, kvh, S, sh.Hkv, D);
    }
  }
  if (sinks != nullptr)
    for (int64_t h = 0; h < sh.Hq; ++h) dsinks_acc[h] = from_f32<T>(to_f32(dsinks_acc[h]) + dsinks[h]);
}

template void attention_forward<float>(float*, float*, const float*, const float*, const float*,
                                       const AttentionShape&, const AttentionMask&);
template void attention_forward<bf16>(bf16*, float*, const bf16*, const bf16*, const bf16*, const AttentionShape&,
                                      const AttentionMask&);
template void attention_backward<float>(float*, float*, float*, const float*, const float*, const float*,
                                        const float*, const float*, const float*, const AttentionShape&,
                                        const AttentionMask&, float*);
template void attention_backward<bf16>(bf16*, bf16*, bf16*, const bf16*, const bf16*, const bf16*, const bf16*,
                                       const bf16*, const float*, const AttentionShape&, const AttentionMask&, bf16*);

}  // namespace so::cpu
