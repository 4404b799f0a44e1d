// ZeRO-3 partition arithmetic and the Ulysses data movement, without MPI: every element of every
// bucket is owned by exactly one rank, one-rank layouts are the flat layout, sequence slices
// carry global positions, and the pack/replicate ops invert as the model relies on.
#include <gtest/gtest.h>

#include "so/backend/backend.h"
#include "so/core/random.h"
#include "so/data/batch_sampler.h"
#include "so/engine/shard_layout.h"
#include "so/model/model_config.h"
#include "tests/test_util.h"

namespace so {
namespace {

std::vector<Bucket> tiny_buckets() {
  const ParamLayout layout = ParamLayout::for_model(ModelConfig::from_hf_file("configs/models/tiny.json"));
  return make_buckets(layout, 60000);
}

TEST(ShardLayout, OneRankIsTheFlatLayout) {
  const std::vector<Bucket> buckets = tiny_buckets();
  const ShardLayout sl = make_shard_layout(buckets, 1, 0);
  for (size_t b = 0; b < buckets.size(); ++b) {
    EXPECT_EQ(sl.buckets[b].shard_begin, buckets[b].begin);
    EXPECT_EQ(sl.buckets[b].shard_size, buckets[b].size());
  }
}

TEST(ShardLayout, EveryElementHasExactlyOneOwner) {
  const std::vector<Bucket> buckets = tiny_buckets();
  for (int world : {2, 3, 4, 7}) {
    std::vector<ShardLayout> ranks;
    for (int r = 0; r < world; ++r) ranks.push_back(make_shard_layout(buckets, world, r));
    for (size_t b = 0; b < buckets.size(); ++b) {
      EXPECT_EQ(ranks[0].buckets[b].shard_size % 16, 0) << "shards keep SIMD alignment";
      EXPECT_GE(ranks[0].padded_size(b), buckets[b].size());
      EXPECT_LT(ranks[0].padded_size(b) - buckets[b].size(), world * 16);
      std::vector<int> owners(static_cast<size_t>(buckets[b].size()), 0);
      for (int r = 0; r < world; ++r) {
        const auto part = owned_part(ranks[r], buckets[b], b, buckets[b].begin, buckets[b].size());
        if (!part) continue;
        EXPECT_GE(part->dst, ranks[r].buckets[b].shard_begin);
        EXPECT_LE(part->dst + part->n, ranks[r].buckets[b].shard_begin + ranks[r].buckets[b].shard_size);
        for (int64_t i = part->src; i < part->src + part->n; ++i) owners[i]++;
      }
      for (size_t i = 0; i < owners.size(); ++i)
        ASSERT_EQ(owners[i], 1) << "world " << world << " bucket " << b << " element " << i;
    }
    EXPECT_EQ(ranks[0].total, ranks[world - 1].total);
  }
}

TEST(UlyssesData, SlicesKeepGlobalPositions) {
  TokenBatch b;
  for (int i = 0; i < 2 * 8; ++i)
    b.inputs.push_back(100 + i), b.targets.push_back(200 + i), b.positions.push_back(i % 8);
  const TokenBatch part = slice_sequences(b, 8, 4, 2);
  EXPECT_EQ(part.inputs, (std::vector<int32_t>{104, 105, 112, 113}));
  EXPECT_EQ(part.targets, (std::vector<int32_t>{204, 205, 212, 213}));
  EXPECT_EQ(part.positions, (std::vector<int32_t>{4, 5, 4, 5}));
  EXPECT_THROW(slice_sequences(b, 8, 3, 0), Error);
}

TEST(UlyssesOps, TransposeBlocksAndReplicateHeads) {
  auto be = create_backend(test::cpu_backend_options());
  Stream& s = be->stream(StreamKind::Compute);
  std::vector<float> x(3 * 5 * 7);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(random_normal(1, 2, i));
  for (DType dt : {DType::F32, DType::BF16}) {
    DeviceBuffer src = test::upload(*be, x, dt);
    DeviceBuffer t = be->alloc(x.size() * dtype_size(dt), "t"), back = be->alloc(x.size() * dtype_size(dt), "b");
    be->ops().transpose_blocks(s, t.data(), src.data(), 3, 5, 7, dt);
    be->ops().transpose_blocks(s, back.data(), t.data(), 5, 3, 7, dt);
    const std::vector<float> tt = test::download(*be, t.data(), x.size(), dt);
    const std::vector<float> orig = test::download(*be, src.data(), x.size(), dt);
    EXPECT_EQ(test::download(*be, back.data(), x.size(), dt), orig);
    EXPECT_EQ(tt[(4 * 3 + 2) * 7 + 6], orig[(2 * 5 + 4) * 7 + 6]);  // dst[j][i] = src[i][j]
    // 3 rows x 5 heads of 7 replicated twice, then summed back: 2x the input.
    DeviceBuffer rep = be->alloc(2 * x.size() * dtype_size(dt), "rep"), sum = be->alloc(x.size() * dtype_size(dt), "s");
    const HeadReplication copies{.rows = 3, .heads = 5, .copies = 2, .head_dim = 7, .dtype = dt};
    be->ops().replicate_heads(s, copies, rep.data(), src.data(), false);
    be->ops().replicate_heads(s, copies, sum.data(), rep.data(), true);
    const std::vector<float> r = test::download(*be, rep.data(), 2 * x.size(), dt);
    EXPECT_EQ(r[((1 * 5 + 3) * 2 + 1) * 7 + 4], orig[(1 * 5 + 3) * 7 + 4]);
    const std::vector<float> two = test::download(*be, sum.data(), x.size(), dt);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(two[i], 2.0f * orig[i]) << i;
  }
}

}  // namespace
}  // namespace so
