#pragma once
// The training loop: data -> forward/backward per micro-batch -> optimizer step -> metrics.
#include <string>

#include "parallel/communicator.h"
#include "so/train/run_config.h"

namespace so {

struct TrainOptions {
  std::string metrics_path;  // JSON lines; empty = none
};

struct TrainSummary {
  double first_loss = 0.0, last_loss = 0.0;
  double mean_tokens_per_s = 0.0;
  int64_t steps = 0;
};

TrainSummary train(const RunConfig& cfg, Communicator& comm, const TrainOptions& opts);

}  // namespace so
