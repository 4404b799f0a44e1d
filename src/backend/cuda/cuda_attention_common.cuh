#pragma once
// Pieces shared by the flash-attention forward and backward kernels (cuda_attention_forward.cu,
// cuda_attention_backward.cu): shape checks, which kernel variant runs, shared-memory opt-in,
// warp reductions and the wmma fragment index map.
//
// Variant 1 ("reference"): FlashAttention-2 with fp32 math from shared-memory tiles; any D that is
//   a multiple of 8 up to 256, bf16 or fp32 storage. It is the yardstick for variant 2.
// Variant 2 ("tensor core"): the same algorithm with the tile matmuls on bf16 wmma fragments and
//   fp32 accumulators/softmax statistics; bf16 storage, D in {64, 128}.
// SO_ATTENTION_KERNEL=1|2 forces a variant (read once); by default 2 runs where it is supported.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "cuda_bf16.cuh"
#include "cuda_check.h"
#include "so/backend/ops.h"
#include "so/core/dtype.h"

namespace so::cuda::attn {

// AttentionMask's documents, window, padding and dropout on the device: query i of row b sees
// keys [first_key(b, i), last_key(b, i)], none when first > last (the row outputs zero). Both
// never decrease along a row (documents are contiguous), which is what lets the kernels skip whole
// tiles: a query tile needs key tiles from first_key(its first row) to last_key(its last row), and
// a key tile needs query tiles until first_key passes its last key; key tiles at or past the
// padding are visible to none.
struct DeviceMask {
  const int32_t* doc_start;  // [B*S], or null
  const int32_t* key_end;    // [B], or null
  int window;                // 0: none

  __device__ __forceinline__ int first_key(int64_t b, int i, int S) const {
    int lo = (doc_start != nullptr && i < S) ? __ldg(doc_start + b * S + i) : 0;  // padded rows: causal only
    if (window > 0) lo = max(lo, i - window + 1);
    return lo;
  }
  __device__ __forceinline__ int last_key(int64_t b, int i) const {
    return key_end != nullptr ? min(i, __ldg(key_end + b) - 1) : i;
  }
  // Whether any query in [q0, q1] sees any key in [k0, k1] (q0 < S).
  __device__ __forceinline__ bool tile_visible(int64_t b, int q0, int q1, int k0, int k1, int S) const {
    return q1 >= k0 && first_key(b, max(q0, k0), S) <= k1 && last_key(b, q1) >= k0;
  }
  // Whether query i sees key j.
  __device__ __forceinline__ bool visible(int64_t b, int i, int j, int S) const {
    return j <= last_key(b, i) && j >= first_key(b, i, S);
  }

