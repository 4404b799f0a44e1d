// OLMo's z-loss in the cross-entropy op against torch (fixtures/z_loss_torch.h5, made by
// make_z_loss_fixture.py in float64): the loss within 1e-6 relative and every logit's gradient
// within 1e-6, for OLMo's default coefficient, a large one on logits whose logsumexp is large (the
// z term most of the loss), and 0 (plain cross-entropy). Ignored targets carry neither term. The
// CUDA kernel is held to this op by test_cuda_ops (cross_entropy_*_z0_01 cases).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "parallel/communicator.h"
#include "so/backend/backend.h"
#include "so/engine/engine.h"
#include "so/io/hdf5_file.h"
#include "so/model/decoder_model.h"
#include "tests/test_util.h"

namespace so {
namespace {

const std::string kFixture = std::string(SO_FIXTURE_DIR) + "/z_loss_torch.h5";

TEST(ZLossVsTorch, LossAndGradientsOfEveryCase) {
  const H5File f = H5File::open_read(kFixture);
  auto be = create_backend(test::cpu_backend_options());
  Stream& s = be->stream(StreamKind::Compute);
  for (const std::string& name : f.members("/")) {
    const std::string g = "/" + name;
    const std::vector<int64_t> shape = f.shape(g + "/logits");
    const int64_t rows = shape.at(0), V = shape.at(1);
    const auto z_loss = static_cast<float>(f.read_double_attr(g, "z_loss"));
    const auto scale = static_cast<float>(f.read_double_attr(g, "scale"));
    const std::vector<int32_t> targets = f.read_i32(g + "/targets", {rows});
    auto logits = test::upload(*be, f.read_f32(g + "/logits", shape), DType::F32);
    auto loss = test::upload(*be, std::vector<float>{0.0f}, DType::F32);
    auto dlogits = be->alloc(static_cast<size_t>(rows * V) * 4, "dlogits");
    auto tg = be->alloc(static_cast<size_t>(rows) * 4, "targets");
    be->copy_h2d(tg.data(), targets.data(), static_cast<size_t>(rows) * 4, s);
    be->ops().cross_entropy(s, {.rows = rows, .V = V, .scale = scale, .z_loss = z_loss, .dtype = DType::F32},
                            loss.as<float>(), dlogits.data(), logits.as<float>(), tg.as<int32_t>());
    const float got = test::download(*be, loss.data(), 1, DType::F32)[0];
    const double want = f.read_f32(g + "/loss", {1})[0];
    const std::vector<float> grad = test::download(*be, dlogits.data(), rows * V, DType::F32);
    const std::vector<float> want_grad = f.read_f32(g + "/dlogits", shape);
    double worst = 0;
    for (size_t i = 0; i < grad.size(); ++i) worst = std::max(worst, std::fabs(double(grad[i]) - want_grad[i]));
    std::printf("[ %s ] z_loss %g: loss %.9g vs torch %.9g (relative %.3g); worst |dlogits - torch| %.3g\n",
                name.c_str(), z_loss, got, want, std::fabs(got - want) / want, worst);
    EXPECT_LE(std::fabs(got - want), 1e-6 * std::fabs(want)) << name;
    EXPECT_LE(worst, 1e-6) << name;
  }
}

// The model hands train.z_loss (ModelOptions::z_loss) to its loss: on the same weights and tokens the
// loss grows by z_loss x mean(lse^2), so the growth is positive and doubles with the coefficient.
TEST(ZLoss, ModelLossGrowsLinearlyWithTheCoefficient) {
  const ModelConfig cfg = ModelConfig::from_hf_file("configs/models/tiny.json");
  std::unique_ptr<Communicator> comm = make_mpi_world_communicator();
  auto be = create_backend(test::cpu_backend_options());
  TokenBatch batch;
  for (int32_t t = 0; t < 16; ++t) {
    batch.inputs.push_back((t * 37) % cfg.vocab_size);
    batch.targets.push_back(t % 5 == 4 ? -1 : (t * 11 + 3) % static_cast<int32_t>(cfg.vocab_size));
    batch.positions.push_back(t);
  }
  std::vector<double> losses;
  for (const float z_loss : {0.0f, 0.01f, 0.02f}) {
    ModelOptions mo;
    mo.seq_len = 16;
    mo.z_loss = z_loss;
    DecoderModel model(*be, cfg, mo);
    Engine engine(*be, model.layout(), EngineOptions{}, *comm);
    engine.init_weights(5, 0.5f);  // wide logits: a logsumexp well away from 0
    engine.begin_step(0.0);
    model.zero_loss();
    model.forward_backward(batch, engine, engine, 1.0f / 16, true);
    losses.push_back(model.read_loss());
    engine.end_step();
    engine.finish();
  }
  const double once = losses[1] - losses[0], twice = losses[2] - losses[0];
  std::printf("loss %.7g; + %.7g with z_loss 0.01, + %.7g with 0.02\n", losses[0], once, twice);
  EXPECT_GT(once, 1e-3);
  EXPECT_NEAR(twice, 2 * once, 1e-4 * twice);
}

}  // namespace
}  // namespace so
