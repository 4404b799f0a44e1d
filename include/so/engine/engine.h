#pragma once
// The engine owns every parameter-sized buffer — device weights and gradients in the model's
// dtype, fp32 master weights and Adam moments — as flat buffers cut into buckets, serves them
// to the model (ParamStore), receives its per-unit callbacks (ModelHooks), and runs the
// optimizer step with global-norm clipping and a finite check.
#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "so/backend/backend.h"
#include "so/engine/bucket.h"
#include "so/model/model_interfaces.h"
#include "so/model/param_layout.h"
#include "so/optim/adamw.h"

namespace so {

struct EngineOptions {
  DType dtype = DType::F32;
  int64_t bucket_size = int64_t{1} << 22;  // elements
  float grad_clip = 0.0f;                  // max global norm; 0 = off
  AdamWParams adam;                        // lr is given per step
};

struct StepResult {
  double grad_norm = 0.0;  // global, before clipping
  float clip_coef = 1.0f;  // factor applied to the gradients
  bool skipped = false;    // non-finite gradients: nothing was updated
};

class Engine final : public ParamStore, public ModelHooks {
 public:
  Engine(Backend& backend, const ParamLayout& layout, const EngineOptions& opts, Communicator& comm);
  ~Engine() override;

  void* weight(int param_id) override;
  void* grad(int param_id) override;

  // Hugging Face initialisation: normal(0, std) for matrices, ones for norms; counter-based, so
  // identical whatever the world size.
  void init_weights(uint64_t seed, float std);
  void load_weight(int param_id, const std::vector<float>& values);
  std::vector<float> read_weight(int param_id);  // fp32 master weights
  std::vector<float> read_grad(int param_id);    // gradients, widened to fp32

  void zero_grads();
  // Clips, checks and applies one AdamW step. Skipped steps change nothing, not even the step count.
  StepResult step(float lr);
  int64_t steps_taken() const { return steps_; }

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const ParamLayout& layout() const { return layout_; }
  size_t state_bytes() const;

 private:
  const ParamInfo& info(int param_id) const;
  void upload_master(int64_t begin, int64_t n);

  Backend& backend_;
  const ParamLayout& layout_;
  EngineOptions opts_;
  Communicator& comm_;
  std::vector<Bucket> buckets_;
  DeviceBuffer weights_, grads_;         // model dtype
  DeviceBuffer master_, exp_avg_, exp_avg_sq_;  // fp32
  DeviceBuffer norm_acc_;                // fp32 scalar
  int64_t steps_ = 0;
};

}  // namespace so
