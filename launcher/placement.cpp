#include "launcher/placement.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "so/core/error.h"

namespace so {

namespace {

// The nodes ranks may use: all of them, or with a core list only its CPUs, node by node.
std::vector<NumaNode> usable_nodes(const Topology& topo, const std::vector<int>& core_list) {
  if (core_list.empty()) return topo.numa_nodes;
  std::vector<NumaNode> nodes;
  std::vector<int> unplaced = core_list;
  for (const NumaNode& n : topo.numa_nodes) {
    NumaNode picked{n.os_index, {}, {}};
    for (int c : n.cpus)
      if (std::find(core_list.begin(), core_list.end(), c) != core_list.end()) picked.cores.push_back(c);
    std::erase_if(unplaced, [&](int c) { return std::binary_search(n.cpus.begin(), n.cpus.end(), c); });
    if (!picked.cores.empty()) nodes.push_back(std::move(picked));
  }
  SO_CHECK(unplaced.empty(), "--bind-core-list names CPUs ", format_core_list(unplaced), " that ", topo.host,
           " does not have (or this process may not use)");
  return nodes;
}

}  // namespace

RankPlacement place_rank(const Topology& topo, int local_rank, int local_size, double optimizer_fraction,
                         const std::vector<int>& core_list) {
  SO_CHECK(local_size > 0 && local_rank >= 0 && local_rank < local_size, "place_rank: local rank ", local_rank, " of ",
           local_size);
  const std::vector<NumaNode> nodes = usable_nodes(topo, core_list);
  const int n_gpus = static_cast<int>(topo.gpus.size());
  SO_CHECK(n_gpus == 0 || local_size <= n_gpus, topo.host, " runs ", local_size, " ranks but has ", n_gpus,
           " GPUs: one rank per GPU (start at most ", n_gpus, " ranks per node)");

  // Node of every local rank; this rank's position among the ranks on its node.
  std::vector<int> node_of(static_cast<size_t>(local_size));
  for (int r = 0; r < local_size; ++r) {
    if (n_gpus == 0) {
      node_of[r] = nodes[static_cast<size_t>(r) % nodes.size()].os_index;
      continue;
    }
    const int want = topo.gpus[static_cast<size_t>(r)].numa_node;
    SO_CHECK(std::any_of(nodes.begin(), nodes.end(), [&](const NumaNode& n) { return n.os_index == want; }), "GPU ", r,
             " (", topo.gpus[static_cast<size_t>(r)].pci_bus_id, ") is attached to NUMA node ", want,
             ", which has no cores to run its rank on", core_list.empty() ? "" : " in --bind-core-list");
    node_of[r] = want;
  }
  RankPlacement p;
  p.gpu = n_gpus > 0 ? local_rank : -1;
  p.numa_node = node_of[static_cast<size_t>(local_rank)];
  const int slot = static_cast<int>(std::count(node_of.begin(), node_of.begin() + local_rank, p.numa_node));
  p.ranks_on_node = static_cast<int>(std::count(node_of.begin(), node_of.end(), p.numa_node));

  const NumaNode& node =
      *std::find_if(nodes.begin(), nodes.end(), [&](const NumaNode& n) { return n.os_index == p.numa_node; });
  const int c = static_cast<int>(node.cores.size());
  const int r = p.ranks_on_node;
  p.cores_on_node = c;
  p.shares_cores = r > c;
  // Slot s gets cores [s*c/r, (s+1)*c/r): disjoint and near-equal when r <= c; with r > c the
  // range is empty and the slot takes core s*c/r, so consecutive slots share one core.
  const int begin = slot * c / r;
  const int end = std::max(begin + 1, (slot + 1) * c / r);
  p.cores.assign(node.cores.begin() + begin, node.cores.begin() + end);
  if (optimizer_fraction > 0)
    p.split = split_cores(p.cores, optimizer_fraction);
  else
    p.split.compute = p.cores;
  return p;
}

std::vector<int> parse_core_list(const std::string& text) {
  // A CPU id: digits only (no sign, no spaces), and small enough that a typo cannot make a
  // range of billions.
  auto number = [](const std::string& s, long& v) {
    if (s.empty() || s.size() > 6 || s.find_first_not_of("0123456789") != std::string::npos) return false;
    v = std::strtol(s.c_str(), nullptr, 10);
    return v < (1 << 16);
  };
  std::vector<int> cores;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) {
    const size_t dash = part.find('-');
    long a = 0, b = 0;
    const bool ok = dash == std::string::npos ? number(part, a) && number(part, b)
                                              : number(part.substr(0, dash), a) && number(part.substr(dash + 1), b);
    SO_CHECK(ok && a <= b, "core list '", text, "': '", part, "' is not a CPU id or an ascending range like 4-7");
    for (long c = a; c <= b; ++c) cores.push_back(static_cast<int>(c));
  }
  SO_CHECK(!cores.empty(), "core list '", text, "' names no CPU");
  std::sort(cores.begin(), cores.end());
  cores.erase(std::unique(cores.begin(), cores.end()), cores.end());
  return cores;
}

}  // namespace so
