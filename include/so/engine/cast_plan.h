#pragma once
// Superchip-aware casting: for each direction (gradients down, weights up) decide whether the
// bf16<->fp32 cast happens on the device (and fp32 crosses the link) or on the host (bf16 crosses
// the link, and GraceAdam reads or writes bf16 in its fused pass). Decided from measured link
// bandwidth per direction, device cast throughput and GraceAdam's cost with each operand type,
// unless the config fixes a site. The link is measured the way the pipeline uses it: host buffers
// allocated, placed and pinned like the offloaded state, copies of one bucket at a time (on a
// GH200 the two directions differ by 2x, from pageable memory both by 5x: both are printed).
#include <cstdint>
#include <string>
#include <vector>

#include "so/backend/backend.h"
#include "so/engine/offload_config.h"
#include "so/optim/grace_adam.h"

namespace so {

struct CastPlanRequest {
  DType model_dtype = DType::F32;
  CastSite grads = CastSite::Auto, weights = CastSite::Auto;  // configured sites
  int64_t bucket_elements = 0;  // the largest offloaded bucket (shard): what one copy moves
  int numa_node = -1;           // where the offloaded state lives
  bool pin_memory = true;       // as offload_optimizer.pin_memory
};

struct CastPlan {
  CastSite grads = CastSite::Host;    // Host: move model-dtype gradients as they are
  CastSite weights = CastSite::Host;  // Host: GraceAdam writes model-dtype weights for the device
  double d2h_gbs = 0, h2d_gbs = 0;    // measured link bandwidth, fp32 copies of one bucket
  std::string report;                 // measurements and the reasoning, for the start-up log
};

// Elements of the start-up probe's copies (one device buffer of each dtype): one bucket, within
// bounds (what the memory planner counts for it).
int64_t cast_probe_elements(int64_t bucket_elements);

// Measures the link for every model; fp32 models need no cast (both sites Host).
CastPlan plan_casts(Backend& backend, GraceAdam& adam, const CastPlanRequest& request);

// The NUMA node offloaded host state lives on: that of the optimizer pool's first core (-1: local).
int offload_numa_node(const std::vector<int>& optimizer_cores);

// plan_casts for a caller that needs the sites before an engine exists (the trainer's memory
// plan), with a GraceAdam of its own on the optimizer's cores; the engine then takes the result
// (EngineOptions::cast) instead of measuring again.
CastPlan measure_casts(Backend& backend, const OffloadConfig& offload, DType model_dtype, int64_t largest_bucket,
                       const std::vector<int>& optimizer_cores);

}  // namespace so
