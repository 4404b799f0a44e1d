// Finite-difference checks of every backward op on small random inputs, through the Ops
// interface (so the same harness serves any backend). Each check compares the analytic
// gradient of L = sum(R * f(x)) (R random) with central differences in fp64-accumulated fp32.
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "so/backend/backend.h"
#include "so/core/error.h"
#include "so/model/rope.h"
#include "tests/test_util.h"

namespace so {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

class GradCheck : public testing::Test {
 protected:
  std::unique_ptr<Backend> be = create_backend(test::cpu_backend_options());
  Ops& ops = be->ops();
  Stream& s = be->stream(StreamKind::Compute);

  // f(inputs) -> output values (host). Checks d/d(inputs[which]) of sum(R*f) at `samples` points.
  void check(std::vector<std::vector<float>>& inputs, size_t which,
             const std::function<std::vector<float>(const std::vector<std::vector<float>>&)>& f,
             const std::vector<float>& analytic, const std::vector<float>& R, double tol = 2e-2) {
    std::vector<float> numeric, picked;
    const float h = 1e-2f;
    const size_t n = inputs[which].size();
    for (size_t k = 0; k < std::min<size_t>(n, 24); ++k) {
      const size_t i = (k * 7919) % n;
      const float orig = inputs[which][i];
      auto loss = [&](float v) {
        inputs[which][i] = v;
        const auto out = f(inputs);
        double L = 0;
        for (size_t j = 0; j < out.size(); ++j) L += double(R[j]) * out[j];
        return L;
      };
      const double d = (loss(orig + h) - loss(orig - h)) / (2 * h);
      inputs[which][i] = orig;
      numeric.push_back(static_cast<float>(d));
      picked.push_back(analytic[i]);
    }
    EXPECT_LE(test::rel_error(picked, numeric), tol);
  }
};

TEST_F(GradCheck, RmsNorm) {
  const int64_t rows = 3, dim = 10;
  std::vector<std::vector<float>> in = {randn(rows * dim, 1), randn(dim, 2, 0.5f)};
  for (auto& w : in[1]) w += 1.0f;
  const auto R = randn(rows * dim, 3);
  const RmsNormShape norm{.rows = rows, .dim = dim, .eps = 1e-5f, .dtype = DType::F32};
  auto f = [&](const std::vector<std::vector<float>>& x) {
    auto X = test::upload(*be, x[0], DType::F32), W = test::upload(*be, x[1], DType::F32);
    auto out = be->alloc(rows * dim * 4, "out"), rstd = be->alloc(rows * 4, "rstd");
    ops.rmsnorm_forward(s, norm, out.data(), rstd.as<float>(), X.data(), W.data());
    return test::download(*be, out.data(), rows * dim, DType::F32);
  };
  auto X = test::upload(*be, in[0], DType::F32), W = test::upload(*be, in[1], DType::F32);
  auto out = be->alloc(rows * dim * 4, "out"), rstd = be->alloc(rows * 4, "rstd");
  auto dY = test::upload(*be, R, DType::F32);
  auto dX = be->alloc(rows * dim * 4, "dx"), dW = be->alloc(dim * 4, "dw");
  ops.rmsnorm_forward(s, norm, out.data(), rstd.as<float>(), X.data(), W.data());
  ops.rmsnorm_backward(s, norm, {.dx = dX.data(), .dw_acc = dW.data(), .accumulate = false}, dY.data(), X.data(),
                       W.data(), rstd.as<float>());
  check(in, 0, f, test::download(*be, dX.data(), rows * dim, DType::F32), R);
  check(in, 1, f, test::download(*be, dW.data(), dim, DType::F32), R);
}

TEST_F(GradCheck, SwiGLU) {
  const int64_t n = 40;
  std::vector<std::vector<float>> in = {randn(n, 4, 2.0f), randn(n, 5)};
  const auto R = randn(n, 6);
  auto f = [&](const std::vector<std::vector<float>>& x) {
    auto G = test::upload(*be, x[0], DType::F32), U = test::upload(*be, x[1], DType::F32);
    auto out = be->alloc(n * 4, "out");
    ops.swiglu_forward(s, out.data(), G.data(), U.data(), n, DType::F32);
    return test::download(*be, out.data(), n, DType::F32);
  };
  auto G = test::upload(*be, in[0], DType::F32), U = test::upload(*be, in[1], DType::F32);
  auto dY = test::upload(*be, R, DType::F32);
  auto dG = be->alloc(n * 4, "dg"), dU = be->alloc(n * 4, "du");
  ops.swiglu_backward(s, dG.data(), dU.data(), dY.data(), G.data(), U.data(), n, DType::F32);
  check(in, 0, f, test::download(*be, dG.data(), n, DType::F32), R);
  check(in, 1, f, test::download(*be, dU.data(), n, DType::F32), R);
}

// The rows form (one [rows, 2 * cols] gate|up GEMM output) computes, row by row, what the
// elementwise form computes on the separate gate and up halves.
TEST_F(GradCheck, SwiGLURowsIsTheElementwiseFormPerRowHalf) {
  const int64_t rows = 3, cols = 7, n = rows * cols;
  const auto gu = randn(2 * n, 9, 2.0f), dy = randn(n, 10);
  std::vector<float> g(n), u(n);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      g[r * cols + c] = gu[r * 2 * cols + c], u[r * cols + c] = gu[r * 2 * cols + cols + c];
  auto GU = test::upload(*be, gu, DType::F32), G = test::upload(*be, g, DType::F32),
       U = test::upload(*be, u, DType::F32);
  auto dY = test::upload(*be, dy, DType::F32);
  auto out_rows = be->alloc(n * 4, "out rows"), out = be->alloc(n * 4, "out");
  auto dGU = be->alloc(2 * n * 4, "dgate_up"), dG = be->alloc(n * 4, "dg"), dU = be->alloc(n * 4, "du");
  ops.swiglu_rows_forward(s, out_rows.data(), GU.data(), rows, cols, DType::F32);
  ops.swiglu_forward(s, out.data(), G.data(), U.data(), n, DType::F32);
  ops.swiglu_rows_backward(s, dGU.data(), dY.data(), GU.data(), rows, cols, DType::F32);
  ops.swiglu_backward(s, dG.data(), dU.data(), dY.data(), G.data(), U.data(), n, DType::F32);
  const auto o_rows = test::download(*be, out_rows.data(), n, DType::F32),
             o = test::download(*be, out.data(), n, DType::F32);
  const auto d_rows = test::download(*be, dGU.data(), 2 * n, DType::F32);
  const auto dg = test::download(*be, dG.data(), n, DType::F32), du = test::download(*be, dU.data(), n, DType::F32);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      EXPECT_EQ(o_rows[i], o[i]) << "row " << r << " col " << c;
      EXPECT_EQ(d_rows[r * 2 * cols + c], dg[i]) << "dgate row " << r << " col " << c;
      EXPECT_EQ(d_rows[r * 2 * cols + cols + c], du[i]) << "dup row " << r << " col " << c;
    }
}

