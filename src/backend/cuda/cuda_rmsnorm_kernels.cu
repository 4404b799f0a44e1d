// RMSNorm forward and backward: one block per row (grid-stride over rows), threads over N-element
// column groups, fp32 block reductions in a fixed order.
//
// The weight gradient sums over rows. Determinism rules out atomics, so the backward's row blocks
// are a fixed number G of blocks; block b accumulates rows b, b+G, ... into its own fp32 partial row
// of the workspace, and a second kernel adds the G partials per column in a fixed order.
#include <algorithm>

#include "cuda_bf16.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_launch.cuh"
#include "cuda_reduce.cuh"

namespace so::cuda {

namespace {

// Blocks of the backward's row pass: the partial rows of dw (G x dim fp32 of workspace).
constexpr int64_t kRmsnormBackwardBlocks = 512;

int64_t backward_blocks(int64_t rows) { return std::min(rows, kRmsnormBackwardBlocks); }

template <typename T, int N>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* x, const T* w, int64_t rows, int64_t dim,
                                       float eps) {
  const int64_t first = threadIdx.x * static_cast<int64_t>(N), stride = static_cast<int64_t>(blockDim.x) * N;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * dim;
    float ss = 0.0f;
    for (int64_t i = first; i < dim; i += stride) {
      float xv[N];
      load_f32<N>(xv, xr, i, dim);
#pragma unroll
      for (int k = 0; k < N; ++k) ss += xv[k] * xv[k];
    }
    ss = block_sum(ss);
    const float rs = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
    if (threadIdx.x == 0) rstd[r] = rs;
    T* o = out + r * dim;
    for (int64_t i = first; i < dim; i += stride) {
      float xv[N], wv[N], ov[N];
      load_f32<N>(xv, xr, i, dim);
      load_f32<N>(wv, w, i, dim);
#pragma unroll
      for (int k = 0; k < N; ++k) ov[k] = wv[k] * (xv[k] * rs);
      store_f32<N>(o, ov, i, dim);
    }
  }
}

// v[k] += the N values of row p at column i (a row of dim values).
template <int N, typename T>
__device__ __forceinline__ void add_loaded(float (&v)[N], const T* p, int64_t i, int64_t dim) {
  float prev[N];
  load_f32<N>(prev, p, i, dim);
#pragma unroll
  for (int k = 0; k < N; ++k) v[k] += prev[k];
}

// y = w x r with r = rstd:  dx_i = r w_i dy_i - x_i r^3/dim sum_j w_j dy_j x_j;  dw_i += dy_i x_i r.
// Block b writes its partial dw row dw_partial[b] (its first row stores, later rows add). With
// G > 0 (rows of at most G column groups per thread) the partial stays in registers and is stored
// once: the same additions in the same order, without reading and writing a 4*dim-byte row of
// workspace per row of x, which was more traffic than x, dy and dx together.
template <typename T, int N, int G>
__global__ void rmsnorm_backward_rows_kernel(T* dx, float* dw_partial, const T* dout, const T* x, const T* w,
                                             const float* rstd, int64_t rows, int64_t dim, bool accumulate) {
  const int64_t first = threadIdx.x * static_cast<int64_t>(N), stride = static_cast<int64_t>(blockDim.x) * N;
  float* partial = dw_partial + blockIdx.x * dim;
  float held[G > 0 ? G : 1][N];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * dim;
    const T* dyr = dout + r * dim;
    T* dxr = dx + r * dim;
    const float rs = rstd[r];
    float dot = 0.0f;
    for (int64_t i = first; i < dim; i += stride) {
      float xv[N], wv[N], dy[N];
      load_f32<N>(xv, xr, i, dim);
      load_f32<N>(wv, w, i, dim);
      load_f32<N>(dy, dyr, i, dim);
#pragma unroll
      for (int k = 0; k < N; ++k) dot += wv[k] * dy[k] * xv[k];
    }
    dot = block_sum(dot);
    const float c = rs * rs * rs * dot / static_cast<float>(dim);
    const bool first_row = r == blockIdx.x;
    // Unrolled for G > 0, so held[] is indexed by constants and stays in registers.
#pragma unroll
    for (int g_index = 0; G == 0 || g_index < G; ++g_index) {
      const int64_t i = first + g_index * stride;
      if (i >= dim) break;
      float xv[N], wv[N], dy[N], g[N], dw[N];
      load_f32<N>(xv, xr, i, dim);
      load_f32<N>(wv, w, i, dim);
      load_f32<N>(dy, dyr, i, dim);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        g[k] = rs * wv[k] * dy[k] - xv[k] * c;
        dw[k] = dy[k] * xv[k] * rs;
      }
      if (accumulate) add_loaded<N>(g, dxr, i, dim);
      store_f32<N>(dxr, g, i, dim);
      if constexpr (G > 0) {
#pragma unroll
        for (int k = 0; k < N; ++k) held[g_index][k] = first_row ? dw[k] : dw[k] + held[g_index][k];
      } else {
        if (!first_row) add_loaded<N>(dw, partial, i, dim);
        store_f32<N>(partial, dw, i, dim);
      }
    }
  }
  if constexpr (G > 0) {
#pragma unroll
    for (int g_index = 0; g_index < G; ++g_index)
      if (first + g_index * stride < dim) store_f32<N>(partial, held[g_index], first + g_index * stride, dim);
  }
}

