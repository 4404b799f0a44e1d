#pragma once
// What the model needs from whoever owns its parameters (the engine), and the points at which
// it hands control back. The model never knows about buckets, sharding, offload or MPI.
#include <cstdint>

namespace so {

class ParamStore {
 public:
  virtual ~ParamStore() = default;
  // Device pointers, in the model's storage dtype, valid between before_forward/after_backward
  // of the units that read the parameter.
  virtual void* weight(int param_id) = 0;
  virtual void* grad(int param_id) = 0;  // accumulated into (+=) by backward
};

class ModelHooks {
 public:
  virtual ~ModelHooks() = default;
  // Called on the host, in issue order, before the unit's ops are enqueued (forward, and the
  // backward recompute) — the engine makes its weights available here.
  virtual void before_unit(int unit) {}
  // Called after the unit's backward ops are enqueued: its gradients are final once the
  // compute stream reaches this point (except for parameters also read by a lower unit).
  virtual void after_backward(int unit) {}
};

}  // namespace so
