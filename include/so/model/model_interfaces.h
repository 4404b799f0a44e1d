#pragma once
// What the model needs from whoever owns its parameters (the engine), and the points at which
// it hands control back. The model never knows about buckets, sharding, offload or MPI.
#include <cstdint>
#include <functional>

#include "so/core/dtype.h"

namespace so {

class Stream;

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
  // Called before the unit's backward ops are enqueued (after its recompute, if any); the head's
  // forward and backward are one pass, announced by before_unit alone.
  virtual void before_backward(int unit) {}
  // Called after the unit's backward ops are enqueued: its gradients are final once the
  // compute stream reaches this point (except for parameters also read by a lower unit).
  virtual void after_backward(int unit) {}
  // Runs `enqueue`, which puts one of the model's own copies (an offloaded activation checkpoint)
  // on stream s, so that whoever traces the step can show it there.
  virtual void copy_span(Stream& s, const char* what, int layer, const std::function<void()>& enqueue) {
    (void)s, (void)what, (void)layer;
    enqueue();
  }
};

// Ulysses sequence parallelism as the model sees it: the ranks that hold slices of the same
// sequences, and the all-to-all that trades sequence slices for head slices around attention.
class SequenceParallel {
 public:
  virtual ~SequenceParallel() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  // Block j of send (count elements) goes to rank j; block i of recv comes from rank i.
  virtual void all_to_all(Stream& s, void* recv, const void* send, int64_t count, DType dt) = 0;
};

}  // namespace so
