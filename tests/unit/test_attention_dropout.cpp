// Attention-probability dropout (AttentionMask::dropout) on the CPU backend, the reference the
// CUDA flash kernels are held to in tests/gpu/test_cuda_ops.cpp: p = 0 is the path without
// dropout bitwise; with V one-hot per key the output is P itself, so each kept probability shows
// as P / (1 - p) and each dropped one as 0 (the fraction kept, the scaling, lse unchanged); a
// Ulysses rank's block of heads (first_head) draws the bits the whole set of heads draws; the
// model drops only when it trains (a forward without backward is evaluation). The gradient is
// tests/unit/test_ops_gradcheck.cpp's; recompute and sp2 in a model are
// cli.attention_dropout_masks and mpi.attention_dropout_masks_sp2.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "parallel/communicator.h"
#include "so/backend/backend.h"
#include "so/data/batch_sampler.h"
#include "so/engine/engine.h"
#include "so/model/decoder_model.h"
#include "so/train/memory_plan.h"
#include "so/train/run_config.h"
#include "tests/test_util.h"

namespace so {
namespace {

struct Attention {
  std::vector<float> out, lse;
};

class AttentionDropout : public testing::Test {
 protected:
  std::unique_ptr<Backend> be = create_backend(test::cpu_backend_options());

