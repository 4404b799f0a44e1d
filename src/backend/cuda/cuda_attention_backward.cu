// Causal GQA flash-attention backward (FlashAttention-2 recompute from the saved lse):
//   1. Drow[b, h, i] = sum_d dout * out (fp32, the workspace);
//   2. dK/dV: one block per (key tile, KV head, batch) loops over the GQA group's query heads and
//      the causal query tiles, recomputing P = exp(scale * q.k - lse) and dS = P * (dout.v - Drow)
//      * scale, and accumulates dV += P^T dout, dK += dS^T q on chip;
//   3. dQ: one block per (query tile, query head, batch) loops over the causal key tiles,
//      recomputing P and dS again, and accumulates dQ += dS k on chip;
//   4. with sinks, dsink[h] -= sum over rows of exp(sink - lse) * Drow (one block per head).
// Tiles the mask (documents, window) hides entirely are skipped in steps 2 and 3. Dropout (the
// mask's keep bits, recomputed) scales dP and the P of dV; Drow = dout . out needs no change.
// Step 3 repeats the score recompute of step 2 (FA2 instead adds dQ with atomics from step 2);
// we pay it because atomics make the summation order, and so the gradients, run-dependent, and the
// project requires bitwise identical runs. Every output element is summed by one thread in a
// fixed order. Variants and dispatch: cuda_attention_common.cuh.
#include <algorithm>
#include <cmath>

#include "cuda_attention.h"
#include "cuda_attention_common.cuh"
#include "cuda_launch.cuh"

