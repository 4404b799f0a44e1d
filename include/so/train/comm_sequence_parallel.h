#pragma once
// The model's view of a sequence-parallel group (SequenceParallel, so/model/model_interfaces.h)
// over a communicator of that group: Ulysses' all-to-alls are its collectives. The trainer's, and
// the reference tests'.
#include <cstdint>

#include "parallel/communicator.h"
#include "so/model/model_interfaces.h"

namespace so {

class CommSequenceParallel final : public SequenceParallel {
 public:
  explicit CommSequenceParallel(Communicator& c) : c_(c) {}
  int size() const override { return c_.size(); }
  int rank() const override { return c_.rank(); }
  void all_to_all(Stream& s, void* recv, const void* send, int64_t count, DType dt) override {
    c_.all_to_all(s, recv, send, count, dt);
  }

 private:
  Communicator& c_;
};

}  // namespace so