  // Forward over [B*S, H*D] q and [B*S, Hkv*D] k, v (host, fp32).
  Attention forward(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v, int64_t B,
                    int64_t S, int64_t Hq, int64_t Hkv, int64_t D, const AttentionMask& m) {
    Stream& s = be->stream(StreamKind::Compute);
    auto Q = test::upload(*be, q, DType::F32), K = test::upload(*be, k, DType::F32),
         V = test::upload(*be, v, DType::F32);
    auto O = be->alloc(q.size() * 4, "o"), L = be->alloc(static_cast<size_t>(B * Hq * S) * 4, "lse");
    const AttentionShape a{B, S, Hq, Hkv, D, 1.0f / std::sqrt(static_cast<float>(D))};
    be->ops().attention_forward(s, a, m, a.inputs(DType::F32, Q.data(), K.data(), V.data()),
                                a.query_view(O.data(), DType::F32), a.lse_view(L.data()));
    return {test::download(*be, O.data(), q.size(), DType::F32),
            test::download(*be, L.data(), static_cast<size_t>(B * Hq * S), DType::F32)};
  }
};

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

AttentionMask dropping(float p, int64_t first_sample = 3, int64_t first_head = 0) {
  AttentionMask m;
  m.dropout.p = p;
  m.dropout.key = dropout_key(11, 2, 2);
  m.dropout.first_sample = first_sample;
  m.first_head = first_head;
  return m;
}

TEST_F(AttentionDropout, ZeroProbabilityIsThePathWithoutDropoutBitwise) {
  const int64_t B = 2, S = 40, Hq = 4, Hkv = 2, D = 8;
  const auto q = randn(B * S * Hq * D, 1), k = randn(B * S * Hkv * D, 2), v = randn(B * S * Hkv * D, 3);
  const Attention plain = forward(q, k, v, B, S, Hq, Hkv, D, AttentionMask{});
  const Attention zero = forward(q, k, v, B, S, Hq, Hkv, D, dropping(0.0f));
  EXPECT_EQ(0, std::memcmp(plain.out.data(), zero.out.data(), plain.out.size() * 4));
  EXPECT_EQ(0, std::memcmp(plain.lse.data(), zero.lse.data(), plain.lse.size() * 4));
  const Attention dropped = forward(q, k, v, B, S, Hq, Hkv, D, dropping(0.2f));
  EXPECT_NE(0, std::memcmp(plain.out.data(), dropped.out.data(), plain.out.size() * 4));
}

// V = identity (D = S, key j's value the unit vector e_j): out[i, h, j] = P_ij keep_ij / (1 - p).
TEST_F(AttentionDropout, KeepsOneMinusPAndScalesWhatItKeeps) {
  const int64_t B = 2, S = 256, Hq = 4, Hkv = 2, D = S;
  const float p = 0.25f;
  std::vector<float> v(static_cast<size_t>(B * S * Hkv * D), 0.0f);
  for (int64_t t = 0; t < B * S; ++t)
    for (int64_t h = 0; h < Hkv; ++h) v[(t * Hkv + h) * D + t % S] = 1.0f;
  const auto q = randn(B * S * Hq * D, 4), k = randn(B * S * Hkv * D, 5);
  const Attention plain = forward(q, k, v, B, S, Hq, Hkv, D, AttentionMask{});
  const Attention dropped = forward(q, k, v, B, S, Hq, Hkv, D, dropping(p));
  EXPECT_EQ(0, std::memcmp(plain.lse.data(), dropped.lse.data(), plain.lse.size() * 4)) << "lse is the undropped P's";
  int64_t kept = 0, visible = 0, wrong = 0;
  for (int64_t t = 0; t < B * S; ++t)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t j = 0; j <= t % S; ++j) {
        const float P = plain.out[(t * Hq + h) * D + j], got = dropped.out[(t * Hq + h) * D + j];
        ++visible;
        if (got != 0.0f) {
          ++kept;
          if (std::fabs(got - P / (1.0f - p)) > 1e-6f * std::fabs(got)) ++wrong;
        }
      }
  const double fraction = static_cast<double>(kept) / static_cast<double>(visible);
  // 263168 Bernoulli draws: the standard deviation of the fraction is 0.00084.
  EXPECT_NEAR(fraction, 1.0 - p, 0.006) << kept << " of " << visible << " kept";
  EXPECT_EQ(wrong, 0) << "kept probabilities not scaled by 1 / (1 - p)";
}

// Two Ulysses ranks each hold half the heads (and the KV heads those need) of the whole sequence;
// with first_head naming their global index, each draws what the single rank draws for them.
TEST_F(AttentionDropout, ABlockOfHeadsDrawsWhatAllHeadsDraw) {
  const int64_t B = 2, S = 48, Hq = 4, Hkv = 2, D = 8, half = Hq / 2;
  const auto q = randn(B * S * Hq * D, 6), k = randn(B * S * Hkv * D, 7), v = randn(B * S * Hkv * D, 8);
  const Attention whole = forward(q, k, v, B, S, Hq, Hkv, D, dropping(0.3f));
  for (int64_t rank = 0; rank < 2; ++rank) {
    // The rank's heads: query heads [rank * half, +half), KV head `rank`.
    std::vector<float> qr(static_cast<size_t>(B * S * half * D)), kr(static_cast<size_t>(B * S * D)), vr(kr.size());
    for (int64_t t = 0; t < B * S; ++t) {
      std::memcpy(&qr[t * half * D], &q[(t * Hq + rank * half) * D], half * D * 4);
      std::memcpy(&kr[t * D], &k[(t * Hkv + rank) * D], D * 4);
      std::memcpy(&vr[t * D], &v[(t * Hkv + rank) * D], D * 4);
    }
    const Attention part = forward(qr, kr, vr, B, S, half, 1, D, dropping(0.3f, 3, rank * half));
    for (int64_t t = 0; t < B * S; ++t)
      EXPECT_EQ(0, std::memcmp(&part.out[t * half * D], &whole.out[(t * Hq + rank * half) * D], half * D * 4))
          << "rank " << rank << " token " << t;
  }
  // Another sample number is another mask.
  const Attention other = forward(q, k, v, B, S, Hq, Hkv, D, dropping(0.3f, 4));
  EXPECT_NE(0, std::memcmp(whole.out.data(), other.out.data(), whole.out.size() * 4));
}

TEST_F(AttentionDropout, ProbabilityOneIsRefused) {
  const int64_t B = 1, S = 4, H = 1, D = 8;
  const auto x = randn(B * S * H * D, 9);
  EXPECT_NE(test::error_message([&] {
              forward(x, x, x, B, S, H, H, D, dropping(1.0f));
            }).find("attention: dropout probability 1 is not in [0, 1)"),
            std::string::npos);
}

// The tiny model's loss over one micro-batch, forward only (evaluation) or forward and backward
// (training), with attention_dropout p.
float tiny_loss(float p, bool backward) {
  RunConfig cfg = parse_run_config(nlohmann::json::parse(R"({"train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 0},
    "model": {"config": "configs/models/tiny.json"}, "data": {"type": "synthetic", "seq_len": 48}, "train": {"steps": 1}})"),
                                   "test");
  cfg.model.attention_dropout = p;
  auto comm = make_mpi_world_communicator();
  auto backend = create_backend(test::cpu_backend_options());
  DecoderModel model(*backend, cfg.model, model_options(cfg, 2, 1));
  EngineOptions eo;
  eo.dtype = cfg.dtype;
  eo.bucket_size = cfg.bucket_size;
  Engine engine(*backend, model.layout(), eo, *comm);
  engine.init_weights(5, 0.02f);
  auto tokens = make_synthetic_tokens(cfg.model.vocab_size, 1 << 12, 9);
  BatchSampler sampler(*tokens, cfg.data.seq_len, 2, cfg.model.vocab_size, 3);
  engine.begin_step(1e-3, 1);
  model.zero_loss();
  model.forward_backward(sampler.next(), engine, engine, 1.0f / 96, backward);
  const float loss = model.read_loss();
  if (backward) engine.end_step();  // evaluation has no gradients to step on
  engine.finish();
  return loss;
}

TEST(AttentionDropoutModel, DropsInTrainingNotInEvaluation) {
  const float eval_plain = tiny_loss(0.0f, false), eval_dropout = tiny_loss(0.3f, false);
  EXPECT_EQ(0, std::memcmp(&eval_plain, &eval_dropout, sizeof(float))) << eval_plain << " vs " << eval_dropout;
  EXPECT_NE(tiny_loss(0.0f, true), tiny_loss(0.3f, true));
}

}  // namespace
}  // namespace so