namespace so::cuda {

namespace {

using namespace attn;
namespace wmma = nvcuda::wmma;

// Drow, one warp per (b, h, i) in drow's [B, Hq, S] order.
template <typename T>
__global__ void row_dot_kernel(float* drow, const T* dout, const T* out, int64_t B, int S, int Hq, int D) {
  const int lane = threadIdx.x & 31;
  const int64_t nrows = B * Hq * S;
  const int64_t stride = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; w < nrows; w += stride) {
    const int64_t i = w % S, bh = w / S;
    const int64_t off = row_offset(bh / Hq, i, bh % Hq, S, Hq, D);
    float acc = 0.0f;
    for (int d = lane; d < D; d += 32) acc += to_float(dout[off + d]) * to_float(out[off + d]);
    acc = warp_sum(acc);
    if (lane == 0) drow[w] = acc;
  }
}

// dsinks_acc[h] += -sum_{b,i} exp(sink[h] - lse[b,h,i]) * drow[b,h,i]: the sink column's
// probability times its (zero) value's gradient minus the row's mean. One block per head, a fixed
// summation order (bitwise repeatable).
template <typename T>
__global__ void sink_grad_kernel(T* dsinks_acc, const T* sinks, const float* lse, const float* drow, int64_t B, int S,
                                 int Hq) {
  constexpr int kThreads = 256;
  __shared__ float partial[kThreads];
  const int h = blockIdx.x;
  const float sink = to_float(sinks[h]);
  float acc = 0.0f;
  for (int64_t w = threadIdx.x; w < B * S; w += kThreads) {
    const int64_t row = (w / S * Hq + h) * S + w % S;
    acc += expf(sink - lse[row]) * drow[row];
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) dsinks_acc[h] = from_float<T>(to_float(dsinks_acc[h]) - partial[0]);
}

template <typename T>
void launch_sink_grad(cudaStream_t stream, void* dsinks_acc, const void* sinks, const float* lse, const float* drow,
                      int64_t B, int64_t S, int64_t Hq) {
  sink_grad_kernel<T><<<static_cast<unsigned>(Hq), 256, 0, stream>>>(static_cast<T*>(dsinks_acc),
                                                                     static_cast<const T*>(sinks), lse, drow, B,
                                                                     static_cast<int>(S), static_cast<int>(Hq));
  SO_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void launch_row_dot(cudaStream_t stream, float* drow, const void* dout, const void* out, int64_t B, int64_t S,
                    int64_t Hq, int64_t D) {
  constexpr int kThreads = 256;
  const int64_t warps = B * Hq * S;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((warps + 7) / 8, 1 << 20));
  row_dot_kernel<T><<<blocks, kThreads, 0, stream>>>(drow, static_cast<const T*>(dout), static_cast<const T*>(out), B,
                                                     static_cast<int>(S), static_cast<int>(Hq), static_cast<int>(D));
  SO_CUDA_CHECK(cudaGetLastError());
}

// ---- variant 1: fp32 math from shared-memory tiles ----

// Query and key tiles of kRefTile (aligned and equal, so query tile qt needs key tiles 0..qt and
// key tile kt needs query tiles kt..). Row stride D+1 (odd): the score loops read K/V rows lane by
// lane without bank conflicts.
constexpr int kRefLdp = kRefTile + 1;

// The shared memory of both backward kernels: Q, dO, K, V tiles and `accumulators` more [32][D+1]
// (dK and dV, or dQ); the dS tile [32][33] and, with `probabilities` (dK/dV), P; the tile rows'
// lse and Drow [32]. With smem null only the size (the launch's) is computed.
struct RefBackwardTiles {
  float *q, *dout, *k, *v, *acc0, *acc1, *p, *ds, *lse, *drow;
  size_t bytes;
};
__host__ __device__ inline RefBackwardTiles ref_backward_tiles(unsigned char* smem, int64_t D, int accumulators,
                                                               bool probabilities) {
  RefBackwardTiles t{};
  float* at = reinterpret_cast<float*>(smem);
  size_t used = 0;
  const auto take = [&](size_t n) {
    float* p = at != nullptr ? at + used : nullptr;
    used += n;
    return p;
  };
  const size_t tile = static_cast<size_t>(kRefTile) * static_cast<size_t>(D + 1);
  t.q = take(tile), t.dout = take(tile), t.k = take(tile), t.v = take(tile);
  t.acc0 = take(tile);
  if (accumulators > 1) t.acc1 = take(tile);
  if (probabilities) t.p = take(kRefTile * kRefLdp);
  t.ds = take(kRefTile * kRefLdp);
  t.lse = take(kRefTile), t.drow = take(kRefTile);
  t.bytes = used * sizeof(float);
  return t;
}
size_t ref_dkdv_smem(int64_t D) { return ref_backward_tiles(nullptr, D, 2, true).bytes; }
size_t ref_dq_smem(int64_t D) { return ref_backward_tiles(nullptr, D, 1, false).bytes; }

// Loads rows [s0, s0 + 32) of head h into a [32][ld] fp32 tile, zero at or beyond S.
template <typename T>
__device__ __forceinline__ void ref_load_tile(float* dst, int ld, const T* src, int64_t b, int s0, int h, int S, int H,
                                              int D) {
  for (int i = threadIdx.x; i < kRefTile * D; i += kRefThreads) {
    const int r = i / D, d = i % D;
    dst[r * ld + d] = s0 + r < S ? to_float(src[row_offset(b, s0 + r, h, S, H, D) + d]) : 0.0f;
  }
}

// P and dS for query rows q0.. and keys k0.. of the tiles in shared memory (index [r][c] = query r,
// key c); zero where masked (outside the query's [first_key, last_key]) or the query is padding
// (>= S). sP may be null (the dQ pass needs dS only).
__device__ __forceinline__ void ref_scores(float* sP, float* sdS, const float* sQ, const float* sdO, const float* sK,
                                           const float* sV, const float* sLse, const float* sDrow, int ld, int D,
                                           int q0, int k0, int S, float scale, const DeviceMask& mask, int64_t b,
                                           int h) {
  for (int i = threadIdx.x; i < kRefTile * kRefTile; i += kRefThreads) {
    const int r = i / kRefTile, c = i % kRefTile;
    float p = 0.0f, ds = 0.0f;
    if (q0 + r < S && mask.visible(b, q0 + r, k0 + c, S)) {
      const float* qr = sQ + r * ld;
      const float* dor = sdO + r * ld;
      const float* kc = sK + c * ld;
      const float* vc = sV + c * ld;
      float s = 0.0f, dp = 0.0f;
      for (int d = 0; d < D; ++d) {
        s += qr[d] * kc[d];
        dp += dor[d] * vc[d];
      }
      p = expf(s * scale - sLse[r]);
      // Dropout: dP and dV's P dropped and scaled; Drow = dO . O is still sum_j P dP.
      const float f = mask.dropping ? mask.drop(b, h, q0 + r, k0 + c, S) : 1.0f;
      ds = p * (dp * f - sDrow[r]) * scale;
      p *= f;
    }
    if (sP != nullptr) sP[r * kRefLdp + c] = p;
    sdS[r * kRefLdp + c] = ds;
  }
}

template <typename T>
__global__ void __launch_bounds__(kRefThreads)
    ref_dkdv_kernel(T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const float* lse,
                    const float* drow, int S, int Hq, int Hkv, int D, float scale, DeviceMask mask) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int ld = D + 1;
  const RefBackwardTiles tiles = ref_backward_tiles(smem, D, 2, true);
  float *sK = tiles.k, *sV = tiles.v, *sQ = tiles.q, *sdO = tiles.dout, *sdK = tiles.acc0, *sdV = tiles.acc1,
        *sP = tiles.p, *sdS = tiles.ds, *sLse = tiles.lse, *sDrow = tiles.drow;

