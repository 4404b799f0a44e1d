// Mixture-of-experts kernels: routing (one thread per token), the stable sort of (token, choice)
// slots by expert (one block per expert, block-wide prefix sums: no atomics, so the order is the
// CPU's), dispatch, combine and its backward (fixed-order reductions), GPT-OSS's clamped GLU.
#include <cub/block/block_scan.cuh>

#include "cuda_bf16.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_launch.cuh"
#include "cuda_reduce.cuh"
#include "src/backend/moe_aux_loss.h"

namespace so::cuda {

namespace {

__device__ __forceinline__ float round_through(float x, DType dt) {
  return dt == DType::F32 ? x : to_float(from_float<bf16>(x));
}

// True when (v, i) ranks before (w, j) in top-k order: larger value first, ties to the lower index.
__device__ __forceinline__ bool ranks_before(float v, int i, float w, int j) { return v > w || (v == w && i < j); }

// The k best of z (or of softmax(z): same order) by repeated selection below the previous pick.
__device__ void top_k(int32_t* idx, const float* z, int E, int k) {
  float prev_v = 0.0f;
  int prev_i = -1;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    float best_v = 0.0f;
    for (int e = 0; e < E; ++e) {
      const float v = z[e];
      if (prev_i >= 0 && !ranks_before(prev_v, prev_i, v, e)) continue;
      if (best < 0 || ranks_before(v, e, best_v, best)) best = e, best_v = v;
    }
    idx[j] = best;
    prev_v = best_v, prev_i = best;
  }
}

__device__ void softmax_stats(const float* z, int E, float& m, float& sum) {
  m = z[0];
  for (int e = 1; e < E; ++e) m = fmaxf(m, z[e]);
  sum = 0.0f;
  for (int e = 0; e < E; ++e) sum += expf(z[e] - m);
}

__global__ void route_kernel(float* weights, int32_t* experts, const float* logits, int64_t T, MoeRouting r) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= T) return;
  const int E = static_cast<int>(r.experts), k = static_cast<int>(r.top_k);
  const float* z = logits + t * E;
  float* w = weights + t * k;
  int32_t* e = experts + t * k;
  top_k(e, z, E, k);  // softmax is monotonic: the same experts either way
  if (r.kind == MoeRouting::Kind::SoftmaxTopK) {
    float m, sum;
    softmax_stats(z, E, m, sum);
    float sel = 0.0f;
    for (int j = 0; j < k; ++j) sel += expf(z[e[j]] - m) / sum;
    for (int j = 0; j < k; ++j) {
      const float p = expf(z[e[j]] - m) / sum;
      w[j] = round_through(r.normalize ? p / sel : p, r.weight_dtype);
    }
  } else {
    const float m = z[e[0]];
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += expf(z[e[j]] - m);
    for (int j = 0; j < k; ++j) w[j] = round_through(expf(z[e[j]] - m) / sum, r.weight_dtype);
  }
}

__global__ void route_backward_kernel(float* dlogits, const float* dweights, const float* logits,
                                      const int32_t* experts, const float* aux_dprob, int64_t T, MoeRouting r) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= T) return;
  const int E = static_cast<int>(r.experts), k = static_cast<int>(r.top_k);
  const float* z = logits + t * E;
  const float* dw = dweights + t * k;
  const int32_t* e = experts + t * k;
  float* dz = dlogits + t * E;
  float m, sum;
  softmax_stats(z, E, m, sum);
  // dp[e]: the aux term plus, for softmax-then-top-k, what the selected weights pass back.
  float S = 1.0f, dot_w = 0.0f;
  const bool softmax_first = r.kind == MoeRouting::Kind::SoftmaxTopK;
  if (softmax_first) {
    if (r.normalize) {
      S = 0.0f;
      for (int j = 0; j < k; ++j) S += expf(z[e[j]] - m) / sum;
    }
    for (int j = 0; j < k; ++j) dot_w += dw[j] * (expf(z[e[j]] - m) / sum) / S;
  }
  auto dp_of = [&](int i) {
    float d = aux_dprob ? aux_dprob[i] : 0.0f;
    if (softmax_first)
      for (int j = 0; j < k; ++j)
        if (e[j] == i) d += r.normalize ? (dw[j] - dot_w) / S : dw[j];
    return d;
  };
  float dot = 0.0f;
  for (int i = 0; i < E; ++i) dot += dp_of(i) * (expf(z[i] - m) / sum);
  for (int i = 0; i < E; ++i) dz[i] = (expf(z[i] - m) / sum) * (dp_of(i) - dot);
  if (!softmax_first) {
    const float mk = z[e[0]];
    float sk = 0.0f, dk = 0.0f;
    for (int j = 0; j < k; ++j) sk += expf(z[e[j]] - mk);
    for (int j = 0; j < k; ++j) dk += dw[j] * expf(z[e[j]] - mk) / sk;
    for (int j = 0; j < k; ++j) {
      const float wj = expf(z[e[j]] - mk) / sk;
      dz[e[j]] += wj * (dw[j] - dk);
    }
  }
}

