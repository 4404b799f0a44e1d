#pragma once
// How far ahead GraceAdam's kernels prefetch the streams they read, chosen once per process for
// the CPU it runs on. The same binary runs on Intel, AMD and Arm hosts, whose hardware prefetchers
// want different help (docs/optimizer.md, "Software prefetch"):
//   Intel (the dev VM's Xeon): 512 elements (2 KiB of fp32) ahead took the step from memory time +
//     arithmetic time to the larger of the two;
//   AMD (EPYC, Zen 4): that distance cost 13-18% of the step and the probes on one thread in DRAM
//     (3-10% on two), 128 elements (512 B) 7-24%: none (its hardware prefetchers keep up alone,
//     as DeepSpeed's CPUAdam assumes);
//   Arm (Grace): 512, unmeasured against the alternatives.
// SO_ADAM_PREFETCH=<elements> (0: none) overrides it, for measurements; results never depend on it.
#include <cstdint>
#include <string>

namespace so {

int64_t adam_prefetch_ahead();
// The default for a CPU vendor as __builtin_cpu_is names it ("intel", "amd"), "" elsewhere.
int64_t default_adam_prefetch_ahead(const std::string& vendor);

}  // namespace so
