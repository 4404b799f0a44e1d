// Kernels around cuDNN's SDPA for packed and padded rows (cudnn_attention_kernels.h).
#include "cudnn_attention_kernels.h"

#include <cub/block/block_scan.cuh>

#include <cmath>

#include "cuda_attention_common.cuh"
#include "cuda_device_error.cuh"
#include "cuda_launch.cuh"

namespace so::cuda {

namespace {

using attn::DeviceMask;

constexpr int kScanThreads = 1024;

__device__ __forceinline__ bool document_starts(const int32_t* doc_start, int64_t t, int S) {
  return __ldg(doc_start + t) == static_cast<int32_t>(t % S);
}

__device__ __forceinline__ bool document_ends(const int32_t* doc_start, int64_t t, int S) {
  const int p = static_cast<int>(t % S);
  return p == S - 1 || __ldg(doc_start + t + 1) == p + 1;
}

// One block: each thread walks a contiguous run of tokens twice, counting document starts, then
// (after a block-wide exclusive scan of the counts gives its first document's index) recording
// each document's first and one-past-last token; the entries are then finished in parallel.
// Documents are numbered in token order, so a document's end lies in the run of whichever thread
// holds its last token, with the index that run's walk has reached.
__global__ void __launch_bounds__(kScanThreads)
    ragged_sequences_kernel(RaggedSequences r, const int32_t* doc_start, const int32_t* key_end, int B, int S,
                            int64_t q_row, int64_t kv_row, int Hq, DeviceError* err) {
  using Scan = cub::BlockScan<int64_t, kScanThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  const int64_t T = static_cast<int64_t>(B) * S;
  const int64_t chunk = (T + kScanThreads - 1) / kScanThreads;
  const int64_t lo = min(T, threadIdx.x * chunk), hi = min(T, lo + chunk);
  int64_t count = 0;
  for (int64_t t = lo; t < hi; ++t) count += document_starts(doc_start, t, S);
  int64_t first = 0, total = 0;
  Scan(scan_storage).ExclusiveSum(count, first, total);
  // Temporaries until the sync: a document's first token in offset_q, its end in offset_kv.
  int64_t idx = first - 1;
  for (int64_t t = lo; t < hi; ++t) {
    if (document_starts(doc_start, t, S) && ++idx < r.n) r.offset_q[idx] = t;
    if (document_ends(doc_start, t, S) && idx < r.n) r.offset_kv[idx] = t + 1;
  }
  __syncthreads();
  if (threadIdx.x == 0 && total > r.n) report_device_error(err, kAttentionDocuments, 0, total, r.n);
  for (int64_t i = threadIdx.x; i < r.n; i += kScanThreads) {
    if (i < total) {
      const int64_t start = r.offset_q[i], end = r.offset_kv[i];
      const int64_t b = start / S, p0 = start % S;
      int64_t len = end - start;
      if (len > r.longest) {
        report_device_error(err, kAttentionLongestDocument, start, len, r.longest);
        len = r.longest;
      }
      const int64_t kv = key_end != nullptr ? max(int64_t{0}, min(len, __ldg(key_end + b) - p0)) : len;
      r.seq_q[i] = static_cast<int32_t>(kv > 0 ? len : 0);  // queries that see no key: not cuDNN's
      r.seq_kv[i] = static_cast<int32_t>(kv);
      r.offset_q[i] = start * q_row;
      r.offset_kv[i] = start * kv_row;
      r.offset_stats[i] = start * Hq;
    } else {
      r.seq_q[i] = 0;
      r.seq_kv[i] = 0;
      r.offset_q[i] = T * q_row;
      r.offset_kv[i] = T * kv_row;
      r.offset_stats[i] = T * Hq;
    }
  }
  if (threadIdx.x == 0) {
    r.offset_q[r.n] = T * q_row;
    r.offset_kv[r.n] = T * kv_row;
    r.offset_stats[r.n] = T * Hq;
  }
}

__global__ void fill_kernel(int32_t* x, int64_t n, int32_t value) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = value;
}

__device__ __forceinline__ bool sees_no_key(const DeviceMask& m, int64_t b, int p, int S) {
  return m.first_key(b, p, S) > m.last_key(b, p);
}

// One thread per (b, h, p) in lse's order.
template <typename T>
__global__ void forward_fixup_kernel(T* out, float* lse, const float* stats_tokens, DeviceMask m, const float* sinks,
                                     int64_t B, int S, int Hq, int D) {
  const int64_t n = B * Hq * S;
  for (int64_t w = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; w < n;
       w += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int p = static_cast<int>(w % S);
    const int h = static_cast<int>((w / S) % Hq);
    const int64_t b = w / (static_cast<int64_t>(S) * Hq), t = b * S + p;
    if (sees_no_key(m, b, p, S)) {
      lse[w] = sinks != nullptr ? sinks[h] : -INFINITY;
      T* row = out + (t * Hq + h) * D;
      for (int d = 0; d < D; ++d) row[d] = from_float<T>(0.0f);
    } else if (stats_tokens != nullptr) {
      lse[w] = stats_tokens[t * Hq + h];
    }
  }
}

__global__ void backward_stats_kernel(float* stats, const float* lse, bool tokens, DeviceMask m, int64_t B, int S,
                                      int Hq) {
  const int64_t n = B * Hq * S;
  for (int64_t w = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; w < n;
       w += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int p = static_cast<int>(w % S);
    const int h = static_cast<int>((w / S) % Hq);
    const int64_t b = w / (static_cast<int64_t>(S) * Hq);
    const float v = sees_no_key(m, b, p, S) ? INFINITY : lse[w];
    stats[tokens ? (b * S + p) * Hq + h : w] = v;
  }
}

// One thread per (token, head up to max(Hq, Hkv)).
template <typename T>
__global__ void backward_fixup_kernel(T* dq, T* dk, T* dv, DeviceMask m, int64_t B, int S, int Hq, int Hkv, int D) {
  const int H = max(Hq, Hkv);
  const int64_t n = B * S * H;
  for (int64_t w = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; w < n;
       w += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int h = static_cast<int>(w % H);
    const int64_t t = w / H, b = t / S;
    const int p = static_cast<int>(t % S);
    if (h < Hq && sees_no_key(m, b, p, S))
      for (int d = 0; d < D; ++d) dq[(t * Hq + h) * D + d] = from_float<T>(0.0f);
    if (h < Hkv && m.key_end != nullptr && p >= __ldg(m.key_end + b))
      for (int d = 0; d < D; ++d) {
        dk[(t * Hkv + h) * D + d] = from_float<T>(0.0f);
        dv[(t * Hkv + h) * D + d] = from_float<T>(0.0f);
      }
  }
}

}  // namespace