// copy_columns moves a column block between row strides, both ways (the q|k|v split and its
// gradients' gather), and leaves every other column as it was.
TEST_F(GradCheck, CopyColumnsMovesOneBlockOfEveryRow) {
  for (DType dt : {DType::F32, DType::BF16}) {
    const int64_t rows = 5, wide = 11, col0 = 3, cols = 6;
    const auto w = randn(rows * wide, 11), narrow = randn(rows * cols, 12);
    auto W = test::upload(*be, w, dt), N = test::upload(*be, narrow, dt);
    auto out = be->alloc(rows * cols * dtype_size(dt), "narrow out");
    const size_t e = dtype_size(dt);
    const auto w_stored = test::download(*be, W.data(), rows * wide, dt);  // as the dtype holds them
    const auto n_stored = test::download(*be, N.data(), rows * cols, dt);
    ops.copy_columns(s, out.data(), cols, static_cast<char*>(W.data()) + col0 * e, wide, rows, cols, dt);
    ops.copy_columns(s, static_cast<char*>(W.data()) + col0 * e, wide, N.data(), cols, rows, cols, dt);
    const auto got_narrow = test::download(*be, out.data(), rows * cols, dt);
    const auto got_wide = test::download(*be, W.data(), rows * wide, dt);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < wide; ++c) {
        const bool in_block = c >= col0 && c < col0 + cols;
        if (in_block) {
          EXPECT_EQ(got_narrow[r * cols + c - col0], w_stored[r * wide + c]) << dtype_name(dt) << " row " << r;
        }
        EXPECT_EQ(got_wide[r * wide + c], in_block ? n_stored[r * cols + c - col0] : w_stored[r * wide + c])
            << dtype_name(dt) << " row " << r << " col " << c;
      }
  }
}

