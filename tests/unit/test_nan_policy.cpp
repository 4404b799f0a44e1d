// The loop's policies about bad steps (StepGuard) and its progress line: a run stops after exactly
// N non-finite steps in a row and never on fewer or interrupted ones; loss spikes are reported
// against a full window of finite, applied steps only; the step line carries elapsed time, ETA
// and the steps left, in its full and its short (--quiet) form.
#include <gtest/gtest.h>

#include <cmath>

#include "so/train/metrics.h"
#include "so/train/nan_policy.h"

namespace so {
namespace {

TEST(StepGuard, StopsAfterExactlyNSkippedStepsInARow) {
  NanPolicyConfig c;
  c.max_consecutive_skips = 3;
  StepGuard g(c);
  EXPECT_TRUE(g.observe(1, 2.0, false).stop.empty());
  EXPECT_TRUE(g.observe(2, NAN, true).stop.empty());
  EXPECT_TRUE(g.observe(3, NAN, true).stop.empty());
  EXPECT_TRUE(g.observe(4, 2.0, false).stop.empty());  // a good step starts the count again
  EXPECT_TRUE(g.observe(5, NAN, true).stop.empty());
  EXPECT_TRUE(g.observe(6, NAN, true).stop.empty());
  const std::string stop = g.observe(7, NAN, true).stop;
  EXPECT_NE(stop.find("steps 5 to 7 (3 in a row, train.max_consecutive_skipped_steps)"), std::string::npos) << stop;
  EXPECT_NE(stop.find("still that of step 4"), std::string::npos) << stop;
}

TEST(StepGuard, ZeroNeverStops) {
  NanPolicyConfig c;
  c.max_consecutive_skips = 0;
  StepGuard g(c);
  for (int s = 1; s <= 1000; ++s) ASSERT_TRUE(g.observe(s, NAN, true).stop.empty());
}

TEST(StepGuard, LossSpikesAgainstAFullWindowOfAppliedSteps) {
  NanPolicyConfig c;
  c.spike_factor = 2.0;
  c.spike_window = 4;
  StepGuard g(c);
  EXPECT_TRUE(g.observe(1, 10.0, false).warning.empty());  // no full window yet: nothing to compare with
  for (int s = 2; s <= 4; ++s) EXPECT_TRUE(g.observe(s, 1.0, false).warning.empty());
  EXPECT_TRUE(g.observe(5, NAN, true).warning.empty());    // skipped: not compared, not in the window
  EXPECT_TRUE(g.observe(6, 6.0, false).warning.empty());   // mean (10+1+1+1)/4 = 3.25: 6 < 6.5
  const std::string w = g.observe(7, 7.0, false).warning;  // window 1,1,1,6: mean 2.25, 7 > 4.5
  EXPECT_NE(w.find("loss spike at step 7"), std::string::npos) << w;
  EXPECT_TRUE(g.observe(8, 3.0, false).warning.empty());  // window 1,1,6,7: mean 3.75
}

TEST(ProgressLine, ElapsedEtaAndStepsLeftInBothForms) {
  StepMetrics m;
  m.step = 10;
  m.loss = 2.5;
  m.lr = 3e-3;
  m.elapsed_s = 83.4;
  m.eta_s = 3600 + 2 * 60 + 5.2;
  for (bool compact : {false, true}) {
    const std::string line = format_step_line(m, 400, compact);
    EXPECT_NE(line.find("step    10/400 | loss 2.5000"), std::string::npos) << line;
    EXPECT_NE(line.find("| elapsed 0:01:23, ETA 1:02:05 (390 steps left)"), std::string::npos) << line;
    EXPECT_EQ(line.find("MFU") == std::string::npos, compact) << line;
  }
  EXPECT_EQ(format_duration(0.4), "0:00:00");
  EXPECT_EQ(format_duration(100 * 3600 + 59), "100:00:59");
}

}  // namespace
}  // namespace so
