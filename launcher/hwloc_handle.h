#pragma once
// RAII owners of hwloc handles, so no topology or bitmap leaks on an error path.
#include <hwloc.h>

#include <functional>
#include <memory>
#include <string>

namespace so {

struct HwlocTopologyDeleter {
  void operator()(hwloc_topology* t) const { hwloc_topology_destroy(t); }
};
using HwlocTopology = std::unique_ptr<hwloc_topology, HwlocTopologyDeleter>;

struct HwlocBitmapDeleter {
  void operator()(hwloc_bitmap_s* b) const { hwloc_bitmap_free(b); }
};
using HwlocBitmap = std::unique_ptr<hwloc_bitmap_s, HwlocBitmapDeleter>;

// A loaded topology: `configure` picks the source and filters before hwloc_topology_load (it
// returns hwloc's status). Fails naming `what` (e.g. "hwloc XML 'box.xml'") when hwloc refuses.
HwlocTopology load_hwloc_topology(const std::string& what, const std::function<int(hwloc_topology_t)>& configure);

HwlocBitmap make_hwloc_bitmap();

}  // namespace so