// dw[i] += sum over b of dw_partial[b][i], in a fixed order. A block takes 32 columns (a lane each);
// warp w sums its contiguous share of the partial rows in order, then lane i of warp 0 adds the
// warps' sums in warp order: parallel enough for G partials, and the same order on every run.
template <typename T>
__global__ void rmsnorm_backward_dw_kernel(T* dw, const float* dw_partial, int64_t blocks, int64_t dim) {
  __shared__ float warp_sums[kBlockThreads / 32][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int64_t per_warp = (blocks + warps - 1) / warps;
  const int64_t b_begin = warp * per_warp, b_end = b_begin + per_warp < blocks ? b_begin + per_warp : blocks;
  for (int64_t col0 = blockIdx.x * int64_t{32}; col0 < dim; col0 += gridDim.x * int64_t{32}) {
    const int64_t col = col0 + lane;
    float sum = 0.0f;
    if (col < dim)
      for (int64_t b = b_begin; b < b_end; ++b) sum += dw_partial[b * dim + col];
    warp_sums[warp][lane] = sum;
    __syncthreads();
    if (warp == 0 && col < dim) {
      float total = 0.0f;
      for (int w = 0; w < warps; ++w) total += warp_sums[w][lane];
      dw[col] = from_float<T>(to_float(dw[col]) + total);
    }
    __syncthreads();  // warp_sums is rewritten for the next columns
  }
}

}  // namespace

void launch_rmsnorm_forward(cudaStream_t stream, void* out, float* rstd, const void* x, const void* w, int64_t rows,
                            int64_t dim, float eps, DType dt) {
  if (rows == 0 || dim == 0) return;
  dispatch_dtype(dt, [&](auto t) {
    using X = decltype(t);
    const bool wide = aligned16(out) && aligned16(x) && aligned16(w) && dim % kVec16<X> == 0;
    with_vector_width<kVec16<X>>(wide, [&](auto vw) {
      constexpr int N = decltype(vw)::value;
      rmsnorm_forward_kernel<X, N><<<grid_for(rows), kBlockThreads, 0, stream>>>(
          static_cast<X*>(out), rstd, static_cast<const X*>(x), static_cast<const X*>(w), rows, dim, eps);
      SO_CUDA_CHECK(cudaGetLastError());
    });
  });
}

size_t rmsnorm_backward_workspace_bytes(int64_t rows, int64_t dim) {
  return static_cast<size_t>(backward_blocks(rows) * dim) * sizeof(float);
}

void launch_rmsnorm_backward(cudaStream_t stream, void* dx, void* dw_acc, const void* dout, const void* x,
                             const void* w, const float* rstd, int64_t rows, int64_t dim, bool accumulate, DType dt,
                             void* workspace, size_t workspace_bytes) {
  if (rows == 0 || dim == 0) return;
  SO_CHECK(workspace_bytes >= rmsnorm_backward_workspace_bytes(rows, dim), "rmsnorm_backward: workspace of ",
           workspace_bytes, " bytes, need ", rmsnorm_backward_workspace_bytes(rows, dim));
  const int64_t blocks = backward_blocks(rows);
  auto* partial = static_cast<float*>(workspace);
  dispatch_dtype(dt, [&](auto t) {
    using X = decltype(t);
    const bool wide =
        aligned16(dx) && aligned16(dout) && aligned16(x) && aligned16(w) && aligned16(partial) && dim % kVec16<X> == 0;
    with_vector_width<kVec16<X>>(wide, [&](auto vw) {
      constexpr int N = decltype(vw)::value;
      // Up to four column groups per thread (dim <= 8192 in bf16 vectors) keep dw in registers.
      const auto launch = [&](auto kernel) {
        kernel<<<static_cast<unsigned>(blocks), kBlockThreads, 0, stream>>>(
            static_cast<X*>(dx), partial, static_cast<const X*>(dout), static_cast<const X*>(x),
            static_cast<const X*>(w), rstd, rows, dim, accumulate);
        SO_CUDA_CHECK(cudaGetLastError());
      };
      if (dim <= int64_t{4} * kBlockThreads * N)
        launch(rmsnorm_backward_rows_kernel<X, N, 4>);
      else
        launch(rmsnorm_backward_rows_kernel<X, N, 0>);
    });
    rmsnorm_backward_dw_kernel<X>
        <<<grid_for((dim + 31) / 32), kBlockThreads, 0, stream>>>(static_cast<X*>(dw_acc), partial, blocks, dim);
    SO_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace so::cuda
