#pragma once
// Superchip-aware casting: for each direction (gradients down, weights up) decide whether the
// bf16<->fp32 cast happens on the device (and fp32 crosses the link) or on the host (bf16 crosses
// the link, and GraceAdam reads or writes bf16 in its fused pass). Decided from measured link
// bandwidth, device cast throughput and GraceAdam's cost with each operand type, unless the
// config fixes a site.
#include <string>

#include "so/backend/backend.h"
#include "so/engine/offload_config.h"
#include "so/optim/grace_adam.h"

namespace so {

struct CastPlan {
  CastSite grads = CastSite::Host;    // Host: move model-dtype gradients as they are
  CastSite weights = CastSite::Host;  // Host: GraceAdam writes model-dtype weights for the device
  std::string report;                 // measurements and the reasoning, for the start-up log
};

// fp32 models need no cast: both sites are Host and nothing is measured.
CastPlan plan_casts(Backend& backend, GraceAdam& adam, DType model_dtype, CastSite grads, CastSite weights);

}  // namespace so