  const int kt = blockIdx.x;  // low key tiles see the most queries and start first
  const int kvh = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int group = Hq / Hkv;
  const int k0 = kt * kRefTile;
  const int tid = threadIdx.x;

  ref_load_tile(sK, ld, k, b, k0, kvh, S, Hkv, D);
  ref_load_tile(sV, ld, v, b, k0, kvh, S, Hkv, D);
  // Thread i owns dK/dV elements i, i + 128, ... for the whole kernel (same mapping below).
  for (int i = tid; i < kRefTile * D; i += kRefThreads) {
    const int c = i / D, d = i % D;
    sdK[c * ld + d] = 0.0f;
    sdV[c * ld + d] = 0.0f;
  }
  const int nqt = (S + kRefTile - 1) / kRefTile;
  for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
    const float* lse_h = lse + (b * Hq + h) * S;
    const float* drow_h = drow + (b * Hq + h) * S;
    for (int qt = kt; qt < nqt; ++qt) {
      const int q0 = qt * kRefTile;
      // first_key only grows along the row: once a tile's queries are past this key tile, all are.
      if (!mask.tile_visible(b, q0, q0 + kRefTile - 1, k0, k0 + kRefTile - 1, S)) break;
      __syncthreads();  // previous tile's readers of sQ/sdO/sP/sdS/sLse/sDrow are done
      ref_load_tile(sQ, ld, q, b, q0, h, S, Hq, D);
      ref_load_tile(sdO, ld, dout, b, q0, h, S, Hq, D);
      if (tid < kRefTile) {
        sLse[tid] = q0 + tid < S ? lse_h[q0 + tid] : 0.0f;
        sDrow[tid] = q0 + tid < S ? drow_h[q0 + tid] : 0.0f;
      }
      __syncthreads();
      ref_scores(sP, sdS, sQ, sdO, sK, sV, sLse, sDrow, ld, D, q0, k0, S, scale, mask, b, h);
      __syncthreads();
      for (int i = tid; i < kRefTile * D; i += kRefThreads) {
        const int c = i / D, d = i % D;
        float av = sdV[c * ld + d], ak = sdK[c * ld + d];
        for (int r = 0; r < kRefTile; ++r) {
          av += sP[r * kRefLdp + c] * sdO[r * ld + d];
          ak += sdS[r * kRefLdp + c] * sQ[r * ld + d];
        }
        sdV[c * ld + d] = av;
        sdK[c * ld + d] = ak;
      }
    }
  }
  for (int i = tid; i < kRefTile * D; i += kRefThreads) {  // same ownership as the accumulation
    const int c = i / D, d = i % D;
    if (k0 + c >= S) continue;
    const int64_t off = row_offset(b, k0 + c, kvh, S, Hkv, D) + d;
    dk[off] = from_float<T>(sdK[c * ld + d]);
    dv[off] = from_float<T>(sdV[c * ld + d]);
  }
}