constexpr int kSortThreads = 256;

// Block b counts the slots of expert b (a fixed-order block sum).
__global__ void count_slots_kernel(int32_t* counts, const int32_t* experts, int64_t slots) {
  int n = 0;
  for (int64_t i = threadIdx.x; i < slots; i += blockDim.x) n += experts[i] == static_cast<int32_t>(blockIdx.x);
  n = block_sum(n);
  if (threadIdx.x == 0) counts[blockIdx.x] = n;
}

__global__ void offsets_kernel(int32_t* offsets, const int32_t* counts, int64_t E) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  offsets[0] = 0;
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + counts[e];
}

// Block b writes expert b's slots in slot order at its offset: chunks of blockDim slots, each
// thread's place from a block-wide exclusive scan of the match flags.
__global__ void place_slots_kernel(int32_t* slot_of, int32_t* row_of, const int32_t* offsets, const int32_t* experts,
                                   int64_t slots) {
  using Scan = cub::BlockScan<int, kSortThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int base;
  if (threadIdx.x == 0) base = offsets[blockIdx.x];
  __syncthreads();
  for (int64_t start = 0; start < slots; start += kSortThreads) {
    const int64_t i = start + threadIdx.x;
    const int match = i < slots && experts[i] == static_cast<int32_t>(blockIdx.x);
    int place, total;
    Scan(scan).ExclusiveSum(match, place, total);
    if (match) {
      const int32_t p = base + place;
      slot_of[p] = static_cast<int32_t>(i);
      row_of[i] = p;
    }
    __syncthreads();
    if (threadIdx.x == 0) base += total;
    __syncthreads();
  }
}

template <typename T>
__global__ void dispatch_kernel(T* dst, const T* x, const int32_t* slot_of, int64_t k, int64_t H) {
  const int64_t p = blockIdx.x;
  const T* src = x + (slot_of[p] / k) * H;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) dst[p * H + i] = src[i];
}

template <typename T>
__global__ void combine_kernel(T* out, const T* y, const float* weights, const int32_t* row_of, int64_t k, int64_t H,
                               bool accumulate) {
  const int64_t t = blockIdx.x;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) {
    float acc = accumulate ? to_float(out[t * H + i]) : 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const float w = weights ? weights[t * k + j] : 1.0f;
      acc += w * to_float(y[static_cast<int64_t>(row_of[t * k + j]) * H + i]);
    }
    out[t * H + i] = from_float<T>(acc);
  }
}

template <typename T>
__global__ void combine_backward_kernel(T* dy, float* dweights, const T* dout, const T* y, const float* weights,
                                        const int32_t* slot_of, int64_t k, int64_t H) {
  const int64_t p = blockIdx.x;
  const int32_t slot = slot_of[p];
  const T* g = dout + (slot / k) * H;
  const float w = weights[slot];
  float dot = 0.0f;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) {
    const float gi = to_float(g[i]);
    dot += gi * to_float(y[p * H + i]);
    dy[p * H + i] = from_float<T>(w * gi);
  }
  dot = block_sum(dot);
  if (threadIdx.x == 0) dweights[slot] = dot;
}

template <typename T>
__global__ void clamped_swiglu_forward_kernel(T* out, const T* gate_up, int64_t n, float alpha, float limit) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = fminf(to_float(gate_up[2 * i]), limit);
    const float u = fminf(fmaxf(to_float(gate_up[2 * i + 1]), -limit), limit);
    out[i] = from_float<T>(g / (1.0f + expf(-alpha * g)) * (u + 1.0f));
  }
}

