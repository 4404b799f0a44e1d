// The step's validation on the device: one thread runs clip_decision.h's own functions (a few
// hundred bucket sums, a handful of ranks), so the norm, skip flag and clip coefficient equal the
// host's bit for bit and the device optimizer reads them without a trip to the host. Built with
// the project's nvcc flags, which keep IEEE double division and square root (no fast math).
#include "cuda_check.h"
#include "cuda_kernels.h"

namespace so::cuda {

namespace {

__global__ void sum_in_order_kernel(double* rank_sum, const float* bucket_sums, int64_t n) {
  *rank_sum = sum_in_order(bucket_sums, n);
}

__global__ void clip_decision_kernel(ClipDecision* out, const double* rank_sums, int ranks, float max_norm) {
  *out = decide_clip(rank_sums, ranks, max_norm);
}

}  // namespace

void launch_sum_in_order(cudaStream_t stream, double* rank_sum, const float* bucket_sums, int64_t n) {
  sum_in_order_kernel<<<1, 1, 0, stream>>>(rank_sum, bucket_sums, n);
  SO_CUDA_CHECK(cudaGetLastError());
}

void launch_clip_decision(cudaStream_t stream, ClipDecision* out, const double* rank_sums, int ranks, float max_norm) {
  clip_decision_kernel<<<1, 1, 0, stream>>>(out, rank_sums, ranks, max_norm);
  SO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace so::cuda