template <typename T>
__global__ void __launch_bounds__(kRefThreads)
    ref_dq_kernel(T* dq, const T* dout, const T* q, const T* k, const T* v, const float* lse, const float* drow, int S,
                  int Hq, int Hkv, int D, float scale, DeviceMask mask) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int ld = D + 1;
  const RefBackwardTiles tiles = ref_backward_tiles(smem, D, 1, false);
  float *sQ = tiles.q, *sdO = tiles.dout, *sK = tiles.k, *sV = tiles.v, *sdQ = tiles.acc0, *sdS = tiles.ds,
        *sLse = tiles.lse, *sDrow = tiles.drow;

  const int qt = gridDim.x - 1 - blockIdx.x;  // longest causal rows first
  const int h = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int kvh = h / (Hq / Hkv);
  const int q0 = qt * kRefTile;
  const int tid = threadIdx.x;

  ref_load_tile(sQ, ld, q, b, q0, h, S, Hq, D);
  ref_load_tile(sdO, ld, dout, b, q0, h, S, Hq, D);
  if (tid < kRefTile) {
    sLse[tid] = q0 + tid < S ? lse[(b * Hq + h) * S + q0 + tid] : 0.0f;
    sDrow[tid] = q0 + tid < S ? drow[(b * Hq + h) * S + q0 + tid] : 0.0f;
  }
  for (int i = tid; i < kRefTile * D; i += kRefThreads) {  // thread-owned, as in the dK/dV kernel
    const int r = i / D, d = i % D;
    sdQ[r * ld + d] = 0.0f;
  }
  const int last_kt = mask.last_key(b, q0 + kRefTile - 1) / kRefTile;
  for (int kt = mask.first_key(b, q0, S) / kRefTile; kt <= last_kt; ++kt) {
    const int k0 = kt * kRefTile;
    __syncthreads();  // previous tile's readers of sK/sV/sdS are done (first pass: loads visible)
    ref_load_tile(sK, ld, k, b, k0, kvh, S, Hkv, D);
    ref_load_tile(sV, ld, v, b, k0, kvh, S, Hkv, D);
    __syncthreads();
    ref_scores(nullptr, sdS, sQ, sdO, sK, sV, sLse, sDrow, ld, D, q0, k0, S, scale, mask, b, h);
    __syncthreads();
    for (int i = tid; i < kRefTile * D; i += kRefThreads) {
      const int r = i / D, d = i % D;
      float acc = sdQ[r * ld + d];
      for (int c = 0; c < kRefTile; ++c) acc += sdS[r * kRefLdp + c] * sK[c * ld + d];
      sdQ[r * ld + d] = acc;
    }
  }
  for (int i = tid; i < kRefTile * D; i += kRefThreads) {
    const int r = i / D, d = i % D;
    if (q0 + r < S) dq[row_offset(b, q0 + r, h, S, Hq, D) + d] = from_float<T>(sdQ[r * ld + d]);
  }
}

template <typename T>
void launch_ref_backward(cudaStream_t stream, void* dq, void* dk, void* dv, const void* dout, const void* q,
                         const void* k, const void* v, const float* lse, const float* drow, int64_t B, int64_t S,
                         int64_t Hq, int64_t Hkv, int64_t D, float scale, DeviceMask mask) {
  const auto *tq = static_cast<const T*>(q), *tk = static_cast<const T*>(k), *tv = static_cast<const T*>(v),
             *tdout = static_cast<const T*>(dout);
  launch_tiles(ref_dkdv_kernel<T>, "attention backward dK/dV (reference)", kRefTile, kRefThreads, ref_dkdv_smem(D),
               stream, S, Hkv, B, D, static_cast<T*>(dk), static_cast<T*>(dv), tdout, tq, tk, tv, lse, drow, S, Hq, Hkv,
               D, scale, mask);
  launch_tiles(ref_dq_kernel<T>, "attention backward dQ (reference)", kRefTile, kRefThreads, ref_dq_smem(D), stream, S,
               Hq, B, D, static_cast<T*>(dq), tdout, tq, tk, tv, lse, drow, S, Hq, Hkv, D, scale, mask);
}

// ---- variant 2: bf16 tensor cores (wmma 16x16x16, fp32 accumulate) ----

// Tiles of kTcTile (64) queries and 64 keys, 4 warps; each warp owns 16 rows of the block's tile
// (keys in the dK/dV kernel, queries in the dQ kernel) and walks the other side in 16-wide chunks,
// so only its dK+dV (or dQ) accumulators stay in registers.

