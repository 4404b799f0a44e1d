#pragma once
// One training run's pieces as the optimizer-mode tests build them (tests/unit/test_offload.cpp,
// tests/gpu/test_cuda_training.cpp): a model in micro-batches of the given shape, its engine in
// buckets of 100,000 elements (several on the tiny model, so that a ratio of 0.5 splits them) with
// weights drawn from seed 42, and batches from a sampler over `tokens`.
#include "parallel/communicator.h"
#include "so/backend/backend.h"
#include "so/data/batch_sampler.h"
#include "so/data/token_source.h"
#include "so/engine/engine.h"
#include "so/model/decoder_model.h"

namespace so::test {

struct TinyTraining {
  TinyTraining(Backend& backend, const ModelConfig& cfg, const ModelOptions& model_options, EngineOptions eo,
               Communicator& comm, const TokenSource& tokens)
      : mo(model_options),
        model(backend, cfg, mo),
        engine(backend, model.layout(), with_buckets(eo), comm),
        sampler(tokens, mo.seq_len, mo.micro_batch, cfg.vocab_size, 3) {
    engine.init_weights(42, 0.02f);
  }

  ModelOptions mo;
  DecoderModel model;
  Engine engine;
  BatchSampler sampler;

 private:
  static EngineOptions with_buckets(EngineOptions eo) {
    eo.bucket_size = 100000;
    return eo;
  }
};

}  // namespace so::test
