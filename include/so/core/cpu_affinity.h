#pragma once
// The cores this process may run on, thread pinning, and the split of a rank's cores between
// the compute stream (BLAS) and the optimizer pool (`cpuadam_cores_perc`).
#include <string>
#include <vector>

namespace so {

std::vector<int> process_cores();                             // sched_getaffinity, ascending
bool pin_current_thread(const std::vector<int>& cores);       // false when the kernel refused
std::string format_core_list(const std::vector<int>& cores);  // "0-3,8,10-11"

struct CoreSplit {
  std::vector<int> compute;    // compute stream and its BLAS threads
  std::vector<int> optimizer;  // GraceAdam's pool
};
// The optimizer gets round(fraction * n) cores (the last ones), at least 1 and at most n - 1, so
// the compute stream always keeps a core of its own; with one core both share it.
// fraction in (0, 1].
CoreSplit split_cores(const std::vector<int>& cores, double optimizer_fraction);

}  // namespace so
