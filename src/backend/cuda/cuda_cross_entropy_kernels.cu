// Cross-entropy over rows of fp32 logits, one block per row (V up to ~150k): each thread keeps an
// online (max, sum of exp) over its N-element groups, the block combines them (max first, then the
// rescaled sums), and the row's nll = logsumexp - z[target] (+ OLMo's z-loss, z_loss * logsumexp^2)
// goes to the workspace in double. With dlogits, a second sweep over the row writes
// scale * (softmax * (1 + 2 z_loss lse) - onehot). No [rows x V] scratch.
// The loss is then added by one block in a fixed order, so loss_acc is bitwise reproducible:
// loss_acc += float(scale * sum of nll), the CPU's expression.
#include <cmath>

#include "cuda_bf16.cuh"
#include "cuda_check.h"
#include "cuda_device_error.cuh"
#include "cuda_kernels.h"
#include "cuda_launch.cuh"
#include "cuda_reduce.cuh"

namespace so::cuda {

namespace {

// Threads per row block: V / (512 * 4) ~ 75 float4 loads per thread at V = 150k.
constexpr int kRowThreads = 512;

template <typename T, int N>
__global__ void cross_entropy_rows_kernel(double* nll, T* dlogits, const float* logits, const int32_t* targets,
                                          int64_t rows, int64_t V, float scale, float z_loss, DeviceError* err) {
  const int64_t first = threadIdx.x * static_cast<int64_t>(N), stride = static_cast<int64_t>(blockDim.x) * N;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int32_t y = targets[r];
    T* dz = dlogits != nullptr ? dlogits + r * V : nullptr;
    if (y < 0 || y >= V) {  // ignored (padding) or out of range: the row adds no loss
      if (threadIdx.x == 0) {
        nll[r] = 0.0;
        if (y >= V) report_device_error(err, kTargetOutOfRange, r, y, V);
      }
      if (dz != nullptr && y < 0) {
        const float zero[N] = {};
        for (int64_t i = first; i < V; i += stride) store_f32<N>(dz, zero, i, V);
      }
      continue;
    }
    const float* z = logits + r * V;
    // Online max / sum of exp over this thread's elements. A thread's max stays -inf until it meets
    // a value above -inf; its sum is then 0 (or NaN, which must survive to the loss).
    float m = -INFINITY, s = 0.0f;
    for (int64_t i = first; i < V; i += stride) {
      float zv[N];
      load_f32<N>(zv, z, i, V);
      const int valid = static_cast<int>(V - i < N ? V - i : N);
      float group_max = -INFINITY;
#pragma unroll
      for (int k = 0; k < N; ++k)
        if (k < valid) group_max = fmaxf(group_max, zv[k]);
      const float m_new = fmaxf(m, group_max);
      if (m_new == -INFINITY) continue;  // everything so far is -inf: exp() of it adds nothing
      float group_sum = 0.0f;
#pragma unroll
      for (int k = 0; k < N; ++k)
        if (k < valid) group_sum += expf(zv[k] - m_new);
      s = s * expf(m - m_new) + group_sum;
      m = m_new;
    }
    const float row_max = block_reduce(m, MaxOp{}, -INFINITY);
    const float row_sum = block_sum(m == -INFINITY ? s : s * expf(m - row_max));
    const double lse = static_cast<double>(row_max) + ::log(static_cast<double>(row_sum));
    if (threadIdx.x == 0)  // the z term only when on: an infinite lse must stay infinite, not NaN
      nll[r] = lse - static_cast<double>(z[y]) + (z_loss != 0.0f ? static_cast<double>(z_loss) * lse * lse : 0.0);
    if (dz == nullptr) continue;
    const float lse_f = static_cast<float>(lse);
    const float softmax_scale = static_cast<float>(1.0 + 2.0 * static_cast<double>(z_loss) * lse);  // 1 when off
    for (int64_t i = first; i < V; i += stride) {
      float zv[N], d[N];
      load_f32<N>(zv, z, i, V);
#pragma unroll
      for (int k = 0; k < N; ++k) d[k] = scale * (expf(zv[k] - lse_f) * softmax_scale - (i + k == y ? 1.0f : 0.0f));
      store_f32<N>(dz, d, i, V);
    }
  }
}

// loss_acc += float(scale * sum_r nll[r]): one block, fixed order (thread strides, then the tree).
__global__ void cross_entropy_loss_kernel(float* loss_acc, const double* nll, int64_t rows, float scale) {
  double sum = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) sum += nll[r];
  sum = block_sum(sum);
  if (threadIdx.x == 0) *loss_acc += static_cast<float>(static_cast<double>(scale) * sum);
}

}  // namespace

size_t cross_entropy_workspace_bytes(int64_t rows) { return static_cast<size_t>(rows) * sizeof(double); }

void launch_cross_entropy(cudaStream_t stream, float* loss_acc, void* dlogits, const float* logits,
                          const int32_t* targets, int64_t rows, int64_t V, float scale, float z_loss, DType dt,
                          DeviceError* err, void* workspace, size_t workspace_bytes) {
  if (rows == 0) return;
  SO_CHECK(workspace_bytes >= cross_entropy_workspace_bytes(rows), "cross_entropy: workspace of ", workspace_bytes,
           " bytes, need ", cross_entropy_workspace_bytes(rows));
  auto* nll = static_cast<double*>(workspace);
  dispatch_dtype(dt, [&](auto t) {
    using X = decltype(t);
    // Groups of 4: one float4 of logits; a bf16 dlogits group is then an 8-byte store.
    with_vector_width<4>(aligned16(logits) && aligned16(dlogits) && V % 4 == 0, [&](auto vw) {
      constexpr int N = decltype(vw)::value;
      cross_entropy_rows_kernel<X, N><<<grid_for(rows), kRowThreads, 0, stream>>>(nll, static_cast<X*>(dlogits), logits,
                                                                                  targets, rows, V, scale, z_loss, err);
      SO_CUDA_CHECK(cudaGetLastError());
    });
  });
  cross_entropy_loss_kernel<<<1, kBlockThreads, 0, stream>>>(loss_acc, nll, rows, scale);
  SO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace so::cuda
