// Causal grouped-query attention in query blocks: a block of kQueryBlock query rows takes its
// scores against every key it may see as one BLAS GEMM into an fp32 tile, an exact softmax per
// row, and one more GEMM with V, so memory is O(kQueryBlock * S) per head and the S x S score
// matrix never exists. Backward recomputes the tile's probabilities from the saved log-sum-exp
// (FA2) and forms dQ, dK and dV as GEMMs of the tile.
// The mask (documents, window, padding) narrows each row to the keys [first_key(i), last_key(i)];
// a row with none outputs zero. A sink adds one logit to the row's softmax after the keys (lse
// includes it, so backward needs nothing more).
// Dropout scales each P_ij by keep_ij / (1 - p) where it meets V (forward) or dO V^T (backward);
// lse and the normaliser stay the undropped softmax's.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_exp.h"
#include "cpu_kernels.h"
#include "so/core/error.h"

namespace so::cpu {

namespace {

constexpr int64_t kQueryBlock = 64;

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

// A block of query rows [q0, q0 + n) of one head against the keys it may see, [lo, hi): scores
// and probabilities are held as a dense fp32 [n, hi - lo] tile (memory O(kQueryBlock * S) per
// head) so that its products are BLAS GEMMs; entries outside a row's keys are masked.
struct QueryBlock {
  int64_t q0, n, lo, hi;
  int64_t width() const { return hi - lo; }
};

QueryBlock query_block(const AttentionMask& mask, int64_t b, int64_t q0, int64_t S) {
  QueryBlock blk{q0, std::min(kQueryBlock, S - q0), 0, 0};
  blk.hi = q0 + blk.n;
  blk.lo = blk.hi;  // first_key is not monotone across documents: the least over the rows
  for (int64_t i = q0; i < blk.hi; ++i) blk.lo = std::min(blk.lo, first_key(mask, b, i, S));
  // No row sees a key from the row's padding on: a block of padding queries stops at it (and has
  // no keys at all where its window starts after it).
  if (mask.key_end != nullptr) blk.hi = std::min<int64_t>(blk.hi, mask.key_end[b]);
  blk.lo = std::min(blk.lo, blk.hi);
  return blk;
}

// Row i's keys as columns of its block's tile: [first, last], empty where last < first.
struct TileRow {
  int64_t first, last;
};
TileRow tile_row(const AttentionMask& mask, const QueryBlock& blk, int64_t b, int64_t i, int64_t S) {
  return {std::min(first_key(mask, b, i, S) - blk.lo, blk.width()), last_key(mask, b, i) - blk.lo};
}

// fp32 GEMM of the tiles (row-major, contiguous): C = alpha * op(A) @ op(B) + beta * C.
void tile_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, const float* B,
               float beta, float* C) {
  gemm(ta, tb, M, N, K, alpha, A, B, DType::F32, beta, C, DType::F32);
}

}  // namespace

