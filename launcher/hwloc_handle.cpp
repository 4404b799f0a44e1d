#include "launcher/hwloc_handle.h"

#include <cerrno>
#include <cstring>

#include "so/core/error.h"

namespace so {

HwlocTopology load_hwloc_topology(const std::string& what, const std::function<int(hwloc_topology_t)>& configure) {
  hwloc_topology_t raw = nullptr;
  SO_CHECK(hwloc_topology_init(&raw) == 0, "hwloc_topology_init failed for ", what);
  HwlocTopology topo(raw);
  SO_CHECK(configure(raw) == 0, "hwloc cannot use ", what, ": ", std::strerror(errno));
  SO_CHECK(hwloc_topology_load(raw) == 0, "hwloc cannot load ", what, ": ", std::strerror(errno));
  return topo;
}

HwlocBitmap make_hwloc_bitmap() {
  HwlocBitmap b(hwloc_bitmap_alloc());
  SO_CHECK(b, "hwloc_bitmap_alloc failed");
  return b;
}

}  // namespace so
