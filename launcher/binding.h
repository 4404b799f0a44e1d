#pragma once
// Applying a placement to this process: CPU affinity of every thread and the NUMA policy for
// new allocations, then reading the affinity back to report whether the kernel honoured it.
#include <string>
#include <vector>

#include "launcher/placement.h"

namespace so {

struct BindResult {
  bool bound = false;          // the affinity read back equals the request and the memory policy is set
  std::vector<int> effective;  // sched_getaffinity of the calling thread afterwards
  std::string problem;         // why not, when !bound
};

// Binds all threads of the process (MPI's and OpenBLAS's exist already) to p.cores and makes
// libnuma prefer p.numa_node, so host buffers and pages first touched later land there. Never
// throws on a refusal (a cgroup, a container): the result says what happened.
BindResult bind_process(const RankPlacement& p);

}  // namespace so
