// WSD, OneCycle (and its momentum cycle) and LRRangeTest against their references, step by step:
// fixtures/lr_schedules.h5,
// made by make_lr_schedule_fixture.py (WSD from transformers.get_wsd_schedule, OneCycle and
// LRRangeTest from DeepSpeed's definitions, each driving a torch optimizer the way DeepSpeed's
// engine does). The schedule section goes through the config parser, as a user's would.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include "parallel/communicator.h"
#include "so/engine/engine.h"
#include "so/io/hdf5_file.h"
#include "so/model/decoder_model.h"
#include "so/train/run_config.h"
#include "tests/test_util.h"

namespace so {
namespace {

const std::string kFixture = std::string(SO_FIXTURE_DIR) + "/lr_schedules.h5";

TEST(LrSchedulesVsReference, EveryStepOfWsdOneCycleAndLrRangeTest) {
  int cycled = 0;  // cases whose schedule sets Adam's betas
  const H5File f = H5File::open_read(kFixture);
  const std::vector<std::string> cases = f.members("/");
  ASSERT_GE(cases.size(), 9u);
  for (const std::string& name : cases) {
    const std::string g = "/" + name;
    nlohmann::json doc = {{"optimizer", {{"params", {{"lr", f.read_double_attr(g, "lr")}}}}},
                          {"scheduler", nlohmann::json::parse(f.read_string_attr(g, "scheduler_json"))},
                          {"model", {{"config", "configs/models/tiny.json"}}},
                          {"data", {{"type", "synthetic"}, {"seq_len", 8}}},
                          {"train", {{"steps", 1}}}};
    const RunConfig c = parse_run_config(doc, name);
    // The reference is stored in float64 and read as float: rounding moves an lr of at most 1e-2
    // by less than 1e-9 (6e-8 of itself), far inside what is compared.
    const int64_t steps = f.shape(g + "/lr").at(0);  // the fixture's step count, one lr each
    const std::vector<float> want = f.read_f32(g + "/lr", {steps}), want_betas = f.read_f32(g + "/betas", {steps, 2});
    double worst = 0, worst_beta = 0;
    for (size_t k = 0; k < want.size(); ++k) {
      const double got = c.schedule.lr_at(static_cast<int64_t>(k));
      worst = std::max(worst, std::fabs(got - want[k]));
      EXPECT_LE(std::fabs(got - want[k]), 1e-7) << name << " step " << k << ": " << got << " vs " << want[k];
      // Relative too (the float rounding is 6e-8 of the value): small rates are held as tightly.
      EXPECT_LE(std::fabs(got - want[k]), 1e-6 * std::fabs(want[k])) << name << " step " << k;
      // The betas the step runs with: the schedule's, or the configured ones.
      const std::optional<std::pair<double, double>> betas = c.schedule.betas_at(static_cast<int64_t>(k));
      cycled += betas && k == 0;
      const double b1 = betas ? betas->first : c.adam.beta1, b2 = betas ? betas->second : c.adam.beta2;
      worst_beta = std::max({worst_beta, std::fabs(b1 - want_betas[2 * k]), std::fabs(b2 - want_betas[2 * k + 1])});
    }
    EXPECT_LE(worst_beta, 1e-7) << name;
    std::printf("[ %s ] %zu steps, worst |so_train - reference| lr %.3g, betas %.3g\n", name.c_str(), want.size(),
                worst, worst_beta);
  }
  EXPECT_EQ(cycled, 1);  // one_cycle_momentum
}

// The betas a schedule hands begin_step are the ones the step uses: two steps with (0.6, 0.99) given
// per step leave the state a run configured with those betas leaves, bit for bit, and the
// configured (0.9, 0.999) a different one.
TEST(LrSchedule, EngineStepsWithTheBetasTheScheduleSets) {
  const ModelConfig cfg = ModelConfig::from_hf_file("configs/models/tiny.json");
  std::unique_ptr<Communicator> comm = make_mpi_world_communicator();
  TokenBatch batch;
  for (int32_t t = 0; t < 8; ++t) {
    batch.inputs.push_back((t * 37) % cfg.vocab_size);
    batch.targets.push_back((t * 11 + 3) % cfg.vocab_size);
    batch.positions.push_back(t);
  }
  const auto run = [&](double beta1, double beta2, std::optional<std::pair<double, double>> per_step) {
    auto be = create_backend(test::cpu_backend_options());
    ModelOptions mo;
    mo.seq_len = 8;
    DecoderModel model(*be, cfg, mo);
    EngineOptions eo;
    eo.adam.beta1 = beta1, eo.adam.beta2 = beta2;
    Engine engine(*be, model.layout(), eo, *comm);
    engine.init_weights(3, 0.02f);
    for (int s = 0; s < 2; ++s) {
      engine.begin_step(1e-2, 1, per_step);
      model.zero_loss();
      model.forward_backward(batch, engine, engine, 1.0f / 8, true);
      engine.end_step();
    }
    engine.finish();
    return engine.read_state(0, OptimState::Master);
  };
  const std::vector<float> configured = run(0.6, 0.99, std::nullopt);
  EXPECT_TRUE(test::same_bits(run(0.9, 0.999, std::make_pair(0.6, 0.99)), configured));
  EXPECT_FALSE(test::same_bits(run(0.9, 0.999, std::nullopt), configured));
}

}  // namespace
}  // namespace so