TEST_F(GradCheck, RopeInverseIsTheTranspose) {
  // rope is linear and orthogonal, so its backward is the inverse rotation: <R, rope(x)> = <rope^-1(R), x>.
  const int64_t T = 5, heads = 3, D = 8;
  std::vector<std::vector<float>> in = {randn(T * heads * D, 7)};
  const auto R = randn(T * heads * D, 8);
  std::vector<int32_t> pos = {0, 3, 17, 1000, 65535};
  auto P = be->alloc(T * 4, "pos");
  be->copy_h2d(P.data(), pos.data(), T * 4, s);
  // A yarn-like attention scale: the backward is then the scaled transpose.
  const auto F = test::upload_f64(*be, rope_default_inv_freq(10000.0, D));
  const Rope rope{.T = T,
                  .heads = heads,
                  .head_dim = D,
                  .positions = P.as<int32_t>(),
                  .inv_freq = F.as<double>(),
                  .attention_scale = 1.1f,
                  .dtype = DType::F32};
  auto f = [&](const std::vector<std::vector<float>>& x) {
    auto X = test::upload(*be, x[0], DType::F32);
    ops.rope(s, rope, X.data(), false);
    return test::download(*be, X.data(), T * heads * D, DType::F32);
  };
  auto dX = test::upload(*be, R, DType::F32);
  ops.rope(s, rope, dX.data(), true);
  check(in, 0, f, test::download(*be, dX.data(), T * heads * D, DType::F32), R);
}

// Million-token sequences: positions past 2^20 rotate by the right angles. In fp32, pos * inv_freq
// at pos = 2^20 is off by up to 2^20 * 2^-24 = 0.06 rad; the kernels form angles in double. Checked
// against cos/sin in long double, for Llama-2 and Llama-3 theta.
TEST_F(GradCheck, RopeAnglesExactPastAMillionPositions) {
  const int64_t heads = 2, D = 128, half = D / 2;
  const std::vector<int32_t> pos = {0, 1, (1 << 20) - 1, 1 << 20, (1 << 20) + 1, 3 * (1 << 20) - 7, (1 << 22) + 12345};
  const int64_t T = static_cast<int64_t>(pos.size());
  const std::vector<float> x = randn(T * heads * D, 21);
  auto P = be->alloc(T * 4, "pos");
  be->copy_h2d(P.data(), pos.data(), T * 4, s);
  for (const float theta : {10000.0f, 500000.0f}) {
    auto X = test::upload(*be, x, DType::F32);
    const auto F = test::upload_f64(*be, rope_default_inv_freq(theta, D));
    ops.rope(s,
             {.T = T,
              .heads = heads,
              .head_dim = D,
              .positions = P.as<int32_t>(),
              .inv_freq = F.as<double>(),
              .attention_scale = 1.0f,
              .dtype = DType::F32},
             X.data(), false);
    const std::vector<float> got = test::download(*be, X.data(), T * heads * D, DType::F32);
    double worst = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const long double a = pos[t] / powl(static_cast<long double>(theta), static_cast<long double>(2 * i) / D);
          const int64_t o = (t * heads + h) * D + i;
          const long double x1 = x[o], x2 = x[o + half];
          worst = std::max({worst, std::fabs(static_cast<double>(got[o] - (x1 * cosl(a) - x2 * sinl(a)))),
                            std::fabs(static_cast<double>(got[o + half] - (x2 * cosl(a) + x1 * sinl(a))))});
        }
    // fp32 rounding of cos, sin and the products: a few ulp of |x| ~ 1, nowhere near 0.06.
    EXPECT_LT(worst, 2e-6) << "theta " << theta;
  }
}

