#pragma once
// GraceAdam: the CPU optimizer of offloaded buckets. AdamW over fp32 master weights and moments
// that writes the device's copy of the weights (bf16 or fp32) in the same pass, with the best
// SIMD kernels of this CPU, parallelised over its own pinned thread pool.
#include <cstdint>
#include <mutex>
#include <vector>

#include "so/optim/adam_kernels.h"
#include "so/optim/thread_pool.h"

namespace so {

class GraceAdam {
 public:
  GraceAdam(std::vector<int> cores, SimdIsa isa);

  SimdIsa isa() const;
  int threads() const;
  const ThreadPool& pool() const;

  // Same contracts as AdamKernels, split over the pool in cache-friendly blocks.
  void step(const AdamArrays& a, int64_t n, const AdamWParams& hp);
  // Without a snapshot: an error when lr * weight_decay == 1 (that step zeroed the weights and
  // cannot be inverted).
  void rollback(const AdamArrays& a, int64_t n, const AdamWParams& hp);
  void redo(const AdamArrays& a, int64_t n, const AdamWParams& hp, float final_scale);
  void stream_probe(const AdamArrays& a, int64_t n, StreamProbe kind);  // so_bench adam's memory bound
  // Equal to sum_squares_chunked(kernels, ...) bit for bit, whatever the thread count.
  double sum_squares(const void* x, DType dt, int64_t n);
  void cast(void* dst, DType dst_dt, const void* src, DType src_dt, int64_t n);
  // acc[i] += x[i] (x fp32 or bf16, widened): gradients of one more micro-batch into the step's sums.
  void add(float* acc, const void* x, DType dt, int64_t n);

  // Elements per work item: p, m, v of one block (768 KiB) stay within a core's L2 share, and a
  // 64-byte aligned block start keeps two threads from writing the same cache line.
  static constexpr int64_t kBlock = 65536;

 private:
  // Runs fn(begin, end) over [0, n) in blocks whose boundaries are 64-byte aligned in `anchor`
  // (an array of elem_size-byte elements).
  template <typename Fn>
  void for_blocks(const void* anchor, size_t elem_size, int64_t n, Fn&& fn);

  const AdamKernels& kernels_;
  ThreadPool pool_;
  std::mutex pool_mu_;            // the pool runs one loop at a time; the offload optimizer calls from two threads
  std::vector<double> partials_;  // one per kSumSquaresChunk, summed in index order
};

}  // namespace so