  // Attention-probability dropout (AttentionMask::dropout): P[query i, key j] of local head h of
  // sequence b is multiplied by this, 0 or 1 / (1 - p); the CPU reference draws the same bits.
  bool dropping;
  uint32_t drop_threshold;
  float drop_scale;
  uint64_t drop_key;
  int64_t first_sample;
  int first_head;
  __device__ __forceinline__ float drop(int64_t b, int h, int i, int j, int S) const {
    const bool keep = attention_dropout_keep(drop_key, first_sample + b, S, i, first_head + h, j, drop_threshold);
    return keep ? drop_scale : 0.0f;
  }
};

inline DeviceMask device_mask(const AttentionMask& m) {
  SO_CHECK(m.window >= 0 && m.window <= (int64_t{1} << 30), "attention: sliding window ", m.window, " out of range");
  SO_CHECK(m.dropout.p >= 0.0f && m.dropout.p < 1.0f, "attention: dropout probability ", m.dropout.p,
           " is not in [0, 1)");
  return DeviceMask{m.doc_start,
                    m.key_end,
                    static_cast<int>(m.window),
                    m.dropout.p > 0.0f,
                    m.dropout.threshold(),
                    m.dropout.scale(),
                    m.dropout.key,
                    m.dropout.first_sample,
                    static_cast<int>(m.first_head)};
}

// 1 / the row's softmax normaliser: 0 for a row that saw no key, whose output is zero.
__device__ __forceinline__ float inverse_normaliser(float l) { return l > 0.0f ? 1.0f / l : 0.0f; }

// Folds a sink logit into a row's softmax: lse (natural log, keys only) becomes the log-sum-exp of
// keys and sink, and the keys' output shrinks by exp(old - new). Returns that factor.
__device__ __forceinline__ float add_sink(float& lse, float sink) {
  const float hi = fmaxf(lse, sink);
  const float with_sink = hi + logf(expf(lse - hi) + expf(sink - hi));
  const float factor = expf(lse - with_sink);
  lse = with_sink;
  return factor;
}

// Tile geometry shared by each variant's forward and backward kernels. Variant 1: query rows and
// keys per tile (32 keys make a score row one warp wide, lane = key); variant 2: 64 queries and 64
// keys, 4 warps of 16 rows each. 128 threads per block in both.
constexpr int kRefTile = 32;
constexpr int kRefThreads = 128;
constexpr int kTcTile = 64;
constexpr int kTcThreads = 128;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Element offset of head h of token s of sequence b in a [B*S, H*D] activation (int64: B*S*H*D
// exceeds 2^31 at long sequence lengths).
__device__ __forceinline__ int64_t row_offset(int64_t b, int64_t s, int64_t h, int64_t S, int64_t H, int64_t D) {
  return ((b * S + s) * H + h) * D;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// ---- wmma helpers (variant 2) ----

using Bf16 = __nv_bfloat16;
using AccFrag = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>;
constexpr int kAccElems = AccFrag::num_elements;

// wmma leaves the (row, col) of each accumulator element unspecified; kernels that work on single
// elements (masking, softmax rescale, P = exp(S - lse)) read it back once by loading a tile whose
// entries are their own index. sIdx: 256 floats, 32-byte aligned, filled by fill_index_tile before
// a __syncthreads.
__device__ __forceinline__ void fill_index_tile(float* sIdx) {
  for (int i = threadIdx.x; i < 256; i += blockDim.x) sIdx[i] = static_cast<float>(i);
}

struct FragIndex {
  int row[kAccElems];
  int col[kAccElems];
};

__device__ __forceinline__ FragIndex load_frag_index(const float* sIdx) {
  AccFrag f;
  nvcuda::wmma::load_matrix_sync(f, sIdx, 16, nvcuda::wmma::mem_row_major);
  FragIndex ix;
#pragma unroll
  for (int e = 0; e < kAccElems; ++e) {
    const int i = static_cast<int>(f.x[e]);
    ix.row[e] = i >> 4;
    ix.col[e] = i & 15;
  }
  return ix;
}

// Copies rows [s0, s0 + 64) of head h (D bf16 values each, 16-byte chunks) into a shared tile with
// row stride LD elements; rows at or beyond S are zero so padded keys/queries contribute nothing.
// All threads of the block take part. src must be 16-byte aligned (checked on the host).
template <int D, int LD>
__device__ __forceinline__ void load_tile_bf16(Bf16* dst, const bf16* src, int64_t b, int s0, int h, int S, int H) {
  constexpr int kChunks = D / 8;
  for (int i = threadIdx.x; i < 64 * kChunks; i += blockDim.x) {
    const int r = i / kChunks, c = i % kChunks;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (s0 + r < S) v = *reinterpret_cast<const uint4*>(src + row_offset(b, s0 + r, h, S, H, D) + c * 8);
    *reinterpret_cast<uint4*>(dst + r * LD + c * 8) = v;
  }
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return static_cast<uint32_t>(f32_to_bf16_bits(lo)) | (static_cast<uint32_t>(f32_to_bf16_bits(hi)) << 16);
}

// One warp writes 16 staged fp32 rows (stride ld) as bf16 rows s0..s0+15 of head h; rows at or
// beyond S are dropped.
template <int D>
__device__ __forceinline__ void store_rows_bf16(bf16* dst, const float* stage, int ld, int64_t b, int s0, int h, int S,
                                                int H) {
  constexpr int kChunks = D / 8;
  for (int i = threadIdx.x & 31; i < 16 * kChunks; i += 32) {
    const int r = i / kChunks, c = i % kChunks;
    if (s0 + r >= S) continue;
    const float* x = stage + r * ld + c * 8;
    const uint4 v =
        make_uint4(pack_bf16x2(x[0], x[1]), pack_bf16x2(x[2], x[3]), pack_bf16x2(x[4], x[5]), pack_bf16x2(x[6], x[7]));
    *reinterpret_cast<uint4*>(dst + row_offset(b, s0 + r, h, S, H, D) + c * 8) = v;
  }
}

// ---- host side ----

inline void check_shape(const char* what, int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t D) {
  SO_CHECK(B >= 0 && S >= 0, what, ": negative shape B=", B, " S=", S);
  SO_CHECK(D > 0 && D % 8 == 0 && D <= 256, what, ": head dim D=", D,
           " is not supported (the CUDA kernels need a multiple of 8 up to 256)");
  SO_CHECK(Hq > 0 && Hkv > 0 && Hq % Hkv == 0, what, ": ", Hq, " query heads are not a multiple of ", Hkv, " KV heads");
  // Grid: x = tiles along S, y = heads, z = batch; int token indices (plus a tile) stay in range.
  SO_CHECK(S <= (int64_t{1} << 30) && Hq <= 65535 && B <= 65535, what, ": shape out of the launch range (B=", B,
           " S=", S, " Hq=", Hq, ")");
}

// An entry point's arguments as its launchers take them, the shape checked and the mask on the device.
struct Call {
  int64_t B, S, Hq, Hkv, D;
  float scale;
  DType dt;
  const void *q, *k, *v;
  DeviceMask mask;
};
inline Call checked_call(const char* what, const AttentionShape& a, const AttentionMask& m, const AttentionInputs& in) {
  check_shape(what, a.B, a.S, a.Hq, a.Hkv, a.D);
  return {a.B, a.S, a.Hq, a.Hkv, a.D, a.scale, in.q.dtype, in.q.data, in.k.data, in.v.data, device_mask(m)};
}

inline bool tensor_core_supported(int64_t D, DType dt) { return dt == DType::BF16 && (D == 64 || D == 128); }

// 1 (reference) or 2 (tensor core).
inline int select_variant(const char* what, int64_t D, DType dt) {
  static const int forced = [] {
    const char* e = std::getenv("SO_ATTENTION_KERNEL");
    if (e == nullptr || *e == '\0') return 0;
    const std::string s(e);
    SO_CHECK(s == "1" || s == "2", "SO_ATTENTION_KERNEL must be 1 or 2, got '", s, "'");
    return s == "1" ? 1 : 2;
  }();
  if (forced == 2)
    SO_CHECK(tensor_core_supported(D, dt), what,
             ": SO_ATTENTION_KERNEL=2 but the tensor-core kernel needs bf16 and D "
             "in {64, 128}; got ",
             dtype_name(dt), " with D=", D);
  if (forced != 0) return forced;
  return tensor_core_supported(D, dt) ? 2 : 1;
}

// Lets a kernel use all the shared memory a block may opt into on the current device and returns
// that limit. Call once per kernel instantiation (each rank drives one device).
template <typename... Args>
size_t raise_smem_limit(void (*kernel)(Args...)) {
  int dev = 0, optin = 0;
  SO_CUDA_CHECK(cudaGetDevice(&dev));
  SO_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  SO_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
  return static_cast<size_t>(optin);
}

inline void check_smem(size_t needed, size_t limit, const char* kernel, int64_t D) {
  SO_CHECK(needed <= limit, kernel, " needs ", needed, " bytes of shared memory per block at D=", D,
           "; the device allows ", limit);
}

// Launches an attention kernel over (tiles of `tile` rows along S, heads, B) with `smem` bytes of
// dynamic shared memory: the kernel's limit is raised to the device's opt-in on its first launch,
// a layout the device cannot hold is refused (naming `name` and D), the launch is checked.
template <typename... Params, typename... Args>
void launch_tiles(void (*kernel)(Params...), const char* name, int tile, int threads, size_t smem, cudaStream_t stream,
                  int64_t S, int64_t heads, int64_t B, int64_t D, Args... args) {
  static std::mutex mu;
  static std::map<const void*, size_t> limits;  // per kernel (each rank drives one device)
  size_t limit = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = limits.find(reinterpret_cast<const void*>(kernel));
    if (it == limits.end()) it = limits.emplace(reinterpret_cast<const void*>(kernel), raise_smem_limit(kernel)).first;
    limit = it->second;
  }
  check_smem(smem, limit, name, D);
  const dim3 grid(static_cast<unsigned>((S + tile - 1) / tile), static_cast<unsigned>(heads), static_cast<unsigned>(B));
  kernel<<<grid, threads, smem, stream>>>(static_cast<Params>(args)...);
  SO_CUDA_CHECK(cudaGetLastError());
}

// The tensor-core kernels load 16-byte chunks: every tensor they read or write (name, pointer).
inline void check_aligned16(const char* what, std::initializer_list<std::pair<const char*, const void*>> tensors) {
  for (const auto& [name, p] : tensors)
    SO_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0, what, ": the tensor-core kernel needs ", name,
             " 16-byte aligned");
}

}  // namespace so::cuda::attn