// Plain causal, and with every mask piece at once: two documents per row (one boundary inside a
// 64-row query block), a sliding window of 9 and per-head sinks (their gradient checked too); then all
// of that with attention dropout (p = 0.3: its mask is a fixed function of the positions, so the
// finite differences see the same dropped probabilities the backward does); then right padding
// (key_end 50 and 20: row 1's second document lies wholly in the padding, and row 0's padding
// queries beyond the window see no key), with sinks and without (rows that see nothing output 0).
TEST_F(GradCheck, GroupedQueryCausalAttention) {
  // S = 70 crosses the CPU kernel's 64-row query block boundary.
  const int64_t B = 2, S = 70, Hq = 4, Hkv = 2, D = 8;
  const AttentionShape sh{B, S, Hq, Hkv, D, 1.0f / std::sqrt(float(D))};
  std::vector<int32_t> doc_start(B * S);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < S; ++i) doc_start[b * S + i] = i < 23 + 17 * b ? 0 : static_cast<int32_t>(23 + 17 * b);
  const std::vector<int32_t> key_end = {50, 20};
  auto KeyEnd = be->alloc(B * 4, "key_end");
  be->copy_h2d(KeyEnd.data(), key_end.data(), B * 4, s);
  const char* kKinds[] = {"causal", "documents, window 9, sinks", "documents, window 9, sinks, dropout 0.3",
                          "documents, window 9, sinks, padding", "window 9, padding"};
  for (const int kind : {0, 1, 2, 3, 4}) {
    const bool masked = kind > 0 && kind < 4, dropout = kind == 2, padded = kind >= 3;
    SCOPED_TRACE(kKinds[kind]);
    std::vector<std::vector<float>> in = {randn(B * S * Hq * D, 9), randn(B * S * Hkv * D, 10),
                                          randn(B * S * Hkv * D, 11)};
    if (masked) in.push_back(randn(Hq, 14));
    const auto R = randn(B * S * Hq * D, 12);
    auto Docs = be->alloc(B * S * 4, "doc_start");
    be->copy_h2d(Docs.data(), doc_start.data(), B * S * 4, s);
    auto mask_of = [&](const DeviceBuffer* sinks) {
      AttentionMask m;
      if (masked) {
        m.doc_start = Docs.as<int32_t>();
        m.sinks = sinks->data();
      }
      if (kind > 0) m.window = 9;
      if (padded) m.key_end = KeyEnd.as<int32_t>();
      if (dropout) {
        m.dropout.p = 0.3f;
        m.dropout.key = dropout_key(7, 1, 2);
        m.dropout.first_sample = 5;
        m.first_head = 4;  // a Ulysses rank's block of heads
      }
      return m;
    };
    auto f = [&](const std::vector<std::vector<float>>& x) {
      auto Q = test::upload(*be, x[0], DType::F32), K = test::upload(*be, x[1], DType::F32),
           V = test::upload(*be, x[2], DType::F32), Sk = test::upload(*be, masked ? x[3] : x[0], DType::F32);
      auto O = be->alloc(x[0].size() * 4, "o"), L = be->alloc(B * Hq * S * 4, "lse");
      ops.attention_forward(s, sh, mask_of(&Sk), sh.inputs(DType::F32, Q.data(), K.data(), V.data()),
                            sh.query_view(O.data(), DType::F32), sh.lse_view(L.data()));
      return test::download(*be, O.data(), x[0].size(), DType::F32);
    };
    auto Q = test::upload(*be, in[0], DType::F32), K = test::upload(*be, in[1], DType::F32),
         V = test::upload(*be, in[2], DType::F32), dO = test::upload(*be, R, DType::F32),
         Sk = test::upload(*be, masked ? in[3] : in[0], DType::F32);
    auto O = be->alloc(in[0].size() * 4, "o"), L = be->alloc(B * Hq * S * 4, "lse");
    auto dQ = be->alloc(in[0].size() * 4, "dq"), dK = be->alloc(in[1].size() * 4, "dk"),
         dV = be->alloc(in[2].size() * 4, "dv");
    auto dSk = test::upload(*be, std::vector<float>(Hq, 0.0f), DType::F32);
    const AttentionInputs qkv = sh.inputs(DType::F32, Q.data(), K.data(), V.data());
    ops.attention_forward(s, sh, mask_of(&Sk), qkv, sh.query_view(O.data(), DType::F32), sh.lse_view(L.data()));
    ops.attention_backward(s, sh, mask_of(&Sk), qkv, sh.query_view(O.data(), DType::F32), sh.lse_view(L.data()),
                           sh.query_view(dO.data(), DType::F32),
                           sh.grads(DType::F32, dQ.data(), dK.data(), dV.data(), dSk.data()));
    check(in, 0, f, test::download(*be, dQ.data(), in[0].size(), DType::F32), R);
    check(in, 1, f, test::download(*be, dK.data(), in[1].size(), DType::F32), R);
    check(in, 2, f, test::download(*be, dV.data(), in[2].size(), DType::F32), R);
    if (masked) check(in, 3, f, test::download(*be, dSk.data(), Hq, DType::F32), R);
  }
}

