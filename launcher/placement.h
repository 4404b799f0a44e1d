#pragma once
// Where one rank of a node runs: which GPU, which NUMA node, which cores, and how those cores are
// split between the compute stream and the optimizer pool. A pure function of the topology and
// the rank's place among the node's ranks, so every rank computes the same plan independently.
//
// With GPUs: local rank i drives GPU i and runs on that GPU's NUMA node (GH200: its own Grace).
// Without: ranks go round-robin over the NUMA nodes. Either way the ranks that share a node split
// its cores into disjoint, contiguous, near-equal parts; with more ranks than cores they share.
#include <string>
#include <vector>

#include "launcher/topology.h"
#include "so/core/cpu_affinity.h"

namespace so {

struct RankPlacement {
  int gpu = -1;               // index into Topology::gpus (= CUDA device); -1 = none
  int numa_node = -1;         // os index
  std::vector<int> cores;     // ascending: what the process is bound to
  CoreSplit split;            // compute stream / optimizer pool (empty when there is no pool)
  int ranks_on_node = 0;      // local ranks placed on this NUMA node
  int cores_on_node = 0;      // cores of the node available to them
  bool shares_cores = false;  // ranks_on_node > cores_on_node: cores are shared, not split
};

// optimizer_fraction: cpuadam_cores_perc in (0, 1], or 0 when there is no optimizer pool (no
// offload). core_list (--bind-core-list): when not empty, only these CPUs are handed out, each
// on its own NUMA node. Fails, naming both counts, when there are GPUs but fewer than local ranks.
RankPlacement place_rank(const Topology& topo, int local_rank, int local_size, double optimizer_fraction,
                         const std::vector<int>& core_list = {});

// "0-3,8,10-11" (format_core_list's format) -> {0,1,2,3,8,10,11}; fails naming the bad part.
std::vector<int> parse_core_list(const std::string& text);

}  // namespace so
