#include "launcher/topology.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "launcher/hwloc_handle.h"
#include "so/core/error.h"

namespace so {

namespace {

constexpr unsigned kNvidiaVendor = 0x10de;

// PCI class 0x0300 (VGA) or 0x0302 (3D controller, e.g. H100): not NVSwitches or bridges.
bool is_nvidia_gpu(hwloc_obj_t pci) {
  const unsigned cls = pci->attr->pcidev.class_id;
  return pci->attr->pcidev.vendor_id == kNvidiaVendor && (cls == 0x0300 || cls == 0x0302);
}

std::string bus_id(hwloc_obj_t pci) {
  char buf[32];
  const auto& a = pci->attr->pcidev;
  std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", a.domain, a.bus, a.dev, a.func);
  return buf;
}

// The CPUs of `cpuset` not yet claimed by a node with a lower os index: the first of every
// physical core, and all of them.
void collect_cpus(hwloc_topology_t t, hwloc_const_cpuset_t cpuset, hwloc_cpuset_t claimed, NumaNode& node) {
  for (int id = hwloc_bitmap_first(cpuset); id >= 0; id = hwloc_bitmap_next(cpuset, id)) {
    const hwloc_obj_t pu = hwloc_get_pu_obj_by_os_index(t, static_cast<unsigned>(id));
    if (!pu || hwloc_bitmap_isset(claimed, static_cast<unsigned>(id))) continue;
    hwloc_bitmap_set(claimed, static_cast<unsigned>(id));
    node.cpus.push_back(id);
    const hwloc_obj_t core = hwloc_get_ancestor_obj_by_type(t, HWLOC_OBJ_CORE, pu);
    if (!core || hwloc_bitmap_first(core->cpuset) == id) node.cores.push_back(id);
  }
}

Topology describe(hwloc_topology_t t, const std::string& fallback_host) {
  Topology topo;
  const char* host = hwloc_obj_get_info_by_name(hwloc_get_root_obj(t), "HostName");
  topo.host = host ? host : fallback_host;
  // hwloc gives a memory-only node (GH200's HBM) the cpuset of where it is attached, the same as
  // the Grace node beside it. Linux numbers the nodes with CPUs first, so each CPU belongs to the
  // lowest-numbered node that covers it, and a node left with none is memory-only.
  std::vector<hwloc_obj_t> nodes;
  for (hwloc_obj_t n = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, nullptr); n;
       n = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, n))
    nodes.push_back(n);
  std::sort(nodes.begin(), nodes.end(), [](hwloc_obj_t a, hwloc_obj_t b) { return a->os_index < b->os_index; });
  const HwlocBitmap claimed = make_hwloc_bitmap();
  for (hwloc_obj_t n : nodes) {
    NumaNode node;
    node.os_index = static_cast<int>(n->os_index);
    collect_cpus(t, n->cpuset, claimed.get(), node);
    if (!node.cores.empty()) topo.numa_nodes.push_back(std::move(node));
  }
  SO_CHECK(!topo.numa_nodes.empty(), "hwloc found no NUMA node with cores on ", topo.host);

  for (hwloc_obj_t pci = hwloc_get_next_pcidev(t, nullptr); pci; pci = hwloc_get_next_pcidev(t, pci)) {
    if (!is_nvidia_gpu(pci)) continue;
    // A GPU's locality is the cpuset of its first non-I/O ancestor (a package, or the whole
    // machine when the firmware does not say, in which case the first node is as good as any).
    const hwloc_obj_t near = hwloc_get_non_io_ancestor_obj(t, pci);
    Gpu gpu{bus_id(pci), topo.numa_nodes.front().os_index};
    for (const NumaNode& node : topo.numa_nodes)
      if (hwloc_bitmap_isset(near->cpuset, static_cast<unsigned>(node.cores.front()))) {
        gpu.numa_node = node.os_index;
        break;
      }
    topo.gpus.push_back(std::move(gpu));
  }
  // Fixed-width hex bus ids: string order is bus order.
  std::sort(topo.gpus.begin(), topo.gpus.end(), [](const Gpu& a, const Gpu& b) { return a.pci_bus_id < b.pci_bus_id; });
  return topo;
}

int keep_gpus(hwloc_topology_t t) { return hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT); }

}  // namespace

Topology topology_of_this_machine() {
  const HwlocTopology t = load_hwloc_topology("this machine's topology", keep_gpus);
  Topology topo = describe(t.get(), "localhost");
  topo.gpus = visible_gpus(topo.gpus, std::getenv("CUDA_VISIBLE_DEVICES"));
  return topo;
}

Topology topology_from_xml(const std::string& path) {
  const HwlocTopology t = load_hwloc_topology("hwloc XML '" + path + "'", [&](hwloc_topology_t h) {
    return hwloc_topology_set_xml(h, path.c_str()) || keep_gpus(h);
  });
  return describe(t.get(), path);
}

Topology topology_from_synthetic(const std::string& description) {
  const HwlocTopology t =
      load_hwloc_topology("hwloc synthetic topology '" + description + "'",
                          [&](hwloc_topology_t h) { return hwloc_topology_set_synthetic(h, description.c_str()); });
  return describe(t.get(), "synthetic");
}

std::vector<Gpu> visible_gpus(const std::vector<Gpu>& gpus, const char* cuda_visible_devices) {
  if (!cuda_visible_devices) return gpus;
  std::vector<Gpu> visible;
  std::stringstream list(cuda_visible_devices);
  for (std::string entry; std::getline(list, entry, ',');) {
    entry.erase(0, entry.find_first_not_of(" \t"));
    entry.erase(entry.find_last_not_of(" \t") + 1);
    char* end = nullptr;
    const long index = std::strtol(entry.c_str(), &end, 10);
    SO_CHECK(!entry.empty() && *end == '\0', "CUDA_VISIBLE_DEVICES='", cuda_visible_devices, "': entry '", entry,
             "' is not a device index; so_train pairs GPUs with NUMA nodes by index (use indices, or --bind none)");
    if (index < 0 || index >= static_cast<long>(gpus.size())) break;
    visible.push_back(gpus[static_cast<size_t>(index)]);
  }
  return visible;
}

}  // namespace so