template <int D>
struct TcBackwardLayout {
  static constexpr int kLdh = D + 8;   // bf16 tile row stride (wmma: multiple of 8)
  static constexpr int kLdc = 16 + 8;  // bf16 16x16 chunk stride
  static constexpr int kLdo = D + 4;   // fp32 output staging stride
  static constexpr size_t kTile = size_t(kTcTile) * kLdh * sizeof(Bf16);
  // Byte offsets, each 32-byte aligned as wmma requires: index map, four bf16 tiles, lse/Drow of
  // the 64 query rows, two 16x16 bf16 chunks per warp. Output staging reuses tiles 2-3 or 0-1.
  static constexpr size_t kIdx = 0;
  static constexpr size_t kT0 = kIdx + 256 * sizeof(float);
  static constexpr size_t kT1 = kT0 + kTile;
  static constexpr size_t kT2 = kT1 + kTile;
  static constexpr size_t kT3 = kT2 + kTile;
  static constexpr size_t kRows = kT3 + kTile;
  static constexpr size_t kChunk = kRows + 2 * kTcTile * sizeof(float);
  static constexpr size_t kChunkBytes = size_t(16) * kLdc * sizeof(Bf16);
  static constexpr size_t kBytes = kChunk + 4 * 2 * kChunkBytes;
  static_assert(kT0 % 32 == 0 && kTile % 32 == 0 && kChunk % 32 == 0 && kChunkBytes % 32 == 0);
  static_assert(size_t(4) * 16 * kLdo * sizeof(float) <= 2 * kTile, "output staging must fit in two tiles");

  // The regions at those offsets in a block's shared memory, as both kernels name them: the
  // index map, the K, V, Q and dO tiles, the rows' lse (as log2) and Drow, and this warp's first
  // chunk (its second follows at + kChunkBytes).
  struct Regions {
    float* idx;
    Bf16 *k, *v, *q, *dout;
    float *lse2, *drow;
    Bf16* chunk;
  };
  __device__ static Regions regions(unsigned char* smem, int warp) {
    float* rows = reinterpret_cast<float*>(smem + kRows);
    return {reinterpret_cast<float*>(smem + kIdx),
            reinterpret_cast<Bf16*>(smem + kT0),
            reinterpret_cast<Bf16*>(smem + kT1),
            reinterpret_cast<Bf16*>(smem + kT2),
            reinterpret_cast<Bf16*>(smem + kT3),
            rows,
            rows + kTcTile,
            reinterpret_cast<Bf16*>(smem + kChunk + 2 * warp * kChunkBytes)};
  }
};

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, Bf16, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, Bf16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, Bf16, wmma::col_major>;

// acc = X Y^T for 16 rows of X (a [.][ld] tile at x) and 16 rows of Y (at y), both D wide.
template <int D, int LD>
__device__ __forceinline__ void mma_abt(AccFrag& acc, const Bf16* x, const Bf16* y) {
  wmma::fill_fragment(acc, 0.0f);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    FragA a;
    FragBCol bt;  // (d, row of Y) at y[row * LD + d]: Y^T
    wmma::load_matrix_sync(a, x + kk * 16, LD);
    wmma::load_matrix_sync(bt, y + kk * 16, LD);
    wmma::mma_sync(acc, a, bt, acc);
  }
}

// acc[n] += A Y[:, 16n..16n+15] for a 16x16 bf16 chunk A (stride kLdc) and 16 rows of a D-wide
// tile Y at y.
template <int D, int LD, int LDC>
__device__ __forceinline__ void mma_chunk_rows(AccFrag (&acc)[D / 16], const Bf16* a_chunk, const Bf16* y) {
  FragA a;
  wmma::load_matrix_sync(a, a_chunk, LDC);
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    FragBRow bf;
    wmma::load_matrix_sync(bf, y + n * 16, LD);
    wmma::mma_sync(acc[n], a, bf, acc[n]);
  }
}

// One warp stages its 16 x D accumulators as fp32 and writes them as bf16 rows s0.. of head h.
template <int D, int LDO>
__device__ __forceinline__ void store_acc_rows(bf16* dst, float* stage, const AccFrag (&acc)[D / 16], int64_t b, int s0,
                                               int h, int S, int H) {
#pragma unroll
  for (int n = 0; n < D / 16; ++n) wmma::store_matrix_sync(stage + n * 16, acc[n], LDO, wmma::mem_row_major);
  __syncwarp();
  store_rows_bf16<D>(dst, stage, LDO, b, s0, h, S, H);
  __syncwarp();  // the stage is free again
}

// Loads lse (as log2) and Drow of query rows q0..q0+63 of head h into shared memory.
__device__ __forceinline__ void load_row_stats(float* sLse2, float* sDrow, const float* lse_h, const float* drow_h,
                                               int q0, int S) {
  for (int i = threadIdx.x; i < kTcTile; i += blockDim.x) {
    const bool in = q0 + i < S;
    sLse2[i] = in ? lse_h[q0 + i] * kLog2e : 0.0f;
    sDrow[i] = in ? drow_h[q0 + i] : 0.0f;
  }
}

