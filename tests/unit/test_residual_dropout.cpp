// Residual dropout's op on the CPU backend (the reference the CUDA kernel is held to bitwise in
// tests/gpu/test_cuda_ops.cpp): the fraction kept and the scaling of what is kept, backward's mask
// equal to forward's, and masks named by run-wide tokens, so an MLP tile (row0) and a Ulysses
// shard (seq_offset) draw exactly the bits the whole micro-batch draws. The model-level checks
// (recompute, tiles, sp2, p -> 0) are cli.residual_dropout_masks and mpi.residual_dropout_masks_sp2.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "so/backend/backend.h"
#include "tests/test_util.h"

namespace so {
namespace {

class ResidualDropout : public testing::Test {
 protected:
  void SetUp() override { be_ = create_backend(test::cpu_backend_options()); }
  // x + mask(y) / (1 - p) over [rows, 64] with x = 1, y = 1 + row + channel / 64.
  std::vector<float> forward(const DropoutMask& m, int64_t rows) {
    std::vector<float> x(static_cast<size_t>(rows * kCols), 1.0f), y(x.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < kCols; ++c) y[r * kCols + c] = 1.0f + static_cast<float>(m.row0 + r) + c / 64.0f;
    DeviceBuffer dx = be_->alloc(x.size() * 4, "x"), dy = be_->alloc(y.size() * 4, "y");
    Stream& s = be_->stream(StreamKind::Compute);
    be_->copy_h2d(dx.data(), x.data(), x.size() * 4, s);
    be_->copy_h2d(dy.data(), y.data(), y.size() * 4, s);
    be_->ops().dropout_add(s, dx.data(), dy.data(), rows, kCols, m, DType::F32);
    be_->copy_d2h(x.data(), dx.data(), x.size() * 4, s);
    be_->synchronize(s);
    return x;
  }
  std::vector<float> backward(const DropoutMask& m, const std::vector<float>& grad, int64_t rows) {
    std::vector<float> out(grad.size());
    DeviceBuffer dg = be_->alloc(grad.size() * 4, "dx"), dout = be_->alloc(grad.size() * 4, "dy");
    Stream& s = be_->stream(StreamKind::Compute);
    be_->copy_h2d(dg.data(), grad.data(), grad.size() * 4, s);
    be_->ops().dropout_backward(s, dout.data(), dg.data(), rows, kCols, m, DType::F32);
    be_->copy_d2h(out.data(), dout.data(), out.size() * 4, s);
    be_->synchronize(s);
    return out;
  }
  static constexpr int64_t kCols = 64;
  std::unique_ptr<Backend> be_;
};

TEST_F(ResidualDropout, KeepsOneMinusPScaledByItsInverseAndBackwardUsesTheSameMask) {
  for (float p : {0.1f, 0.25f, 0.5f}) {
    SCOPED_TRACE(p);
    DropoutMask m;
    m.p = p;
    m.key = dropout_key(1234, 3, 1);
    m.seq_local = m.seq_global = 256;
    const int64_t rows = 1024;  // 65536 values: the kept fraction's standard deviation is below 0.002
    const std::vector<float> x = forward(m, rows);
    const float scale = static_cast<float>(1.0 / (1.0 - p));
    int64_t kept = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < kCols; ++c) {
        const float y = 1.0f + static_cast<float>(r) + c / 64.0f, got = x[r * kCols + c];
        if (got == 1.0f) continue;  // dropped (y >= 1, so a kept value is never 1)
        ++kept;
        ASSERT_EQ(got, std::fma(y, scale, 1.0f)) << "row " << r << " channel " << c;
      }
    const double fraction = static_cast<double>(kept) / static_cast<double>(rows * kCols);
    EXPECT_NEAR(fraction, 1.0 - p, 0.01);
    RecordProperty("kept_fraction_p" + std::to_string(p), std::to_string(fraction));
    const std::vector<float> g = backward(m, std::vector<float>(x.size(), 3.0f), rows);
    for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], x[i] == 1.0f ? 0.0f : 3.0f * scale) << i;
  }
}

TEST_F(ResidualDropout, TilesAndUlyssesShardsDrawTheWholeBatchsBits) {
  DropoutMask whole;
  whole.p = 0.3f;
  whole.key = dropout_key(7, 0, 0);
  whole.first_sample = 11;
  whole.seq_local = whole.seq_global = 32;  // 2 sequences of 32 tokens
  const std::vector<float> ref = forward(whole, 64);
  // The rows as MLP tiles of 24 (the last one short) compute the same values.
  for (int64_t r0 = 0; r0 < 64; r0 += 24) {
    DropoutMask tile = whole;
    tile.row0 = r0;
    const int64_t n = std::min<int64_t>(24, 64 - r0);
    const std::vector<float> got = forward(tile, n);
    ASSERT_EQ(0, std::memcmp(got.data(), ref.data() + r0 * kCols, got.size() * 4)) << "tile at row " << r0;
  }
  // Two Ulysses ranks: rank k holds positions [16k, 16k + 16) of both sequences.
  for (int64_t k = 0; k < 2; ++k) {
    DropoutMask shard = whole;
    shard.seq_local = 16, shard.seq_offset = 16 * k;
    std::vector<float> got = forward(shard, 32);
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t s = 0; s < 16; ++s)
        for (int64_t c = 0; c < kCols; ++c) {
          // forward() fills y by the block's row; undo that to compare the keep bits and scaling.
          const float y_here = 1.0f + static_cast<float>(b * 16 + s) + c / 64.0f;
          const float y_whole = 1.0f + static_cast<float>(b * 32 + 16 * k + s) + c / 64.0f;
          const float here = got[(b * 16 + s) * kCols + c], there = ref[(b * 32 + 16 * k + s) * kCols + c];
          ASSERT_EQ(here == 1.0f, there == 1.0f) << "rank " << k << " sequence " << b << " position " << s;
          if (here != 1.0f) {
            ASSERT_EQ(here, std::fma(y_here, whole.scale(), 1.0f));
          }
          if (there != 1.0f) {
            ASSERT_EQ(there, std::fma(y_whole, whole.scale(), 1.0f));
          }
        }
  }
  // Another sample, layer or seed draws another mask.
  for (auto change :
       {+[](DropoutMask& m) { m.first_sample = 12; }, +[](DropoutMask& m) { m.key = dropout_key(7, 1, 0); },
        +[](DropoutMask& m) { m.key = dropout_key(8, 0, 0); }}) {
    DropoutMask other = whole;
    change(other);
    const std::vector<float> got = forward(other, 64);
    int64_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += (got[i] == 1.0f) != (ref[i] == 1.0f);
    EXPECT_GT(differ, 64 * kCols / 4);  // about 2 p (1 - p) = 42% of the bits differ
  }
}

}  // namespace
}  // namespace so
