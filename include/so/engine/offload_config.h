#pragma once
// Where the optimizer runs and how: DeepSpeed's zero_optimization.offload_optimizer block
// ("device", "ratio", "super_offload", "cpuadam_cores_perc", "pin_memory") plus our own knobs.
#include <cstdint>
#include <string>

namespace so {

enum class OffloadMode {
  None,          // optimizer state and step on the device
  ZeroOffload,   // after backward: norm and finite check, then the CPU steps every offloaded bucket
  SuperOffload,  // speculation-then-validation: the CPU steps each bucket as its gradients arrive
};

// Where a cast between bf16 and fp32 happens on the way down (gradients) or up (weights).
enum class CastSite { Auto, Device, Host };

// When SuperOffload speculates: on every step, or (adaptive) only after a step that needed no
// clipping and no skip — while clipping keeps triggering (early training), rollback + redo would
// double the CPU's work on the critical path, so those steps wait for validation instead.
enum class Speculation { Adaptive, Always };

// Undoing a speculative step: recompute the old state from the new one (no memory), or restore
// a copy of the bucket's state taken before the step (bitwise).
enum class RollbackMode { Inverse, Exact };

struct OffloadConfig {
  OffloadMode mode = OffloadMode::None;
  double ratio = 1.0;                // share of parameters whose optimizer step runs on the CPU
  int64_t device_tail_buckets = -1;  // instead of ratio: keep exactly this many last buckets on the device
  double cpu_cores_fraction = 0.8;   // cpuadam_cores_perc: the optimizer pool's share of the rank's cores
  bool pin_memory = true;
  CastSite cast_grads = CastSite::Auto;
  CastSite cast_weights = CastSite::Auto;
  RollbackMode rollback = RollbackMode::Inverse;
  Speculation speculation = Speculation::Adaptive;
  std::string simd = "auto";  // GraceAdam instruction set: auto or a name from so/optim/simd_isa.h
};

const char* offload_mode_name(OffloadMode m);
const char* cast_site_name(CastSite c);
const char* rollback_mode_name(RollbackMode r);

}  // namespace so