template <int D>
__global__ void __launch_bounds__(kTcThreads)
    tc_dkdv_kernel(bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k, const bf16* v, const float* lse,
                   const float* drow, int S, int Hq, int Hkv, float scale, DeviceMask mask) {
  using L = TcBackwardLayout<D>;
  constexpr int kDt = D / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x >> 5;
  const auto [sIdx, sK, sV, sQ, sdO, sLse2, sDrow, sPt] = L::regions(smem, warp);  // sPt: the P^T chunk
  Bf16* sdSt = sPt + L::kChunkBytes / sizeof(Bf16);

  const int kt = blockIdx.x;  // low key tiles see the most queries and start first
  const int kvh = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int group = Hq / Hkv;
  const int k0 = kt * kTcTile;
  const int wk0 = k0 + warp * 16;  // this warp's first key
  const float scale_log2 = scale * kLog2e;

  fill_index_tile(sIdx);
  load_tile_bf16<D, L::kLdh>(sK, k, b, k0, kvh, S, Hkv);
  load_tile_bf16<D, L::kLdh>(sV, v, b, k0, kvh, S, Hkv);
  AccFrag dkf[kDt], dvf[kDt];
#pragma unroll
  for (int n = 0; n < kDt; ++n) {
    wmma::fill_fragment(dkf[n], 0.0f);
    wmma::fill_fragment(dvf[n], 0.0f);
  }
  __syncthreads();
  const FragIndex ix = load_frag_index(sIdx);

  const int nqt = (S + kTcTile - 1) / kTcTile;
  for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
    for (int qt = kt; qt < nqt; ++qt) {
      const int q0 = qt * kTcTile;
      // first_key only grows along the row: once a tile's queries are past this key tile, all are.
      if (!mask.tile_visible(b, q0, q0 + kTcTile - 1, k0, k0 + kTcTile - 1, S)) break;
      __syncthreads();  // previous readers of sQ/sdO/sLse2/sDrow are done
      load_tile_bf16<D, L::kLdh>(sQ, q, b, q0, h, S, Hq);
      load_tile_bf16<D, L::kLdh>(sdO, dout, b, q0, h, S, Hq);
      load_row_stats(sLse2, sDrow, lse + (b * Hq + h) * S, drow + (b * Hq + h) * S, q0, S);
      __syncthreads();
      for (int qc = 0; qc < kTcTile / 16; ++qc) {
        const int cq0 = q0 + qc * 16;
        if (cq0 + 15 < wk0) continue;  // every query of the chunk precedes every key of the warp
        // S^T and dP^T for the warp's 16 keys x 16 queries.
        AccFrag st, dpt;
        mma_abt<D, L::kLdh>(st, sK + warp * 16 * L::kLdh, sQ + qc * 16 * L::kLdh);
        mma_abt<D, L::kLdh>(dpt, sV + warp * 16 * L::kLdh, sdO + qc * 16 * L::kLdh);
#pragma unroll
        for (int e = 0; e < kAccElems; ++e) {
          const int r = ix.row[e], c = ix.col[e];  // key wk0 + r, query cq0 + c
          const int qi = cq0 + c;
          float p = 0.0f, ds = 0.0f;
          if (qi < S && mask.visible(b, qi, wk0 + r, S)) {
            p = exp2f(st.x[e] * scale_log2 - sLse2[qc * 16 + c]);
            const float f = mask.dropping ? mask.drop(b, h, qi, wk0 + r, S) : 1.0f;
            ds = p * (dpt.x[e] * f - sDrow[qc * 16 + c]) * scale;
            p *= f;
          }
          sPt[r * L::kLdc + c] = __float2bfloat16_rn(p);
          sdSt[r * L::kLdc + c] = __float2bfloat16_rn(ds);
        }
        __syncwarp();
        mma_chunk_rows<D, L::kLdh, L::kLdc>(dvf, sPt, sdO + qc * 16 * L::kLdh);  // dV += P^T dO
        mma_chunk_rows<D, L::kLdh, L::kLdc>(dkf, sdSt, sQ + qc * 16 * L::kLdh);  // dK += dS^T Q
        __syncwarp();  // chunk readers are done before the next chunk overwrites it
      }
    }
  }
  __syncthreads();  // all warps are done with sQ/sdO: they become the output stage
  float* stage = reinterpret_cast<float*>(smem + L::kT2) + warp * 16 * L::kLdo;
  store_acc_rows<D, L::kLdo>(dk, stage, dkf, b, wk0, kvh, S, Hkv);
  store_acc_rows<D, L::kLdo>(dv, stage, dvf, b, wk0, kvh, S, Hkv);
}

