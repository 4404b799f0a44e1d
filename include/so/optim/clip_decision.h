#pragma once
// A step's validation: the global gradient norm from per-bucket sums of squares, whether the step
// is skipped (a non-finite norm) and torch.nn.utils.clip_grad_norm_'s coefficient. One definition
// for the host (the engine's offloaded modes, the CPU backend's ops) and the CUDA kernels, so a
// step decided on the device is decided bit for bit as on the host.
#include <math.h>

#include <cstdint>

#include "so/core/host_device.h"

namespace so {

// Written by Ops::clip_decision (backend memory) or decide_clip (host).
struct ClipDecision {
  double grad_norm = 0.0;  // global, before clipping
  float clip_coef = 1.0f;  // factor applied to the gradients (1 when skipped)
  int32_t skipped = 0;     // non-finite norm: the step changes nothing
};

// sum[0, n) of fp32 values in index order, in double from 0 (a rank's bucket sums in bucket order).
SO_HOST_DEVICE inline double sum_in_order(const float* x, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]);
  return sum;
}

// The decision from every rank's sum (sum_in_order of its bucket sums), added in rank order: the
// same double on every rank and every backend. clip_grad_norm_: coef = max_norm / (norm + 1e-6),
// applied only when < 1; max_norm 0 = no clipping.
SO_HOST_DEVICE inline ClipDecision decide_clip(const double* rank_sums, int ranks, float max_norm) {
  double sumsq = 0.0;
  for (int r = 0; r < ranks; ++r) sumsq += rank_sums[r];
  ClipDecision d;
  d.grad_norm = sqrt(sumsq);
  d.skipped = d.grad_norm - d.grad_norm == 0.0 ? 0 : 1;  // isfinite, spelled alike for host and device
  if (!d.skipped && max_norm > 0.0f) {
    const double coef = static_cast<double>(max_norm) / (d.grad_norm + 1e-6);
    d.clip_coef = static_cast<float>(coef < 1.0 ? coef : 1.0);
  }
  return d;
}

}  // namespace so