template <typename T>
void attention_forward(T* out, float* lse, const T* q, const T* k, const T* v, const AttentionShape& sh,
                       const AttentionMask& mask) {
  check_shape(sh, mask);
  const T* sinks = static_cast<const T*>(mask.sinks);
  const int64_t S = sh.S, D = sh.D, group = sh.Hq / sh.Hkv;
  const DropFactor drop{mask, S};
  std::vector<float> K, V, Q, O(static_cast<size_t>(S * D)), P(static_cast<size_t>(kQueryBlock * S));
  for (int64_t b = 0; b < sh.B; ++b) {
    for (int64_t kvh = 0; kvh < sh.Hkv; ++kvh) {
      load_head(K, k, b, kvh, S, sh.Hkv, D);
      load_head(V, v, b, kvh, S, sh.Hkv, D);
      for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        load_head(Q, q, b, h, S, sh.Hq, D);
        for (int64_t q0 = 0; q0 < S; q0 += kQueryBlock) {
          const QueryBlock blk = query_block(mask, b, q0, S);
          const int64_t W = blk.width();
          tile_gemm(false, true, blk.n, W, D, sh.scale, &Q[q0 * D], &K[blk.lo * D], 0.0f, P.data());
          for (int64_t r = 0; r < blk.n; ++r) {
            const int64_t i = q0 + r;
            const auto [first, last] = tile_row(mask, blk, b, i, S);
            float* p = &P[r * W];
            float m = -INFINITY;
            for (int64_t c = first; c <= last; ++c) m = std::max(m, p[c]);
            exp_shifted(p + first, p + first, m, last + 1 - first);
            float l = 0.0f;
            for (int64_t c = first; c <= last; ++c) l += p[c];
            // A row that sees no key (l = 0): zero output, lse -inf (then the sink's alone).
            float row_lse = m + std::log(l), inv_l = l > 0.0f ? 1.0f / l : 0.0f;
            if (sinks != nullptr) {  // the sink's share of the row leaves the keys' output scaled down
              const float sink = to_f32(sinks[h]);
              const float hi = std::max(row_lse, sink);
              const float with_sink = hi + std::log(std::exp(row_lse - hi) + std::exp(sink - hi));
              inv_l *= std::exp(row_lse - with_sink);
              row_lse = with_sink;
            }
            for (int64_t c = first; c <= last; ++c) p[c] *= drop.on() ? inv_l * drop(b, h, i, blk.lo + c) : inv_l;
            for (int64_t c = 0; c < first; ++c) p[c] = 0.0f;
            for (int64_t c = std::max(last + 1, first); c < W; ++c) p[c] = 0.0f;
            lse[(b * sh.Hq + h) * S + i] = row_lse;
          }
          tile_gemm(false, false, blk.n, D, W, 1.0f, P.data(), &V[blk.lo * D], 0.0f, &O[q0 * D]);
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
      dV(static_cast<size_t>(S * D)), Di(static_cast<size_t>(S)), P(static_cast<size_t>(kQueryBlock * S)),
      dP(static_cast<size_t>(kQueryBlock * S));
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
        const float* L = lse + (b * sh.Hq + h) * S;
        for (int64_t i = 0; i < S; ++i) Di[i] = dot(&dO[i * D], &O[i * D], D);
        // d lse/d sink = p_sink; the sink's value is zero, so d loss/d sink = -sum_i p_sink,i * Di.
        if (sinks != nullptr)
          for (int64_t i = 0; i < S; ++i) dsinks[h] -= std::exp(to_f32(sinks[h]) - L[i]) * Di[i];
        for (int64_t q0 = 0; q0 < S; q0 += kQueryBlock) {
          const QueryBlock blk = query_block(mask, b, q0, S);
          const int64_t W = blk.width();
          // P from the saved log-sum-exp; dP = dO V^T.
          tile_gemm(false, true, blk.n, W, D, sh.scale, &Q[q0 * D], &K[blk.lo * D], 0.0f, P.data());
          tile_gemm(false, true, blk.n, W, D, 1.0f, &dO[q0 * D], &V[blk.lo * D], 0.0f, dP.data());
          for (int64_t r = 0; r < blk.n; ++r) {
            const int64_t i = q0 + r;
            const auto [first, last] = tile_row(mask, blk, b, i, S);
            float* p = &P[r * W];
            float* ds = &dP[r * W];  // dP becomes dS in place; P becomes P * f (dV's factor)
            for (int64_t c = 0; c < first; ++c) p[c] = ds[c] = 0.0f;
            exp_shifted(p + first, p + first, L[i], last + 1 - first);
            for (int64_t c = first; c <= last; ++c) {
              const float pij = p[c];
              // Di = dO_i . O_i = sum_j P_ij f_ij dP_ij still, with f the dropout factor.
              const float f = drop.on() ? drop(b, h, i, blk.lo + c) : 1.0f;
              ds[c] = pij * (ds[c] * f - Di[i]) * sh.scale;
              p[c] = pij * f;
            }
            for (int64_t c = std::max(last + 1, first); c < W; ++c) p[c] = ds[c] = 0.0f;
          }
          tile_gemm(false, false, blk.n, D, W, 1.0f, dP.data(), &K[blk.lo * D], 0.0f, &dQ[q0 * D]);
          tile_gemm(true, false, W, D, blk.n, 1.0f, dP.data(), &Q[q0 * D], 1.0f, &dK[blk.lo * D]);
          tile_gemm(true, false, W, D, blk.n, 1.0f, P.data(), &dO[q0 * D], 1.0f, &dV[blk.lo * D]);
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

template void attention_forward<float>(float*, float*, const float*, const float*, const float*, const AttentionShape&,
                                       const AttentionMask&);
template void attention_forward<bf16>(bf16*, float*, const bf16*, const bf16*, const bf16*, const AttentionShape&,
                                      const AttentionMask&);
template void attention_backward<float>(float*, float*, float*, const float*, const float*, const float*, const float*,
                                        const float*, const float*, const AttentionShape&, const AttentionMask&,
                                        float*);
template void attention_backward<bf16>(bf16*, bf16*, bf16*, const bf16*, const bf16*, const bf16*, const bf16*,
                                       const bf16*, const float*, const AttentionShape&, const AttentionMask&, bf16*);

}  // namespace so::cpu