template <int D>
__global__ void __launch_bounds__(kTcThreads)
    tc_dq_kernel(bf16* dq, const bf16* dout, const bf16* q, const bf16* k, const bf16* v, const float* lse,
                 const float* drow, int S, int Hq, int Hkv, float scale, DeviceMask mask) {
  using L = TcBackwardLayout<D>;
  constexpr int kDt = D / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x >> 5;
  const auto [sIdx, sK, sV, sQ, sdO, sLse2, sDrow, sdS] = L::regions(smem, warp);

  const int qt = gridDim.x - 1 - blockIdx.x;  // longest causal rows first
  const int h = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int kvh = h / (Hq / Hkv);
  const int q0 = qt * kTcTile;
  const int wq0 = q0 + warp * 16;  // this warp's first query
  const float scale_log2 = scale * kLog2e;

  fill_index_tile(sIdx);
  load_tile_bf16<D, L::kLdh>(sQ, q, b, q0, h, S, Hq);
  load_tile_bf16<D, L::kLdh>(sdO, dout, b, q0, h, S, Hq);
  load_row_stats(sLse2, sDrow, lse + (b * Hq + h) * S, drow + (b * Hq + h) * S, q0, S);
  AccFrag dqf[kDt];
#pragma unroll
  for (int n = 0; n < kDt; ++n) wmma::fill_fragment(dqf[n], 0.0f);
  __syncthreads();
  const FragIndex ix = load_frag_index(sIdx);

  const int last_kt = mask.last_key(b, q0 + kTcTile - 1) / kTcTile;
  for (int kt = mask.first_key(b, q0, S) / kTcTile; kt <= last_kt; ++kt) {
    const int k0 = kt * kTcTile;
    __syncthreads();  // previous readers of sK/sV are done
    load_tile_bf16<D, L::kLdh>(sK, k, b, k0, kvh, S, Hkv);
    load_tile_bf16<D, L::kLdh>(sV, v, b, k0, kvh, S, Hkv);
    __syncthreads();
    for (int kc = 0; kc < kTcTile / 16; ++kc) {
      const int ck0 = k0 + kc * 16;
      if (ck0 > wq0 + 15) break;  // this and later chunks lie wholly above the diagonal
      AccFrag sf, dpf;            // the warp's 16 queries x 16 keys
      mma_abt<D, L::kLdh>(sf, sQ + warp * 16 * L::kLdh, sK + kc * 16 * L::kLdh);
      mma_abt<D, L::kLdh>(dpf, sdO + warp * 16 * L::kLdh, sV + kc * 16 * L::kLdh);
#pragma unroll
      for (int e = 0; e < kAccElems; ++e) {
        const int r = ix.row[e], c = ix.col[e];  // query wq0 + r, key ck0 + c
        const int qi = wq0 + r;
        float ds = 0.0f;
        if (qi < S && mask.visible(b, qi, ck0 + c, S)) {
          const float p = exp2f(sf.x[e] * scale_log2 - sLse2[warp * 16 + r]);
          const float f = mask.dropping ? mask.drop(b, h, qi, ck0 + c, S) : 1.0f;
          ds = p * (dpf.x[e] * f - sDrow[warp * 16 + r]) * scale;
        }
        sdS[r * L::kLdc + c] = __float2bfloat16_rn(ds);
      }
      __syncwarp();
      mma_chunk_rows<D, L::kLdh, L::kLdc>(dqf, sdS, sK + kc * 16 * L::kLdh);  // dQ += dS K
      __syncwarp();
    }
  }
  __syncthreads();  // all warps are done with sK/sV: they become the output stage
  float* stage = reinterpret_cast<float*>(smem + L::kT0) + warp * 16 * L::kLdo;
  store_acc_rows<D, L::kLdo>(dq, stage, dqf, b, wq0, h, S, Hq);
}

