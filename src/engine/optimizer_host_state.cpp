#include "so/engine/optimizer_host_state.h"

#include "so/core/error.h"

namespace so {

OptimizerHostState::OptimizerHostState(const OptimizerHostStateSpec& spec) : spec_(spec) {
  SO_CHECK(spec.elements >= 0, "optimizer host state of ", spec.elements, " elements");
  const auto n = static_cast<size_t>(spec.elements);
  int stream = 0;
  auto buffer = [&](size_t bytes, Backend* pin, const char* tag) {
    return HostBuffer(bytes, spec.numa_node, pin, tag, spec.skew ? stream_skew(stream++) : 0, spec.huge_pages);
  };
  p_ = buffer(n * 4, spec.pin_with, "offloaded fp32 master weights");
  m_ = buffer(n * 4, spec.pin_with, "offloaded adam exp_avg");
  v_ = buffer(n * 4, spec.pin_with, "offloaded adam exp_avg_sq");
  grads_ = buffer(n * dtype_size(spec.grad_dtype), spec.pin_with, "offloaded gradients");
  if (spec.has_out) out_ = buffer(n * dtype_size(spec.out_dtype), spec.pin_with, "weights for the device");
  if (spec.snapshot) {
    snapshot_p_ = buffer(n * 4, nullptr, "exact-rollback snapshot of p");
    snapshot_m_ = buffer(n * 4, nullptr, "exact-rollback snapshot of exp_avg");
    snapshot_v_ = buffer(n * 4, nullptr, "exact-rollback snapshot of exp_avg_sq");
  }
}

size_t OptimizerHostState::bytes() const {
  size_t total = 0;
  for (const HostBuffer* b : {&p_, &m_, &v_, &grads_, &out_, &snapshot_p_, &snapshot_m_, &snapshot_v_})
    total += b->bytes();
  return total;
}

double OptimizerHostState::huge_page_share() const {
  size_t huge = 0, mapped = 0;
  for (const HostBuffer* b : {&p_, &m_, &v_, &grads_, &out_}) huge += b->huge_page_bytes(), mapped += b->mapped_bytes();
  return mapped > 0 ? static_cast<double>(huge) / static_cast<double>(mapped) : 0.0;
}

AdamArrays OptimizerHostState::arrays(int64_t first, bool with_snapshot) const {
  AdamArrays a{p(), m(), v(), grads(), spec_.grad_dtype, out(), spec_.out_dtype};
  if (with_snapshot && spec_.snapshot)
    a.snapshot_p = snapshot_p_.as<float>(), a.snapshot_m = snapshot_m_.as<float>(),
    a.snapshot_v = snapshot_v_.as<float>();
  return a.from(first);
}

}  // namespace so
