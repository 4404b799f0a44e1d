#include "so/core/cpu_affinity.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "so/core/error.h"

namespace so {

namespace {
// Linux CPU ids can exceed CPU_SETSIZE (1024) on large machines; size the set to the system.
int cpu_set_capacity() {
  const long configured = sysconf(_SC_NPROCESSORS_CONF);
  return std::max<int>(CPU_SETSIZE, configured > 0 ? static_cast<int>(configured) : 0);
}

struct CpuSet {
  explicit CpuSet(int capacity) : count(capacity), set(CPU_ALLOC(capacity)), bytes(CPU_ALLOC_SIZE(capacity)) {
    SO_CHECK(set != nullptr, "cannot allocate a cpu set for ", capacity, " cpus");
    CPU_ZERO_S(bytes, set);
  }
  ~CpuSet() { CPU_FREE(set); }
  CpuSet(const CpuSet&) = delete;
  CpuSet& operator=(const CpuSet&) = delete;
  int count;
  cpu_set_t* set;
  size_t bytes;
};
}  // namespace

std::vector<int> process_cores() {
  CpuSet cs(cpu_set_capacity());
  SO_CHECK(sched_getaffinity(0, cs.bytes, cs.set) == 0, "sched_getaffinity failed");
  std::vector<int> cores;
  for (int c = 0; c < cs.count; ++c)
    if (CPU_ISSET_S(c, cs.bytes, cs.set)) cores.push_back(c);
  return cores;
}

bool pin_current_thread(const std::vector<int>& cores) {
  if (cores.empty()) return false;
  const int capacity = std::max(cpu_set_capacity(), *std::max_element(cores.begin(), cores.end()) + 1);
  CpuSet cs(capacity);
  for (int c : cores) {
    if (c < 0) return false;
    CPU_SET_S(c, cs.bytes, cs.set);
  }
  return pthread_setaffinity_np(pthread_self(), cs.bytes, cs.set) == 0;
}

std::string format_core_list(const std::vector<int>& cores) {
  std::vector<int> sorted = cores;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  std::string out;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(sorted[i]);
    if (j > i) out += '-' + std::to_string(sorted[j]);
    i = j + 1;
  }
  return out;
}

CoreSplit split_cores(const std::vector<int>& cores, double optimizer_fraction) {
  SO_CHECK(!cores.empty(), "split_cores: no cores to split");
  SO_CHECK(optimizer_fraction > 0.0 && optimizer_fraction <= 1.0,
           "split_cores: cpuadam_cores_perc must be in (0, 1], got ", optimizer_fraction);
  const int n = static_cast<int>(cores.size());
  // The compute stream keeps at least one core of its own whenever there are two.
  const int k = std::clamp(static_cast<int>(std::lround(optimizer_fraction * n)), 1, std::max(1, n - 1));
  CoreSplit split;
  split.optimizer.assign(cores.end() - k, cores.end());
  split.compute.assign(cores.begin(), cores.end() - k);
  if (split.compute.empty()) split.compute = cores;  // one core: shared
  return split;
}

}  // namespace so
