#pragma once
// Every parameter's optimizer state read back from an engine, and its bitwise comparison: what the
// optimizer-mode equivalences (tests/unit/test_offload.cpp, tests/gpu/test_cuda_training.cpp) and
// the distributed checkpoint test compare.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "so/engine/engine.h"
#include "tests/test_util.h"

namespace so::test {

struct OptimizerState {
  std::vector<std::vector<float>> master, exp_avg, exp_avg_sq;  // per parameter

  // The engine's state as it is now (all of each tensor, whichever rank owns it).
  static OptimizerState read(Engine& engine) {
    OptimizerState s;
    for (size_t id = 0; id < engine.layout().params.size(); ++id) {
      s.master.push_back(engine.read_state(static_cast<int>(id), OptimState::Master));
      s.exp_avg.push_back(engine.read_state(static_cast<int>(id), OptimState::ExpAvg));
      s.exp_avg_sq.push_back(engine.read_state(static_cast<int>(id), OptimState::ExpAvgSq));
    }
    return s;
  }

  // All of it in one vector: parameter by parameter, its master weights, exp_avg, exp_avg_sq.
  std::vector<float> flat() const {
    std::vector<float> out;
    for (size_t p = 0; p < master.size(); ++p)
      for (const std::vector<float>* v : {&master[p], &exp_avg[p], &exp_avg_sq[p]})
        out.insert(out.end(), v->begin(), v->end());
    return out;
  }
};

// Every parameter's master weights and both Adam moments equal bit for bit.
inline void expect_same_optimizer_state(const OptimizerState& got, const OptimizerState& ref, const std::string& name) {
  ASSERT_EQ(got.master.size(), ref.master.size()) << name;
  for (size_t p = 0; p < ref.master.size(); ++p) {
    EXPECT_TRUE(same_bits(got.master[p], ref.master[p])) << name << ": master weights of parameter " << p;
    EXPECT_TRUE(same_bits(got.exp_avg[p], ref.exp_avg[p])) << name << ": exp_avg of parameter " << p;
    EXPECT_TRUE(same_bits(got.exp_avg_sq[p], ref.exp_avg_sq[p])) << name << ": exp_avg_sq of parameter " << p;
  }
}

}  // namespace so::test
