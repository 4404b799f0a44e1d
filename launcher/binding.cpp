#include "launcher/binding.h"

#include <numa.h>

#include <cerrno>
#include <cstring>

#include "launcher/hwloc_handle.h"
#include "so/core/error.h"

namespace so {

BindResult bind_process(const RankPlacement& p) {
  BindResult r;
  const HwlocTopology topo = load_hwloc_topology("this machine's topology", [](hwloc_topology_t) { return 0; });
  const HwlocBitmap set = make_hwloc_bitmap();
  for (int c : p.cores) hwloc_bitmap_set(set.get(), static_cast<unsigned>(c));
  // HWLOC_CPUBIND_PROCESS: every existing thread, not only the caller (sched_setaffinity's scope).
  if (hwloc_set_cpubind(topo.get(), set.get(), HWLOC_CPUBIND_PROCESS) != 0)
    r.problem = str_cat("hwloc_set_cpubind to ", format_core_list(p.cores), " failed: ", std::strerror(errno));
  r.effective = process_cores();
  if (r.problem.empty() && r.effective != p.cores)
    r.problem =
        str_cat("asked for cores ", format_core_list(p.cores), ", the kernel gave ", format_core_list(r.effective));

  // Preferred, not bound: a full node spills over instead of failing an allocation.
  if (numa_available() < 0) {
    if (r.problem.empty()) r.problem = "no NUMA support in this kernel: memory policy not set";
  } else {
    numa_set_preferred(p.numa_node);
    if (numa_preferred() != p.numa_node && r.problem.empty())
      r.problem = str_cat("NUMA node ", p.numa_node, " not accepted as the preferred memory node");
  }
  r.bound = r.problem.empty();
  return r;
}

}  // namespace so
