#pragma once
// The per-call scalars of AdamW, derived from AdamWParams exactly once and exactly as torch does
// (Python floats, i.e. double, rounded to float once), so every kernel feeds the same floats into
// the same operations.
#include "so/optim/adamw.h"

namespace so::optim {

struct AdamConstants {
  float neg_step_size;  // -lr / (1 - beta1^t)
  float bc2_sqrt;       // sqrt(1 - beta2^t)
  float inv_bc2_sqrt;   // 1.0f / bc2_sqrt, correctly rounded (division by bc2_sqrt as two FMAs)
  float decay;          // 1 - lr * weight_decay
  float beta2, one_minus_b1, one_minus_b2, eps, grad_scale;
  // The inverse (rollback) multiplies by these instead of dividing by decay, 1 - (1-b1) and b2:
  // one rounding more, but it then costs what a step costs when the arrays sit in cache.
  float inv_decay, inv_beta1, inv_beta2;
};

// Out of line on purpose: the ISA kernel files are compiled with their own -m flags, and an inline
// function they shared with other files could be linked in their (AVX-512) flavour everywhere.
AdamConstants adam_constants(const AdamWParams& hp);

}  // namespace so::optim
