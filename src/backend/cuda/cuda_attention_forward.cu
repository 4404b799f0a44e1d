// Causal GQA flash-attention forward (FlashAttention-2): one block per (query tile, query head,
// batch); K/V tiles stream through shared memory under an online softmax; key tiles wholly above
// the diagonal or in the row's padding, or before the first key the mask lets the tile's first row
// see, are never visited.
// Writes out and lse = logsumexp of the scaled scores (natural log), sink included. Dropout scales
// P where it meets V; the normaliser and lse are the undropped softmax's.
// Variants and dispatch: cuda_attention_common.cuh.
#include <cmath>

#include "cuda_attention.h"
#include "cuda_attention_common.cuh"

namespace so::cuda {

namespace {

using namespace attn;
namespace wmma = nvcuda::wmma;

// ---- variant 1: fp32 math from shared-memory tiles ----

// kRefTile query rows and keys per tile (cuda_attention_common.cuh). With documents or a window a
// row can see no key of a visited tile (guarded below).

// sQ, sK, sV, sO [32][D+1] (odd stride: the score loop reads K rows lane by lane without bank
// conflicts), sS [32][33], sM, sL, sCorr [32].
size_t ref_forward_smem(int64_t D) {
  return sizeof(float) * (4 * kRefTile * (D + 1) + kRefTile * (kRefTile + 1) + 3 * kRefTile);
}

template <typename T>
__global__ void __launch_bounds__(kRefThreads)
    ref_forward_kernel(T* out, float* lse, const T* q, const T* k, const T* v, int S, int Hq, int Hkv, int D,
                       float scale, DeviceMask mask, const T* sinks) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int ld = D + 1;
  float* sQ = reinterpret_cast<float*>(smem);
  float* sK = sQ + kRefTile * ld;
  float* sV = sK + kRefTile * ld;
  float* sO = sV + kRefTile * ld;
  float* sS = sO + kRefTile * ld;
  float* sM = sS + kRefTile * (kRefTile + 1);
  float* sL = sM + kRefTile;
  float* sCorr = sL + kRefTile;

  const int qt = gridDim.x - 1 - blockIdx.x;  // longest causal rows first: better tail balance
  const int h = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int kvh = h / (Hq / Hkv);
  const int q0 = qt * kRefTile;
  const int rows = min(kRefTile, S - q0);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  for (int i = tid; i < kRefTile * D; i += kRefThreads) {
    const int r = i / D, d = i % D;
    sQ[r * ld + d] = r < rows ? to_float(q[row_offset(b, q0 + r, h, S, Hq, D) + d]) : 0.0f;
    sO[r * ld + d] = 0.0f;
  }
  if (tid < kRefTile) {
    sM[tid] = -INFINITY;
    sL[tid] = 0.0f;
  }

