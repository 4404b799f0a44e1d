#pragma once
// A model and its engine in fp32 on one backend (the CPU unless told otherwise: "auto" would pick a
// GPU where there is one), for tests and tools that compare so_train's loss with transformers' on
// one token sequence (the HF import/export tests).
#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "so/engine/engine.h"
#include "so/model/decoder_model.h"

namespace so::test {

class ModelRunner {
 public:
  // seq_len: positions per step (a token sequence has seq_len + 1 tokens).
  ModelRunner(const ModelConfig& cfg, int64_t seq_len, const AdamWParams& adam = {},
              const std::string& backend_type = "cpu")
      : comm_(make_mpi_world_communicator()) {
    BackendOptions bo;
    bo.type = backend_type;
    backend_ = create_backend(bo);
    ModelOptions mo;
    mo.seq_len = seq_len;
    model_ = std::make_unique<DecoderModel>(*backend_, cfg, mo);
    EngineOptions eo;
    eo.adam = adam;
    engine_ = std::make_unique<Engine>(*backend_, model_->layout(), eo, *comm_);
  }

  const ParamLayout& layout() const { return model_->layout(); }
  Engine& engine() { return *engine_; }

  void load(const std::vector<std::vector<float>>& values) {
    for (size_t id = 0; id < values.size(); ++id) engine_->load_weight(static_cast<int>(id), values[id]);
  }

  // Mean next-token loss on `tokens` before the update; then an AdamW step with `lr` (0 leaves
  // the weights as they are: decay and update both scale with lr).
  float step(const std::vector<int32_t>& tokens, float lr) {
    TokenBatch b;
    for (size_t t = 0; t + 1 < tokens.size(); ++t) {
      b.inputs.push_back(tokens[t]);
      b.targets.push_back(tokens[t + 1]);
      b.positions.push_back(static_cast<int32_t>(t));
    }
    engine_->begin_step(lr);
    model_->zero_loss();
    model_->forward_backward(b, *engine_, *engine_, 1.0f / static_cast<float>(b.inputs.size()), true);
    const float loss = model_->read_loss();
    engine_->end_step();
    return loss;
  }

 private:
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<DecoderModel> model_;
  std::unique_ptr<Engine> engine_;
};

}  // namespace so::test