template <typename T>
__global__ void clamped_swiglu_backward_kernel(T* dgate_up, const T* dout, const T* gate_up, int64_t n, float alpha,
                                               float limit) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g0 = to_float(gate_up[2 * i]), u0 = to_float(gate_up[2 * i + 1]), d = to_float(dout[i]);
    const float g = fminf(g0, limit), u = fminf(fmaxf(u0, -limit), limit);
    const float sig = 1.0f / (1.0f + expf(-alpha * g));
    dgate_up[2 * i] = from_float<T>(g0 <= limit ? d * (u + 1.0f) * sig * (1.0f + alpha * g * (1.0f - sig)) : 0.0f);
    dgate_up[2 * i + 1] = from_float<T>(u0 >= -limit && u0 <= limit ? d * g * sig : 0.0f);
  }
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kBlockThreads - 1) / kBlockThreads); }

}  // namespace

void launch_moe_route(cudaStream_t stream, const MoeRouting& r, float* weights, int32_t* experts, const float* logits,
                      int64_t T) {
  if (T == 0) return;
  route_kernel<<<blocks_for(T), kBlockThreads, 0, stream>>>(weights, experts, logits, T, r);
  SO_CUDA_CHECK(cudaGetLastError());
}

void launch_moe_route_backward(cudaStream_t stream, const MoeRouting& r, float* dlogits, const float* dweights,
                               const float* logits, const int32_t* experts, const float* aux_dprob, int64_t T) {
  if (T == 0) return;
  route_backward_kernel<<<blocks_for(T), kBlockThreads, 0, stream>>>(dlogits, dweights, logits, experts, aux_dprob, T,
                                                                     r);
  SO_CUDA_CHECK(cudaGetLastError());
}

void launch_moe_sort_slots(cudaStream_t stream, int32_t* slot_of, int32_t* row_of, int32_t* offsets,
                           const int32_t* experts, int64_t T, int64_t k, int64_t E, void* workspace) {
  // counts go to the workspace (E int32); offsets[E + 1] from them.
  auto* counts = static_cast<int32_t*>(workspace);
  count_slots_kernel<<<static_cast<unsigned>(E), kSortThreads, 0, stream>>>(counts, experts, T * k);
  SO_CUDA_CHECK(cudaGetLastError());
  offsets_kernel<<<1, 32, 0, stream>>>(offsets, counts, E);
  SO_CUDA_CHECK(cudaGetLastError());
  if (T == 0) return;
  place_slots_kernel<<<static_cast<unsigned>(E), kSortThreads, 0, stream>>>(slot_of, row_of, offsets, experts, T * k);
  SO_CUDA_CHECK(cudaGetLastError());
}

void launch_moe_dispatch(cudaStream_t stream, void* dst, const void* x, const int32_t* slot_of, int64_t T, int64_t k,
                         int64_t H, DType dt) {
  if (T == 0) return;
  dispatch_dtype(dt, [&](auto t) {
    using X = decltype(t);
    dispatch_kernel<X><<<static_cast<unsigned>(T * k), kBlockThreads, 0, stream>>>(
        static_cast<X*>(dst), static_cast<const X*>(x), slot_of, k, H);
    SO_CUDA_CHECK(cudaGetLastError());
  });
}

void launch_moe_combine(cudaStream_t stream, void* out, const void* y, const float* weights, const int32_t* row_of,
                        int64_t T, int64_t k, int64_t H, bool accumulate, DType dt) {
  if (T == 0) return;
  dispatch_dtype(dt, [&](auto t) {
    using X = decltype(t);
    combine_kernel<X><<<static_cast<unsigned>(T), kBlockThreads, 0, stream>>>(
        static_cast<X*>(out), static_cast<const X*>(y), weights, row_of, k, H, accumulate);
    SO_CUDA_CHECK(cudaGetLastError());
  });
}

void launch_moe_combine_backward(cudaStream_t stream, void* dy, float* dweights, const void* dout, const void* y,
                                 const float* weights, const int32_t* slot_of, int64_t T, int64_t k, int64_t H,
                                 DType dt) {
  if (T == 0) return;
  dispatch_dtype(dt, [&](auto t) {
    using X = decltype(t);
    combine_backward_kernel<X><<<static_cast<unsigned>(T * k), kBlockThreads, 0, stream>>>(
        static_cast<X*>(dy), dweights, static_cast<const X*>(dout), static_cast<const X*>(y), weights, slot_of, k, H);
    SO_CUDA_CHECK(cudaGetLastError());
  });
}