  const int nkt = mask.last_key(b, q0 + rows - 1) / kRefTile + 1;  // tiles holding a key the last row sees
  for (int kt = mask.first_key(b, q0, S) / kRefTile; kt < nkt; ++kt) {
    const int k0 = kt * kRefTile;
    __syncthreads();  // the previous tile's sK/sV/sS readers are done (first pass: init visible)
    for (int i = tid; i < kRefTile * D; i += kRefThreads) {
      const int c = i / D, d = i % D;
      const bool in = k0 + c < S;
      const int64_t off = row_offset(b, k0 + c, kvh, S, Hkv, D) + d;
      sK[c * ld + d] = in ? to_float(k[off]) : 0.0f;
      sV[c * ld + d] = in ? to_float(v[off]) : 0.0f;
    }
    __syncthreads();
    for (int i = tid; i < kRefTile * kRefTile; i += kRefThreads) {
      const int r = i / kRefTile, c = i % kRefTile;
      float s = -INFINITY;
      if (mask.visible(b, q0 + r, k0 + c, S)) {
        const float* qr = sQ + r * ld;
        const float* kc = sK + c * ld;
        float acc = 0.0f;
        for (int d = 0; d < D; ++d) acc += qr[d] * kc[d];
        s = acc * scale;
      }
      sS[r * (kRefTile + 1) + c] = s;
    }
    __syncthreads();
    // Online softmax, one warp per row, lane = key.
    for (int r = warp; r < kRefTile; r += kRefThreads / 32) {
      const float s = sS[r * (kRefTile + 1) + lane];
      const float m_old = sM[r];
      const float m_new = fmaxf(m_old, warp_max(s));
      // A row that has seen no key yet (mask) keeps m = -inf: the guards keep -inf - -inf from NaN.
      const float p = m_new == -INFINITY ? 0.0f : expf(s - m_new);
      // The normaliser sums the undropped P; only P V sees dropout.
      sS[r * (kRefTile + 1) + lane] = mask.dropping && p != 0.0f ? p * mask.drop(b, h, q0 + r, k0 + lane, S) : p;
      const float sum = warp_sum(p);
      __syncwarp();  // all lanes have read sM[r] before lane 0 overwrites it
      if (lane == 0) {
        const float corr = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
        sCorr[r] = corr;
        sL[r] = sL[r] * corr + sum;
        sM[r] = m_new;
      }
    }
    __syncthreads();
    for (int i = tid; i < kRefTile * D; i += kRefThreads) {
      const int r = i / D, d = i % D;
      const float* p = sS + r * (kRefTile + 1);
      float acc = sO[r * ld + d] * sCorr[r];
      for (int c = 0; c < kRefTile; ++c) acc += p[c] * sV[c * ld + d];
      sO[r * ld + d] = acc;
    }
  }
  __syncthreads();
  if (tid < rows) {
    float row_lse = sM[tid] + logf(sL[tid]);
    float factor = inverse_normaliser(sL[tid]);
    if (sinks != nullptr) factor *= add_sink(row_lse, to_float(sinks[h]));
    sCorr[tid] = factor;
    lse[(b * Hq + h) * S + q0 + tid] = row_lse;
  }
  __syncthreads();
  for (int i = tid; i < rows * D; i += kRefThreads) {
    const int r = i / D, d = i % D;
    out[row_offset(b, q0 + r, h, S, Hq, D) + d] = from_float<T>(sO[r * ld + d] * sCorr[r]);
  }
}

template <typename T>
void launch_ref_forward(cudaStream_t stream, void* out, float* lse, const void* q, const void* k, const void* v,
                        int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t D, float scale, DeviceMask mask,
                        const void* sinks) {
  launch_tiles(ref_forward_kernel<T>, "attention forward (reference)", kRefTile, kRefThreads, ref_forward_smem(D),
               stream, S, Hq, B, D, static_cast<T*>(out), lse, static_cast<const T*>(q), static_cast<const T*>(k),
               static_cast<const T*>(v), S, Hq, Hkv, D, scale, mask, static_cast<const T*>(sinks));
}

// ---- variant 2: bf16 tensor cores (wmma 16x16x16, fp32 accumulate) ----

// kTcTile (64) query rows per block, 4 warps of 16 rows each; K/V tiles of 64 keys.

template <int D>
struct TcForwardLayout {
  static constexpr int kLdh = D + 8;                            // bf16 tile row stride (wmma: multiple of 8)
  static constexpr int kLds = (D > kTcTile ? D : kTcTile) + 4;  // fp32 scores / output staging stride
  static constexpr int kLdp = kTcTile + 8;                      // bf16 probabilities row stride
  // Byte offsets; every region starts 32-byte aligned as wmma requires.
  static constexpr size_t kIdx = 0;
  static constexpr size_t kK = kIdx + 256 * sizeof(float);
  static constexpr size_t kV = kK + size_t(kTcTile) * kLdh * sizeof(Bf16);
  static constexpr size_t kS = kV + size_t(kTcTile) * kLdh * sizeof(Bf16);
  static constexpr size_t kP = kS + size_t(4) * 16 * kLds * sizeof(float);
  static constexpr size_t kCorr = kP + size_t(4) * 16 * kLdp * sizeof(Bf16);
  static constexpr size_t kBytes = kCorr + size_t(4) * 16 * sizeof(float);
  static_assert(kK % 32 == 0 && kV % 32 == 0 && kS % 32 == 0 && kP % 32 == 0 && kCorr % 32 == 0);
};

template <int D>
__global__ void __launch_bounds__(kTcThreads)
    tc_forward_kernel(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int S, int Hq, int Hkv,
                      float scale_log2, DeviceMask mask, const bf16* sinks) {
  using L = TcForwardLayout<D>;
  constexpr int kDt = D / 16;  // 16-wide slices of the head dim
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float* sIdx = reinterpret_cast<float*>(smem + L::kIdx);
  Bf16* sK = reinterpret_cast<Bf16*>(smem + L::kK);
  Bf16* sV = reinterpret_cast<Bf16*>(smem + L::kV);
  float* sS = reinterpret_cast<float*>(smem + L::kS) + warp * 16 * L::kLds;  // this warp's 16 rows
  Bf16* sP = reinterpret_cast<Bf16*>(smem + L::kP) + warp * 16 * L::kLdp;
  float* sCorr = reinterpret_cast<float*>(smem + L::kCorr) + warp * 16;

  const int qt = gridDim.x - 1 - blockIdx.x;  // longest causal rows first
  const int h = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int kvh = h / (Hq / Hkv);
  const int q0 = qt * kTcTile;

  // The Q tile passes through sK into per-warp A fragments that live for the whole kernel.
  fill_index_tile(sIdx);
  load_tile_bf16<D, L::kLdh>(sK, q, b, q0, h, S, Hq);
  __syncthreads();
  const FragIndex ix = load_frag_index(sIdx);
  wmma::fragment<wmma::matrix_a, 16, 16, 16, Bf16, wmma::row_major> qf[kDt];
#pragma unroll
  for (int kk = 0; kk < kDt; ++kk) wmma::load_matrix_sync(qf[kk], sK + warp * 16 * L::kLdh + kk * 16, L::kLdh);
  AccFrag of[kDt];
#pragma unroll
  for (int n = 0; n < kDt; ++n) wmma::fill_fragment(of[n], 0.0f);

  // Softmax statistics (log2 domain): lanes 2r and 2r+1 share row r of the warp, each holding half
  // of its 64 scores (interleaved columns: fewer bank conflicts).
  const int sr = lane >> 1, half = lane & 1;
  const int qrow = q0 + warp * 16 + sr;
  const int first = mask.first_key(b, qrow, S), last = mask.last_key(b, qrow);  // this row sees keys [first, last]
  float m = -INFINITY, l = 0.0f;

  const int last_kt = mask.last_key(b, q0 + kTcTile - 1) / kTcTile;
  for (int kt = mask.first_key(b, q0, S) / kTcTile; kt <= last_kt; ++kt) {
    const int k0 = kt * kTcTile;
    __syncthreads();  // previous readers of sK/sV (and of Q in sK) are done
    load_tile_bf16<D, L::kLdh>(sK, k, b, k0, kvh, S, Hkv);
    load_tile_bf16<D, L::kLdh>(sV, v, b, k0, kvh, S, Hkv);
    __syncthreads();

    // S = Q K^T for this warp's 16 rows x 64 keys. K^T as a col-major B: (d, key) at sK[key][d].
#pragma unroll
    for (int j = 0; j < kTcTile / 16; ++j) {
      AccFrag sf;
      wmma::fill_fragment(sf, 0.0f);
#pragma unroll
      for (int kk = 0; kk < kDt; ++kk) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, Bf16, wmma::col_major> kf;
        wmma::load_matrix_sync(kf, sK + j * 16 * L::kLdh + kk * 16, L::kLdh);
        wmma::mma_sync(sf, qf[kk], kf, sf);
      }
      wmma::store_matrix_sync(sS + j * 16, sf, L::kLds, wmma::mem_row_major);
    }
    __syncwarp();

    const float* srow = sS + sr * L::kLds;
    float tmax = -INFINITY;
    for (int j = 0; j < kTcTile / 2; ++j) {
      const int c = 2 * j + half;
      const float s = (k0 + c > last || k0 + c < first) ? -INFINITY : srow[c] * scale_log2;
      tmax = fmaxf(tmax, s);
    }
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
    // m_new stays -inf while the row has seen no key (mask); the guards keep that from NaN.
    const float m_new = fmaxf(m, tmax);
    const float corr = m_new == -INFINITY ? 1.0f : exp2f(m - m_new);  // 0 on the row's first keys (m = -inf)
    float psum = 0.0f;
    for (int j = 0; j < kTcTile / 2; ++j) {
      const int c = 2 * j + half;
      const float s = (k0 + c > last || k0 + c < first) ? -INFINITY : srow[c] * scale_log2;
      const float p = m_new == -INFINITY ? 0.0f : exp2f(s - m_new);
      psum += p;  // the normaliser sums the undropped P; only P V sees dropout
      sP[sr * L::kLdp + c] = __float2bfloat16_rn(mask.dropping && p != 0.0f ? p * mask.drop(b, h, qrow, k0 + c, S) : p);
    }
    psum += __shfl_xor_sync(0xffffffffu, psum, 1);
    l = l * corr + psum;
    m = m_new;
    if (half == 0) sCorr[sr] = corr;
    __syncwarp();

    // O = O * corr + P V.
    wmma::fragment<wmma::matrix_a, 16, 16, 16, Bf16, wmma::row_major> pf[kTcTile / 16];
#pragma unroll
    for (int kk = 0; kk < kTcTile / 16; ++kk) wmma::load_matrix_sync(pf[kk], sP + kk * 16, L::kLdp);
#pragma unroll
    for (int n = 0; n < kDt; ++n) {
#pragma unroll
      for (int e = 0; e < kAccElems; ++e) of[n].x[e] *= sCorr[ix.row[e]];
#pragma unroll
      for (int kk = 0; kk < kTcTile / 16; ++kk) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, Bf16, wmma::row_major> vf;
        wmma::load_matrix_sync(vf, sV + kk * 16 * L::kLdh + n * 16, L::kLdh);
        wmma::mma_sync(of[n], pf[kk], vf, of[n]);
      }
    }
  }

  __syncwarp();  // every lane is done reading sCorr
  if (half == 0) {
    float row_lse = (m + log2f(l)) * kLn2;
    float factor = inverse_normaliser(l);
    if (sinks != nullptr) factor *= add_sink(row_lse, to_float(sinks[h]));
    sCorr[sr] = factor;
    if (qrow < S) lse[(b * Hq + h) * S + qrow] = row_lse;
  }
  __syncwarp();