template <int D>
void launch_tc_backward(cudaStream_t stream, void* dq, void* dk, void* dv, const void* dout, const void* q,
                        const void* k, const void* v, const float* lse, const float* drow, int64_t B, int64_t S,
                        int64_t Hq, int64_t Hkv, float scale, DeviceMask mask) {
  using L = TcBackwardLayout<D>;
  const auto *tq = static_cast<const bf16*>(q), *tk = static_cast<const bf16*>(k), *tv = static_cast<const bf16*>(v),
             *tdout = static_cast<const bf16*>(dout);
  launch_tiles(tc_dkdv_kernel<D>, "attention backward dK/dV (tensor core)", kTcTile, kTcThreads, L::kBytes, stream, S,
               Hkv, B, D, static_cast<bf16*>(dk), static_cast<bf16*>(dv), tdout, tq, tk, tv, lse, drow, S, Hq, Hkv,
               scale, mask);
  launch_tiles(tc_dq_kernel<D>, "attention backward dQ (tensor core)", kTcTile, kTcThreads, L::kBytes, stream, S, Hq, B,
               D, static_cast<bf16*>(dq), tdout, tq, tk, tv, lse, drow, S, Hq, Hkv, scale, mask);
}

}  // namespace

size_t attention_backward_workspace_bytes(const AttentionShape& a, DType /*dt*/) {
  // Drow only: both variants accumulate dQ/dK/dV on chip.
  return static_cast<size_t>(a.B) * static_cast<size_t>(a.Hq) * static_cast<size_t>(a.S) * sizeof(float);
}

void attention_backward(cudaStream_t stream, const AttentionShape& a, const AttentionMask& mask,
                        const AttentionInputs& in, const void* out, const float* lse, const void* dout,
                        const AttentionGrads& g, AttentionWorkspace ws) {
  constexpr const char* kWhat = "attention_backward";
  const auto [B, S, Hq, Hkv, D, scale, dt, q, k, v, dm] = checked_call(kWhat, a, mask, in);
  void *dq = g.dq.data, *dk = g.dk.data, *dv = g.dv.data, *dsinks_acc = g.dsinks_acc.data;
  SO_CHECK(mask.sinks == nullptr || dsinks_acc != nullptr, kWhat, ": sinks without a dsinks_acc buffer");
  if (B == 0 || S == 0) return;
  const size_t needed = attention_backward_workspace_bytes(a, dt);
  SO_CHECK(ws.data != nullptr && ws.bytes >= needed, kWhat, ": workspace of ", ws.bytes, " bytes, need ", needed,
           " (attention_backward_workspace_bytes)");
  SO_CHECK(reinterpret_cast<uintptr_t>(ws.data) % alignof(float) == 0, kWhat, ": workspace is not fp32-aligned");
  float* drow = static_cast<float*>(ws.data);
  const int variant = select_variant(kWhat, D, dt);
  if (dt == DType::BF16)
    launch_row_dot<bf16>(stream, drow, dout, out, B, S, Hq, D);
  else
    launch_row_dot<float>(stream, drow, dout, out, B, S, Hq, D);
  if (mask.sinks != nullptr) {
    if (dt == DType::BF16)
      launch_sink_grad<bf16>(stream, dsinks_acc, mask.sinks, lse, drow, B, S, Hq);
    else
      launch_sink_grad<float>(stream, dsinks_acc, mask.sinks, lse, drow, B, S, Hq);
  }
  if (variant == 2) {
    check_aligned16(kWhat, {{"dq", dq}, {"dk", dk}, {"dv", dv}, {"dout", dout}, {"q", q}, {"k", k}, {"v", v}});
    if (D == 64)
      launch_tc_backward<64>(stream, dq, dk, dv, dout, q, k, v, lse, drow, B, S, Hq, Hkv, scale, dm);
    else
      launch_tc_backward<128>(stream, dq, dk, dv, dout, q, k, v, lse, drow, B, S, Hq, Hkv, scale, dm);
  } else if (dt == DType::BF16) {
    launch_ref_backward<bf16>(stream, dq, dk, dv, dout, q, k, v, lse, drow, B, S, Hq, Hkv, D, scale, dm);
  } else {
    launch_ref_backward<float>(stream, dq, dk, dv, dout, q, k, v, lse, drow, B, S, Hq, Hkv, D, scale, dm);
  }
}

void attention_sink_grad(cudaStream_t stream, const AttentionShape& a, const void* sinks, void* dsinks_acc,
                         const float* lse, const void* dout, const void* out, float* drow, DType dt) {
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    launch_row_dot<T>(stream, drow, dout, out, a.B, a.S, a.Hq, a.D);
    launch_sink_grad<T>(stream, dsinks_acc, sinks, lse, drow, a.B, a.S, a.Hq);
  });
}

}  // namespace so::cuda