// Without and with OLMo's z-loss (a coefficient large enough for its gradient to dominate).
TEST_F(GradCheck, CrossEntropy) {
  const int64_t rows = 4, V = 11;
  std::vector<std::vector<float>> in = {randn(rows * V, 13, 2.0f)};
  std::vector<int32_t> targets = {3, 0, -1, 10};  // -1: ignored
  auto Tg = be->alloc(rows * 4, "targets");
  be->copy_h2d(Tg.data(), targets.data(), rows * 4, s);
  const float scale = 0.25f;
  for (const float z_loss : {0.0f, 0.3f}) {
    SCOPED_TRACE(z_loss);
    const CrossEntropyLoss ce{.rows = rows, .V = V, .scale = scale, .z_loss = z_loss, .dtype = DType::F32};
    auto f = [&](const std::vector<std::vector<float>>& x) {
      auto Z = test::upload(*be, x[0], DType::F32);
      auto loss = be->alloc(4, "loss");
      ops.cross_entropy(s, ce, loss.as<float>(), nullptr, Z.as<float>(), Tg.as<int32_t>());
      return test::download(*be, loss.data(), 1, DType::F32);
    };
    auto Z = test::upload(*be, in[0], DType::F32);
    auto loss = be->alloc(4, "loss"), dZ = be->alloc(rows * V * 4, "dz");
    ops.cross_entropy(s, ce, loss.as<float>(), dZ.data(), Z.as<float>(), Tg.as<int32_t>());
    check(in, 0, f, test::download(*be, dZ.data(), rows * V, DType::F32), {1.0f});
  }
}

TEST_F(GradCheck, EmbeddingBackwardScatterAdds) {
  const int64_t T = 5, V = 4, H = 3;
  std::vector<int32_t> tok = {1, 3, 1, 0, 1};
  std::vector<std::vector<float>> in = {randn(V * H, 14)};
  const auto R = randn(T * H, 15);
  auto Tk = be->alloc(T * 4, "tokens");
  be->copy_h2d(Tk.data(), tok.data(), T * 4, s);
  auto f = [&](const std::vector<std::vector<float>>& x) {
    auto W = test::upload(*be, x[0], DType::F32);
    auto out = be->alloc(T * H * 4, "out");
    ops.embedding_forward(s, {.T = T, .V = V, .H = H, .dtype = DType::F32}, out.data(), W.data(), Tk.as<int32_t>());
    return test::download(*be, out.data(), T * H, DType::F32);
  };
  auto dY = test::upload(*be, R, DType::F32);
  auto dW = test::upload(*be, std::vector<float>(V * H, 0.0f), DType::F32);  // the op accumulates
  ops.embedding_backward(s, {.T = T, .V = V, .H = H, .dtype = DType::F32}, dW.data(), dY.data(), Tk.as<int32_t>(), -1);
  check(in, 0, f, test::download(*be, dW.data(), V * H, DType::F32), R);
}

