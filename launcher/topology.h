#pragma once
// What placement needs to know about one node: its NUMA nodes with their cores, and its GPUs
// with the NUMA node each is attached to. Always read through hwloc: from this machine, from an
// hwloc XML file (a topology saved on another machine), or from an hwloc synthetic description.
#include <string>
#include <vector>

namespace so {

struct NumaNode {
  int os_index = -1;
  std::vector<int> cores;  // one CPU id per physical core (its first hardware thread), ascending
  std::vector<int> cpus;   // every hardware thread (CPU id), ascending
};

struct Gpu {
  std::string pci_bus_id;  // "0009:01:00.0"
  int numa_node = -1;      // os index of the nearest NUMA node that has cores
};

struct Topology {
  std::string host;
  // Only nodes with cores, by os index: GH200 also exposes its HBM as CPU-less NUMA nodes, which
  // no rank can run on.
  std::vector<NumaNode> numa_nodes;
  // NVIDIA GPUs in PCI bus order, which is CUDA's device order for identical GPUs: gpus[i] is
  // CUDA device i.
  std::vector<Gpu> gpus;
};

// This machine as this process may use it (cgroup restrictions applied by hwloc); GPUs filtered
// and ordered by CUDA_VISIBLE_DEVICES.
Topology topology_of_this_machine();
Topology topology_from_xml(const std::string& path);
// Synthetic descriptions have no I/O devices: no GPUs (tests add them, or use XML).
Topology topology_from_synthetic(const std::string& description);

// The GPUs a process sees under CUDA_VISIBLE_DEVICES (nullptr = unset: all), in that order.
// Like CUDA, the list ends at the first index that does not exist; GPU UUIDs are refused, since
// mapping them needs NVML.
std::vector<Gpu> visible_gpus(const std::vector<Gpu>& gpus, const char* cuda_visible_devices);

}  // namespace so