void launch_ragged_sequences(cudaStream_t stream, const RaggedSequences& r, const int32_t* doc_start,
                             const int32_t* key_end, const AttentionShape& a, DeviceError* err) {
  SO_CHECK(doc_start != nullptr && r.n >= 1 && r.longest >= 1, "cuDNN attention: ragged sequences need doc_start (",
           a.text(), ")");
  SO_CHECK(a.B * a.S < (int64_t{1} << 31), "cuDNN attention: ", a.B * a.S, " tokens per batch is past int32 lengths");
  ragged_sequences_kernel<<<1, kScanThreads, 0, stream>>>(r, doc_start, key_end, static_cast<int>(a.B),
                                                          static_cast<int>(a.S), a.Hq * a.D, a.Hkv * a.D,
                                                          static_cast<int>(a.Hq), err);
  SO_CUDA_CHECK(cudaGetLastError());
}

void launch_fill_row_lengths(cudaStream_t stream, int32_t* seq_q, int64_t B, int64_t S) {
  fill_kernel<<<grid_for_elements(B, 1), kBlockThreads, 0, stream>>>(seq_q, B, static_cast<int32_t>(S));
  SO_CUDA_CHECK(cudaGetLastError());
}

void launch_forward_fixup(cudaStream_t stream, void* out, float* lse, const float* stats_tokens,
                          const AttentionMask& mask, const float* sinks, const AttentionShape& a, DType dt) {
  const DeviceMask m = attn::device_mask(mask);
  const unsigned grid = grid_for_elements(a.B * a.Hq * a.S, 1);
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    forward_fixup_kernel<T><<<grid, kBlockThreads, 0, stream>>>(static_cast<T*>(out), lse, stats_tokens, m, sinks, a.B,
                                                                static_cast<int>(a.S), static_cast<int>(a.Hq),
                                                                static_cast<int>(a.D));
  });
  SO_CUDA_CHECK(cudaGetLastError());
}

void launch_backward_stats(cudaStream_t stream, float* stats, const float* lse, bool tokens, const AttentionMask& mask,
                           const AttentionShape& a) {
  const DeviceMask m = attn::device_mask(mask);
  backward_stats_kernel<<<grid_for_elements(a.B * a.Hq * a.S, 1), kBlockThreads, 0, stream>>>(
      stats, lse, tokens, m, a.B, static_cast<int>(a.S), static_cast<int>(a.Hq));
  SO_CUDA_CHECK(cudaGetLastError());
}

void launch_backward_fixup(cudaStream_t stream, void* dq, void* dk, void* dv, const AttentionMask& mask,
                           const AttentionShape& a, DType dt) {
  const DeviceMask m = attn::device_mask(mask);
  const unsigned grid = grid_for_elements(a.B * a.S * std::max(a.Hq, a.Hkv), 1);
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    backward_fixup_kernel<T><<<grid, kBlockThreads, 0, stream>>>(
        static_cast<T*>(dq), static_cast<T*>(dk), static_cast<T*>(dv), m, a.B, static_cast<int>(a.S),
        static_cast<int>(a.Hq), static_cast<int>(a.Hkv), static_cast<int>(a.D));
  });
  SO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace so::cuda