TEST_F(GradCheck, EmbeddingPaddingRowGetsNoGradient) {
  const int64_t T = 5, V = 4, H = 3;
  const std::vector<int32_t> tok = {1, 2, 1, 3, 2};
  auto Tk = be->alloc(T * 4, "tokens");
  be->copy_h2d(Tk.data(), tok.data(), T * 4, s);
  auto dY = test::upload(*be, randn(T * H, 31), DType::F32);
  auto dW = test::upload(*be, std::vector<float>(V * H, 0.5f), DType::F32);
  ops.embedding_backward(s, {.T = T, .V = V, .H = H, .dtype = DType::F32}, dW.data(), dY.data(), Tk.as<int32_t>(), 2);
  const std::vector<float> got = test::download(*be, dW.data(), V * H, DType::F32);
  const std::vector<float> dy = test::download(*be, dY.data(), T * H, DType::F32);
  for (int64_t h = 0; h < H; ++h) {
    EXPECT_EQ(got[2 * H + h], 0.5f);                                  // padding row: untouched
    EXPECT_EQ(got[1 * H + h], 0.5f + dy[0 * H + h] + dy[2 * H + h]);  // others: as without padding
  }
}

TEST_F(GradCheck, OutOfVocabularyTokenIsAnErrorNotACrash) {
  std::vector<int32_t> tok = {0, 7};
  auto Tk = be->alloc(8, "tokens"), W = be->alloc(4 * 2 * 4, "table"), out = be->alloc(2 * 2 * 4, "out");
  be->copy_h2d(Tk.data(), tok.data(), 8, s);
  ops.embedding_forward(s, {.T = 2, .V = 4, .H = 2, .dtype = DType::F32}, out.data(), W.data(), Tk.as<int32_t>());
  try {
    be->synchronize(s);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 7"), std::string::npos) << e.what();
  }
  be->synchronize(s);  // reported once; the stream is usable again
}

TEST_F(GradCheck, GemmTransposesAndBf16MatchFp32Reference) {
  const int64_t M = 5, N = 7, K = 9;
  const auto A = randn(M * K, 16), Bm = randn(K * N, 17);
  for (DType dt : {DType::F32, DType::BF16}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        // Stored layouts: op(A) is [M,K]; A stored [K,M] when transposed.
        std::vector<float> As(M * K), Bs(K * N);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t k = 0; k < K; ++k) As[ta ? k * M + m : m * K + k] = A[m * K + k];
        for (int64_t k = 0; k < K; ++k)
          for (int64_t n = 0; n < N; ++n) Bs[tb ? n * K + k : k * N + n] = Bm[k * N + n];
        auto dA = test::upload(*be, As, dt), dB = test::upload(*be, Bs, dt);
        auto dC = be->alloc(M * N * 4, "c");
        ops.gemm(s, Gemm::nn(M, N, K, dA.data(), dB.data(), dC.data(), dt).transposed(ta, tb).out_as(DType::F32));
        const auto C = test::download(*be, dC.data(), M * N, DType::F32);
        // Reference on the same (possibly bf16-rounded) inputs.
        const auto Ar = test::download(*be, dA.data(), M * K, dt), Br = test::download(*be, dB.data(), K * N, dt);
        std::vector<float> ref(M * N);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n) {
            double acc = 0;
            for (int64_t k = 0; k < K; ++k)
              acc += double(Ar[ta ? k * M + m : m * K + k]) * Br[tb ? n * K + k : k * N + n];
            ref[m * N + n] = static_cast<float>(acc);
          }
        EXPECT_LE(test::rel_error(C, ref), 1e-6) << dtype_name(dt) << " ta=" << ta << " tb=" << tb;
      }
    }
  }
}

// An empty inner dimension (a query block wholly in a row's padding has no keys): C = beta * C,
// as BLAS defines it; beta 0 overwrites whatever C held, NaN included.
TEST_F(GradCheck, GemmWithEmptyInnerDimensionScalesC) {
  const int64_t M = 3, N = 4;
  for (DType c_dt : {DType::F32, DType::BF16}) {
    for (float beta : {0.0f, 0.5f}) {
      std::vector<float> c0(M * N, beta == 0.0f ? NAN : 3.0f);
      auto dC = test::upload(*be, c0, c_dt), dA = be->alloc(4, "a"), dB = be->alloc(4, "b");
      ops.gemm(s, Gemm::nn(M, N, 0, dA.data(), dB.data(), dC.data(), DType::F32, beta).out_as(c_dt));
      for (float x : test::download(*be, dC.data(), M * N, c_dt)) EXPECT_EQ(x, beta * 3.0f) << dtype_name(c_dt);
    }
  }
}

}  // namespace
}  // namespace so
