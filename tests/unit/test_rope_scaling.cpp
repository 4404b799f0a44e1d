// RoPE scaling against transformers: fixtures/rope_scaling.h5 (make_rope_fixture.py) holds, per
// config.json, the frequency table transformers computes (fp32, and the same functions run in
// double), its attention factor, and cos/sin at positions up to 2^21. so_train's table (parsed
// from the same config.json) and the rope op's rotation must equal them: the double table to 1e-12,
// the float32 one to its own rounding (2e-6), cos/sin to 1e-6 of their amplitude.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "so/backend/backend.h"
#include "so/io/hdf5_file.h"
#include "so/model/model_config.h"
#include "tests/test_util.h"

namespace so {
namespace {

H5File fixture() { return H5File::open_read(std::string(SO_FIXTURE_DIR) + "/rope_scaling.h5"); }

double rel(double got, double want) { return std::fabs(got - want) / std::fabs(want); }

TEST(RopeScaling, TablesEqualTransformers) {
  const H5File f = fixture();
  const std::vector<std::string> cases = f.members("/");
  ASSERT_GE(cases.size(), 8u);
  for (const std::string& name : cases) {
    SCOPED_TRACE(name);
    const std::string g = "/" + name;
    const ModelConfig cfg =
        ModelConfig::from_hf_json(nlohmann::json::parse(f.read_string_attr(g, "config_json")), name);
    EXPECT_EQ(cfg.rope.type, f.read_string_attr(g, "rope_type"));
    const RopeFrequencies r = rope_frequencies(cfg.rope, cfg.rope_theta, cfg.head_dim);
    const std::vector<double> want64 = f.read_f64(g + "/inv_freq64", {cfg.head_dim / 2});
    const std::vector<float> want32 = f.read_f32(g + "/inv_freq32", {cfg.head_dim / 2});
    ASSERT_EQ(r.inv_freq.size(), want64.size());
    double worst64 = 0, worst32 = 0;
    for (size_t i = 0; i < want64.size(); ++i) {
      worst64 = std::max(worst64, rel(r.inv_freq[i], want64[i]));
      worst32 = std::max(worst32, rel(r.inv_freq[i], want32[i]));
    }
    EXPECT_LT(worst64, 1e-12) << "against transformers' functions in double";
    // transformers' float32 table itself: pow, the yarn ramp and blend round several times (measured
    // worst 1.01e-6, yarn without truncation).
    EXPECT_LT(worst32, 2e-6) << "against transformers' float32 table";
    EXPECT_LT(rel(r.attention_factor, f.read_double_attr(g, "attention_factor")), 1e-12);
    RecordProperty(name + "_inv_freq_rel_error_fp32", std::to_string(worst32));
  }
}

// The rope op rotates a unit vector (x1 = 1, x2 = 0) into (cos, sin) * attention factor.
TEST(RopeScaling, RotationEqualsTransformersUpTo2To21) {
  const H5File f = fixture();
  std::unique_ptr<Backend> be = create_backend(test::cpu_backend_options());
  Stream& s = be->stream(StreamKind::Compute);
  for (const std::string& name : f.members("/")) {
    SCOPED_TRACE(name);
    const std::string g = "/" + name;
    const ModelConfig cfg =
        ModelConfig::from_hf_json(nlohmann::json::parse(f.read_string_attr(g, "config_json")), name);
    const RopeFrequencies r = rope_frequencies(cfg.rope, cfg.rope_theta, cfg.head_dim);
    const int64_t T = f.shape(g + "/positions").at(0), D = cfg.head_dim, half = D / 2;
    const std::vector<int32_t> pos = f.read_i32(g + "/positions", {T});
    const std::vector<double> cos64 = f.read_f64(g + "/cos64", {T, half}), sin64 = f.read_f64(g + "/sin64", {T, half});
    std::vector<float> x(static_cast<size_t>(T * D), 0.0f);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < half; ++i) x[t * D + i] = 1.0f;
    DeviceBuffer X = test::upload(*be, x, DType::F32), F = test::upload_f64(*be, r.inv_freq);
    DeviceBuffer P = be->alloc(pos.size() * 4, "positions");
    be->copy_h2d(P.data(), pos.data(), pos.size() * 4, s);
    be->ops().rope(s,
                   {.T = T,
                    .heads = 1,
                    .head_dim = D,
                    .positions = P.as<int32_t>(),
                    .inv_freq = F.as<double>(),
                    .attention_scale = static_cast<float>(r.attention_factor),
                    .dtype = DType::F32},
                   X.data(), false);
    const std::vector<float> got = test::download(*be, X.data(), x.size(), DType::F32);
    // Relative to the rotation's amplitude (the attention factor): cos and sin themselves pass
    // through zero. fp32 storage of the result is ~6e-8 of it.
    double worst = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < half; ++i) {
        worst = std::max(worst, std::fabs(got[t * D + i] - cos64[t * half + i]) / r.attention_factor);
        worst = std::max(worst, std::fabs(got[t * D + half + i] - sin64[t * half + i]) / r.attention_factor);
      }
    EXPECT_LT(worst, 1e-6) << "largest position " << pos.back();
    RecordProperty(name + "_cos_sin_error", std::to_string(worst));
  }
}

}  // namespace
}  // namespace so
