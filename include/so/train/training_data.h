#pragma once
// The samples a run trains on and evaluates on, opened from the config's data section: windows of
// a token stream (text, tokens, hdf5, synthetic) or the rows of a prepared file (data.type
// "prepared": its train split, and its validation split when it has one).
#include <cstdint>
#include <memory>
#include <string>

#include "so/data/prepared_data.h"
#include "so/data/sample_stream.h"
#include "so/data/token_source.h"
#include "so/train/run_config.h"

namespace so {

struct TrainingData {
  std::vector<std::unique_ptr<TokenSource>> tokens;            // the windowed types (a blend: several)
  std::unique_ptr<PreparedSplit> train_rows, validation_rows;  // "prepared"
  std::unique_ptr<SampleStream> train, validation;             // validation: null when there is none
  // Tokens the data holds in all (windowed) or per epoch (prepared), for the start-up line.
  int64_t tokens_count = 0;
};

TrainingData open_training_data(const RunConfig& cfg, int64_t micro_batch);

// train.num_train_epochs: optimizer steps for that many passes over samples_per_epoch samples at
// global_batch samples a step (the last step of an epoch takes the first samples of the next).
int64_t steps_for_epochs(double epochs, int64_t samples_per_epoch, int64_t global_batch);

}  // namespace so
