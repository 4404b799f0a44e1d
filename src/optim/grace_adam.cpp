#include "so/optim/grace_adam.h"

#include <algorithm>
#include <cstdint>

#include "so/core/error.h"

namespace so {

GraceAdam::GraceAdam(std::vector<int> cores, SimdIsa isa) : kernels_(adam_kernels(isa)), pool_(std::move(cores)) {}

SimdIsa GraceAdam::isa() const { return kernels_.isa; }
int GraceAdam::threads() const { return pool_.size(); }
const ThreadPool& GraceAdam::pool() const { return pool_; }

template <typename Fn>
void GraceAdam::for_blocks(const void* anchor, size_t elem_size, int64_t n, Fn&& fn) {
  // A short head up to the anchor array's first 64-byte boundary, then kBlock elements each.
  const auto addr = reinterpret_cast<uintptr_t>(anchor);
  const auto head_elems = static_cast<int64_t>((64 - addr % 64) % 64 / elem_size);
  const int64_t head = addr % elem_size == 0 ? std::min(n, head_elems) : 0;
  const int64_t blocks = (head > 0 ? 1 : 0) + (n - head + kBlock - 1) / kBlock;
  std::lock_guard<std::mutex> lock(pool_mu_);
  pool_.parallel_for(blocks, [&](int64_t b) {
    const int64_t begin = head > 0 ? (b == 0 ? 0 : head + (b - 1) * kBlock) : b * kBlock;
    const int64_t end = head > 0 && b == 0 ? head : std::min(n, begin + kBlock);
    fn(begin, end);
  });
}

void GraceAdam::step(const AdamArrays& a, int64_t n, const AdamWParams& hp) {
  for_blocks(a.p, sizeof(float), n, [&](int64_t b, int64_t e) { kernels_.step(a.from(b), e - b, hp); });
}

void GraceAdam::rollback(const AdamArrays& a, int64_t n, const AdamWParams& hp) {
  SO_CHECK(a.has_snapshot() || hp.lr * hp.weight_decay != 1.0, "GraceAdam::rollback: lr * weight_decay = 1 zeroes the ",
           "weights; the step cannot be inverted (the exact rollback can)");
  for_blocks(a.p, sizeof(float), n, [&](int64_t b, int64_t e) { kernels_.rollback(a.from(b), e - b, hp); });
}

void GraceAdam::redo(const AdamArrays& a, int64_t n, const AdamWParams& hp, float final_scale) {
  for_blocks(a.p, sizeof(float), n, [&](int64_t b, int64_t e) { kernels_.redo(a.from(b), e - b, hp, final_scale); });
}

void GraceAdam::stream_probe(const AdamArrays& a, int64_t n, StreamProbe kind) {
  for_blocks(a.p, sizeof(float), n, [&](int64_t b, int64_t e) { kernels_.stream_probe(a.from(b), e - b, kind); });
}

double GraceAdam::sum_squares(const void* x, DType dt, int64_t n) {
  // Chunks are fixed (kSumSquaresChunk) whoever computes them, and their sums are added in index
  // order: the same double as sum_squares_chunked for any thread count.
  constexpr int64_t kChunksPerTask = 4;
  const int64_t chunks = (n + kSumSquaresChunk - 1) / kSumSquaresChunk;
  std::lock_guard<std::mutex> lock(pool_mu_);  // partials_ too
  partials_.assign(chunks, 0.0);
  const auto* bytes = static_cast<const char*>(x);
  pool_.parallel_for((chunks + kChunksPerTask - 1) / kChunksPerTask, [&](int64_t t) {
    for (int64_t c = t * kChunksPerTask; c < std::min(chunks, (t + 1) * kChunksPerTask); ++c) {
      const int64_t begin = c * kSumSquaresChunk;
      partials_[c] = kernels_.sum_squares(bytes + begin * dtype_size(dt), dt, std::min(kSumSquaresChunk, n - begin));
    }
  });
  double total = 0.0;
  for (double s : partials_) total += s;
  return total;
}

void GraceAdam::cast(void* dst, DType dst_dt, const void* src, DType src_dt, int64_t n) {
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  for_blocks(src, dtype_size(src_dt), n, [&](int64_t b, int64_t e) {
    kernels_.cast(d + b * dtype_size(dst_dt), dst_dt, s + b * dtype_size(src_dt), src_dt, e - b);
  });
}

void GraceAdam::add(float* acc, const void* x, DType dt, int64_t n) {
  SO_CHECK(dt == DType::F32 || dt == DType::BF16, "GraceAdam::add: ", dtype_name(dt), " gradients");
  for_blocks(acc, sizeof(float), n, [&](int64_t b, int64_t e) {
    if (dt == DType::F32) {
      const float* src = static_cast<const float*>(x);
      for (int64_t i = b; i < e; ++i) acc[i] += src[i];
    } else {
      const bf16* src = static_cast<const bf16*>(x);
      for (int64_t i = b; i < e; ++i) acc[i] += bf16_to_f32(src[i]);
    }
  });
}

}  // namespace so
