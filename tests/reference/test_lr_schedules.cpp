// WSD, OneCycle and LRRangeTest against their references, step by step: fixtures/lr_schedules.h5,
// made by make_lr_schedule_fixture.py (WSD from transformers.get_wsd_schedule, OneCycle and
// LRRangeTest from DeepSpeed's definitions, each driving a torch optimizer the way DeepSpeed's
// engine does). The schedule section goes through the config parser, as a user's would.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "so/io/hdf5_file.h"
#include "so/train/run_config.h"

namespace so {
namespace {

const std::string kFixture = std::string(SO_FIXTURE_DIR) + "/lr_schedules.h5";

TEST(LrSchedulesVsReference, EveryStepOfWsdOneCycleAndLrRangeTest) {
  const H5File f = H5File::open_read(kFixture);
  const std::vector<std::string> cases = f.members("/");
  ASSERT_GE(cases.size(), 8u);
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
    const std::vector<float> want = f.read_f32(g + "/lr");
    double worst = 0;
    for (size_t k = 0; k < want.size(); ++k) {
      const double got = c.schedule.lr_at(static_cast<int64_t>(k));
      worst = std::max(worst, std::fabs(got - want[k]));
      EXPECT_LE(std::fabs(got - want[k]), 1e-7) << name << " step " << k << ": " << got << " vs " << want[k];
      // Relative too (the float rounding is 6e-8 of the value): small rates are held as tightly.
      EXPECT_LE(std::fabs(got - want[k]), 1e-6 * std::fabs(want[k])) << name << " step " << k;
    }
    std::printf("[ %s ] %zu steps, worst |so_train - reference| %.3g\n", name.c_str(), want.size(), worst);
  }
}

}  // namespace
}  // namespace so
