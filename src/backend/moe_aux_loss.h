#pragma once
// Ops::moe_aux_loss's arithmetic (MoeAuxLoss, so/backend/ops.h), one sequential pass over the E
// experts in fp64, shared by the CPU and a one-thread CUDA kernel so both give the same bits.
#include "so/backend/dropout_mask.h"  // SO_HOST_DEVICE
#include "so/backend/ops.h"

namespace so {

SO_HOST_DEVICE inline void apply_moe_aux_loss(const MoeAuxLoss& a, float* loss_acc, float* dprob, double* tokens,
                                              double* probs) {
  const double scale = a.weight * static_cast<double>(a.experts) / (a.rows * a.rows);
  double aux = 0.0;
  for (int64_t e = 0; e < a.experts; ++e) {
    aux += tokens[e] * probs[e];
    // d(weight * aux) / d(probability of e at any token and layer): the selections are constants.
    dprob[e] = static_cast<float>(scale * tokens[e]);
    tokens[e] = probs[e] = 0.0;
  }
  loss_acc[0] += static_cast<float>(scale * aux);
}

}  // namespace so