void launch_clamped_swiglu_forward(cudaStream_t stream, void* out, const void* gate_up, int64_t n, float alpha,
                                   float limit, DType dt) {
  if (n == 0) return;
  dispatch_dtype(dt, [&](auto t) {
    using X = decltype(t);
    clamped_swiglu_forward_kernel<X><<<grid_for_elements(n, 1), kBlockThreads, 0, stream>>>(
        static_cast<X*>(out), static_cast<const X*>(gate_up), n, alpha, limit);
    SO_CUDA_CHECK(cudaGetLastError());
  });
}

void launch_clamped_swiglu_backward(cudaStream_t stream, void* dgate_up, const void* dout, const void* gate_up,
                                    int64_t n, float alpha, float limit, DType dt) {
  if (n == 0) return;
  dispatch_dtype(dt, [&](auto t) {
    using X = decltype(t);
    clamped_swiglu_backward_kernel<X><<<grid_for_elements(n, 1), kBlockThreads, 0, stream>>>(
        static_cast<X*>(dgate_up), static_cast<const X*>(dout), static_cast<const X*>(gate_up), n, alpha, limit);
    SO_CUDA_CHECK(cudaGetLastError());
  });
}

namespace {

// Per token: the max and the normaliser of its softmax over E (one thread, experts in order, fp32).
__global__ void softmax_stats_kernel(float2* stats, const float* logits, int64_t T, int E) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < T;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float* z = logits + t * E;
    float mx = z[0];
    for (int e = 1; e < E; ++e) mx = fmaxf(mx, z[e]);
    float denom = 0.0f;
    for (int e = 0; e < E; ++e) denom += expf(z[e] - mx);
    stats[t] = make_float2(mx, denom);
  }
}

// One block per expert: its selections, and its probability summed over the tokens in fp64 in a
// fixed order (each thread a strided run, then the block's tree).
__global__ void expert_stats_kernel(int64_t* counts_acc, double* tokens, double* probs, const float* logits,
                                    const float2* stats, const int32_t* offsets, int64_t T, int E) {
  const int e = blockIdx.x;
  if (threadIdx.x == 0) {
    const int64_t n = offsets[e + 1] - offsets[e];
    if (counts_acc != nullptr) counts_acc[e] += n;
    if (tokens != nullptr) tokens[e] += static_cast<double>(n);
  }
  if (probs == nullptr) return;
  double acc = 0.0;
  for (int64_t t = threadIdx.x; t < T; t += blockDim.x) {
    const float2 st = stats[t];
    acc += static_cast<double>(expf(logits[t * E + e] - st.x) / st.y);
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) probs[e] += acc;
}

__global__ void aux_loss_kernel(MoeAuxLoss a, float* loss_acc, float* dprob, double* tokens, double* probs) {
  apply_moe_aux_loss(a, loss_acc, dprob, tokens, probs);
}

}  // namespace

size_t moe_expert_stats_workspace_bytes(int64_t T) { return static_cast<size_t>(T) * sizeof(float2); }

void launch_moe_expert_stats(cudaStream_t stream, int64_t* counts_acc, double* tokens, double* probs,
                             const float* logits, const int32_t* offsets, int64_t T, int64_t E, void* workspace) {
  auto* stats = static_cast<float2*>(workspace);
  if (probs != nullptr) {
    softmax_stats_kernel<<<grid_for_elements(T, 1), kBlockThreads, 0, stream>>>(stats, logits, T, static_cast<int>(E));
    SO_CUDA_CHECK(cudaGetLastError());
  }
  expert_stats_kernel<<<static_cast<unsigned>(E), kBlockThreads, 0, stream>>>(counts_acc, tokens, probs, logits, stats,
                                                                              offsets, T, static_cast<int>(E));
  SO_CUDA_CHECK(cudaGetLastError());
}

void launch_moe_aux_loss(cudaStream_t stream, const MoeAuxLoss& a, float* loss_acc, float* dprob, double* tokens,
                         double* probs) {
  aux_loss_kernel<<<1, 1, 0, stream>>>(a, loss_acc, dprob, tokens, probs);
  SO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace so::cuda
