// Sum of squares for the gradient norm, in the structure of so::sum_squares_chunked so the device
// buckets and the CPU-offloaded ones (GraceAdam) agree: one block per kSumSquaresChunk-element chunk
// sums x^2 in double (x^2 of an fp32 value is exact in double) into the workspace, then one block
// adds the chunk sums in double and adds that total rounded to float to out_acc. Only the order of
// the additions differs from the CPU's, which moves the double by an ulp or so, almost never the
// float. Both passes run in a fixed order: the result is reproducible.
#include "cuda_bf16.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_launch.cuh"
#include "cuda_reduce.cuh"
#include "so/optim/adam_kernels.h"

namespace so::cuda {

namespace {

int64_t chunk_count(int64_t n) { return (n + kSumSquaresChunk - 1) / kSumSquaresChunk; }

template <typename T, int N>
__global__ void sum_squares_chunks_kernel(double* chunk_sums, const T* x, int64_t n) {
  for (int64_t c = blockIdx.x; c * kSumSquaresChunk < n; c += gridDim.x) {
    const int64_t begin = c * kSumSquaresChunk;
    const int64_t end = begin + kSumSquaresChunk < n ? begin + kSumSquaresChunk : n;
    double sum = 0.0;
    for (int64_t i = begin + threadIdx.x * static_cast<int64_t>(N); i < end;
         i += static_cast<int64_t>(blockDim.x) * N) {
      float v[N];
      load_f32<N>(v, x, i, end);
#pragma unroll
      for (int k = 0; k < N; ++k) sum += static_cast<double>(v[k]) * static_cast<double>(v[k]);
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) chunk_sums[c] = sum;
  }
}

// One block: each thread sums a contiguous run of chunk sums in order, then a fixed tree joins the
// runs. One thread walking every chunk sum took ~1.4 ms at 2^28 elements (16384 dependent loads), 8x
// the chunk pass itself. The order is fixed (reproducible) and differs from the CPU's left-to-right
// one by ulps of the double, as the order inside a chunk does.
constexpr int kTotalThreads = 1024;
__global__ void sum_squares_total_kernel(float* out_acc, const double* chunk_sums, int64_t chunks) {
  const int64_t per = (chunks + kTotalThreads - 1) / kTotalThreads;
  const int64_t begin = threadIdx.x * per, end = begin + per < chunks ? begin + per : chunks;
  double run = 0.0;
  for (int64_t c = begin; c < end; ++c) run += chunk_sums[c];
  run = block_sum(run);
  if (threadIdx.x == 0) *out_acc += static_cast<float>(run);
}

}  // namespace

size_t sum_squares_workspace_bytes(int64_t n) { return static_cast<size_t>(chunk_count(n)) * sizeof(double); }

void launch_sum_squares(cudaStream_t stream, float* out_acc, const void* x, int64_t n, DType dt, void* workspace,
                        size_t workspace_bytes) {
  if (n == 0) return;
  SO_CHECK(workspace_bytes >= sum_squares_workspace_bytes(n), "sum_squares: workspace of ", workspace_bytes,
           " bytes, need ", sum_squares_workspace_bytes(n));
  auto* chunk_sums = static_cast<double*>(workspace);
  const int64_t chunks = chunk_count(n);
  dispatch_dtype(dt, [&](auto t) {
    using X = decltype(t);
    // kSumSquaresChunk is a multiple of any N, so aligned chunks start aligned.
    with_vector_width<kVec16<X>>(aligned16(x), [&](auto vw) {
      constexpr int N = decltype(vw)::value;
      sum_squares_chunks_kernel<X, N>
          <<<grid_for(chunks), kBlockThreads, 0, stream>>>(chunk_sums, static_cast<const X*>(x), n);
      SO_CUDA_CHECK(cudaGetLastError());
    });
  });
  sum_squares_total_kernel<<<1, kTotalThreads, 0, stream>>>(out_acc, chunk_sums, chunks);
  SO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace so::cuda