#pragma unroll
  for (int n = 0; n < kDt; ++n) {
#pragma unroll
    for (int e = 0; e < kAccElems; ++e) of[n].x[e] *= sCorr[ix.row[e]];
    wmma::store_matrix_sync(sS + n * 16, of[n], L::kLds, wmma::mem_row_major);
  }
  __syncwarp();
  store_rows_bf16<D>(out, sS, L::kLds, b, q0 + warp * 16, h, S, Hq);
}

template <int D>
void launch_tc_forward(cudaStream_t stream, void* out, float* lse, const void* q, const void* k, const void* v,
                       int64_t B, int64_t S, int64_t Hq, int64_t Hkv, float scale, DeviceMask mask, const void* sinks) {
  using L = TcForwardLayout<D>;
  launch_tiles(tc_forward_kernel<D>, "attention forward (tensor core)", kTcTile, kTcThreads, L::kBytes, stream, S, Hq,
               B, D, static_cast<bf16*>(out), lse, static_cast<const bf16*>(q), static_cast<const bf16*>(k),
               static_cast<const bf16*>(v), S, Hq, Hkv, scale * kLog2e, mask, static_cast<const bf16*>(sinks));
}

}  // namespace

void attention_forward(cudaStream_t stream, const AttentionShape& a, const AttentionMask& mask,
                       const AttentionInputs& in, void* out, float* lse) {
  constexpr const char* kWhat = "attention_forward";
  const auto [B, S, Hq, Hkv, D, scale, dt, q, k, v, dm] = checked_call(kWhat, a, mask, in);
  if (B == 0 || S == 0) return;
  if (select_variant(kWhat, D, dt) == 2) {
    check_aligned16(kWhat, {{"out", out}, {"q", q}, {"k", k}, {"v", v}});
    if (D == 64)
      launch_tc_forward<64>(stream, out, lse, q, k, v, B, S, Hq, Hkv, scale, dm, mask.sinks);
    else
      launch_tc_forward<128>(stream, out, lse, q, k, v, B, S, Hq, Hkv, scale, dm, mask.sinks);
  } else if (dt == DType::BF16) {
    launch_ref_forward<bf16>(stream, out, lse, q, k, v, B, S, Hq, Hkv, D, scale, dm, mask.sinks);
  } else {
    launch_ref_forward<float>(stream, out, lse, q, k, v, B, S, Hq, Hkv, D, scale, dm, mask.sinks);
  }
}

}  // namespace so::cuda
