// Rank placement on synthetic nodes: a 4-GH200 box, a 2-socket x86 node with 8 GPUs, this kind of
// 2-core machine, a CPU-only 2-node machine; with 1, 2, 4 and 8 ranks per node. GPU boxes are
// hwloc XML files (a synthetic topology exported by hwloc, with PCI devices and GH200's HBM
// nodes added), so GPU discovery and NUMA pairing run through hwloc as on a real node.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <unistd.h>

#include "launcher/hwloc_handle.h"
#include "launcher/placement.h"
#include "launcher/topology.h"
#include "so/core/error.h"

namespace so {
namespace {

std::string temp_xml(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()) + ".xml")).string();
}

void export_synthetic_xml(const std::string& description, const std::string& path) {
  const HwlocTopology t = load_hwloc_topology(
      description, [&](hwloc_topology_t h) { return hwloc_topology_set_synthetic(h, description.c_str()); });
  ASSERT_EQ(hwloc_topology_export_xml(t.get(), path.c_str(), 0), 0);
}

struct PciDevice {
  int package;
  std::string bus_id;  // "0009:01:00.0"
  std::string type;    // hwloc's pci_type: "class [vendor:device] [subvendor:subdevice] revision"
};
const std::string kH100 = "0302 [10de:2342] [10de:16eb] a1";
const std::string kNvSwitch = "0680 [10de:22a3] [10de:1796] a1";  // NVIDIA, but not a GPU
const std::string kConnectX = "0207 [15b3:1021] [15b3:0023] 00";  // InfiniBand NIC

// An hwloc XML box: `description` (one NUMA node per package) with `devices` under their packages
// and, with `hbm_nodes`, one memory-only NUMA node per package numbered after the CPU nodes, as
// GH200 exposes its GPU memory.
Topology xml_box(const std::string& name, const std::string& description, int packages,
                 const std::vector<PciDevice>& devices, bool hbm_nodes) {
  const std::string path = temp_xml(name);
  export_synthetic_xml(description, path);
  std::stringstream buf;
  buf << std::ifstream(path).rdbuf();
  std::string xml = buf.str();
  const std::regex package_node(
      R"re(<object type="NUMANode" os_index="(\d+)"[^>]*>(\s*<page_type[^>]*/>)*\s*</object>)re");
  std::string out;
  auto it = std::sregex_iterator(xml.begin(), xml.end(), package_node);
  size_t copied = 0;
  for (int gp = 100000; it != std::sregex_iterator(); ++it) {
    const int pkg = std::stoi((*it)[1]);
    out += xml.substr(copied, static_cast<size_t>(it->position() + it->length()) - copied);
    copied = static_cast<size_t>(it->position() + it->length());
    if (hbm_nodes) {
      const unsigned long long bit = 1ull << (packages + pkg);
      char node[512];
      std::snprintf(
          node, sizeof node,
          "<object type=\"NUMANode\" os_index=\"%d\" cpuset=\"0x0\" complete_cpuset=\"0x0\" nodeset=\"0x%llx\" "
          "complete_nodeset=\"0x%llx\" gp_index=\"%d\" local_memory=\"103079215104\"/>",
          packages + pkg, bit, bit, gp++);
      out += node;
    }
    for (const PciDevice& d : devices)
      if (d.package == pkg)
        out += "<object type=\"PCIDev\" gp_index=\"" + std::to_string(gp++) + "\" pci_busid=\"" + d.bus_id +
               "\" pci_type=\"" + d.type + "\" pci_link_speed=\"0.000000\"/>";
  }
  out += xml.substr(copied);
  if (hbm_nodes) {  // the machine's (complete, allowed) nodesets span the HBM nodes too
    char cpu_nodes[32], all_nodes[32];
    std::snprintf(cpu_nodes, sizeof cpu_nodes, "nodeset=\"0x%08llx\"", (1ull << packages) - 1);
    std::snprintf(all_nodes, sizeof all_nodes, "nodeset=\"0x%08llx\"", (1ull << (2 * packages)) - 1);
    out = std::regex_replace(out, std::regex(cpu_nodes), all_nodes);
  }
  std::ofstream(path) << out;
  Topology topo = topology_from_xml(path);
  std::filesystem::remove(path);
  return topo;
}

// 4 x GH200: 4 Grace packages of 72 cores, an H100 and an HBM node each, a NIC beside each GPU.
Topology gh200_box() {
  std::vector<PciDevice> devs;
  const char* gpu_bus[] = {"0009:01:00.0", "0019:01:00.0", "0029:01:00.0", "0039:01:00.0"};
  for (int p = 3; p >= 0; --p) {  // inserted out of bus order: discovery must sort them
    devs.push_back({p, gpu_bus[p], kH100});
    devs.push_back({p, "000" + std::to_string(p) + ":01:00.0", kConnectX});
  }
  return xml_box("gh200", "pack:4 numa:1 core:72 pu:1", 4, devs, true);
}

// 2-socket x86, 32 cores x 2 hardware threads per socket numbered like Linux does (CPU c and
// c + 64 are siblings), 4 GPUs per socket, an NVSwitch.
Topology x86_8gpu_box() {
  std::vector<PciDevice> devs;
  const char* bus[] = {"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
                       "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"};
  for (int g = 0; g < 8; ++g) devs.push_back({g / 4, bus[g], kH100});
  devs.push_back({0, "0000:05:00.0", kNvSwitch});
  return xml_box("x86", "pack:2 numa:1 core:32 pu:2(indexes=2*64:1*2)", 2, devs, false);
}

const NumaNode& node_of(const Topology& topo, int os_index) {
  const auto it = std::find_if(topo.numa_nodes.begin(), topo.numa_nodes.end(),
                               [&](const NumaNode& n) { return n.os_index == os_index; });
  EXPECT_NE(it, topo.numa_nodes.end()) << "no node " << os_index;
  return *it;
}

std::vector<int> range(int first, int last) {
  std::vector<int> v;
  for (int c = first; c <= last; ++c) v.push_back(c);
  return v;
}

// Every rank of a node: the invariants of any plan, and the plan returned for further checks.
std::vector<RankPlacement> plan_node(const Topology& topo, int local_size, double fraction) {
  std::vector<RankPlacement> plan;
  for (int r = 0; r < local_size; ++r) {
    RankPlacement p = place_rank(topo, r, local_size, fraction);
    SCOPED_TRACE("local rank " + std::to_string(r) + " of " + std::to_string(local_size));
    EXPECT_FALSE(p.cores.empty());
    const NumaNode& node = node_of(topo, p.numa_node);
    for (int c : p.cores) EXPECT_TRUE(std::count(node.cores.begin(), node.cores.end(), c)) << "core " << c;
    if (!topo.gpus.empty()) {
      EXPECT_EQ(p.gpu, r);
      EXPECT_EQ(p.numa_node, topo.gpus[static_cast<size_t>(r)].numa_node);
    } else {
      EXPECT_EQ(p.gpu, -1);
    }
    if (fraction > 0) {  // split_cores' rule on exactly these cores
      const CoreSplit want = split_cores(p.cores, fraction);
      EXPECT_EQ(p.split.compute, want.compute);
      EXPECT_EQ(p.split.optimizer, want.optimizer);
    } else {
      EXPECT_EQ(p.split.compute, p.cores);
      EXPECT_TRUE(p.split.optimizer.empty());
    }
    // Deterministic: every rank computes the whole node's plan independently.
    const RankPlacement again = place_rank(topo, r, local_size, fraction);
    EXPECT_EQ(again.cores, p.cores);
    EXPECT_EQ(again.numa_node, p.numa_node);
    plan.push_back(std::move(p));
  }
  for (size_t a = 0; a < plan.size(); ++a)
    for (size_t b = a + 1; b < plan.size(); ++b) {
      if (plan[a].shares_cores || plan[b].shares_cores) continue;
      for (int c : plan[a].cores)
        EXPECT_FALSE(std::count(plan[b].cores.begin(), plan[b].cores.end(), c))
            << "ranks " << a << " and " << b << " share core " << c << " with " << local_size << " ranks";
    }
  return plan;
}

TEST(Topology, Gh200BoxFromXml) {
  const Topology topo = gh200_box();
  ASSERT_EQ(topo.numa_nodes.size(), 4u);  // the HBM nodes 4-7 have no cores of their own
  for (int n = 0; n < 4; ++n) {
    EXPECT_EQ(topo.numa_nodes[n].os_index, n);
    EXPECT_EQ(topo.numa_nodes[n].cores, range(72 * n, 72 * n + 71));
  }
  ASSERT_EQ(topo.gpus.size(), 4u);  // not the NICs
  EXPECT_EQ(topo.gpus[0].pci_bus_id, "0009:01:00.0");
  EXPECT_EQ(topo.gpus[3].pci_bus_id, "0039:01:00.0");
  for (int g = 0; g < 4; ++g) EXPECT_EQ(topo.gpus[g].numa_node, g);
}

TEST(Placement, Gh200OneRankPerGraceAndItsCores) {
  const Topology topo = gh200_box();
  for (int ranks : {1, 2, 4}) {
    const auto plan = plan_node(topo, ranks, 0.9);
    for (int r = 0; r < ranks; ++r) {
      EXPECT_EQ(plan[r].numa_node, r);
      EXPECT_EQ(plan[r].cores, range(72 * r, 72 * r + 71));  // the whole Grace: one rank per node
    }
  }
  // cpuadam_cores_perc 0.9 of a Grace: compute on 0-6, GraceAdam on 7-71, the seeds' MPAM split.
  const RankPlacement p = place_rank(topo, 0, 4, 0.9);
  EXPECT_EQ(p.split.compute, range(0, 6));
  EXPECT_EQ(p.split.optimizer, range(7, 71));
}

TEST(Placement, MoreRanksThanGpusIsAnErrorNamingBothCounts) {
  const Topology topo = gh200_box();
  try {
    place_rank(topo, 0, 8, 0.9);
    FAIL() << "8 ranks on 4 GPUs placed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("8 ranks but has 4 GPUs"), std::string::npos) << e.what();
  }
}

TEST(Placement, X86RanksSharingASocketSplitItsPhysicalCores) {
  const Topology topo = x86_8gpu_box();
  ASSERT_EQ(topo.numa_nodes.size(), 2u);
  EXPECT_EQ(topo.numa_nodes[0].cores, range(0, 31));  // one CPU per core: siblings 64-95 left idle
  EXPECT_EQ(topo.numa_nodes[0].cpus.size(), 64u);
  ASSERT_EQ(topo.gpus.size(), 8u);  // not the NVSwitch
  for (int g = 0; g < 8; ++g) EXPECT_EQ(topo.gpus[g].numa_node, g / 4);
  for (int ranks : {1, 2, 4, 8}) {
    const auto plan = plan_node(topo, ranks, 0.5);
    const int per_rank = 32 / std::min(ranks, 4);  // GPUs 0-3 on socket 0, 4-7 on socket 1
    for (int r = 0; r < ranks; ++r) {
      const int first = (r / 4) * 32 + (r % 4) * per_rank;
      EXPECT_EQ(plan[r].cores, range(first, first + per_rank - 1)) << r << " of " << ranks;
      EXPECT_FALSE(plan[r].shares_cores);
    }
  }
}

TEST(Placement, TwoCoreMachineWithoutGpu) {
  const Topology topo = topology_from_synthetic("numa:1 core:2 pu:1");
  auto one = plan_node(topo, 1, 0.8);
  EXPECT_EQ(one[0].cores, range(0, 1));
  EXPECT_EQ(one[0].split.compute, std::vector<int>{0});
  EXPECT_EQ(one[0].split.optimizer, std::vector<int>{1});
  auto two = plan_node(topo, 2, 0.8);
  EXPECT_EQ(two[0].cores, std::vector<int>{0});
  EXPECT_EQ(two[1].cores, std::vector<int>{1});
  EXPECT_FALSE(two[1].shares_cores);
  EXPECT_EQ(two[1].split.compute, two[1].split.optimizer);  // one core: both share it
  // Oversubscribed: never an error; pairs of ranks share a core, and the placement says so.
  auto four = plan_node(topo, 4, 0.8);
  const std::vector<std::vector<int>> want = {{0}, {0}, {1}, {1}};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(four[r].cores, want[r]);
    EXPECT_TRUE(four[r].shares_cores);
    EXPECT_EQ(four[r].ranks_on_node, 4);
    EXPECT_EQ(four[r].cores_on_node, 2);
  }
}

TEST(Placement, CpuOnlyRanksGoRoundRobinOverNumaNodes) {
  const Topology topo = topology_from_synthetic("pack:2 numa:1 core:8 pu:1");
  EXPECT_EQ(plan_node(topo, 1, 0.5)[0].cores, range(0, 7));  // fewer ranks than nodes
  const auto two = plan_node(topo, 2, 0.5);
  EXPECT_EQ(two[1].numa_node, 1);
  EXPECT_EQ(two[1].cores, range(8, 15));
  const auto four = plan_node(topo, 4, 0.5);
  const std::vector<std::vector<int>> want4 = {range(0, 3), range(8, 11), range(4, 7), range(12, 15)};
  for (int r = 0; r < 4; ++r) EXPECT_EQ(four[r].cores, want4[r]);
  const auto eight = plan_node(topo, 8, 0.5);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(eight[r].numa_node, r % 2);
    EXPECT_EQ(eight[r].cores.size(), 2u);
  }
  for (const auto& p : plan_node(topo, 32, 0.5)) EXPECT_TRUE(p.shares_cores);
}

TEST(Placement, NoOffloadMeansNoOptimizerPool) {
  const Topology topo = topology_from_synthetic("numa:1 core:4 pu:1");
  const RankPlacement p = place_rank(topo, 0, 1, 0.0);
  EXPECT_EQ(p.split.compute, range(0, 3));
  EXPECT_TRUE(p.split.optimizer.empty());
}

TEST(Placement, CoreListReplacesTheTopologysCores) {
  const Topology topo = gh200_box();
  const std::vector<int> list = parse_core_list("0-35,72-107");
  EXPECT_EQ(place_rank(topo, 0, 2, 0.5, list).cores, range(0, 35));
  EXPECT_EQ(place_rank(topo, 1, 2, 0.5, list).cores, range(72, 107));
  // GPU 2's Grace has none of the listed cores: its rank has nowhere to run.
  EXPECT_THROW(place_rank(topo, 2, 4, 0.5, list), Error);
  try {
    place_rank(topo, 0, 1, 0.5, parse_core_list("0-3,500"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CPUs 500"), std::string::npos) << e.what();
  }
  // Without GPUs only the nodes with listed cores take ranks.
  const Topology cpu = topology_from_synthetic("pack:2 numa:1 core:8 pu:1");
  const std::vector<int> node0 = parse_core_list("2-5");
  EXPECT_EQ(place_rank(cpu, 1, 2, 0.5, node0).cores, range(4, 5));
}

TEST(Placement, ParseCoreList) {
  EXPECT_EQ(parse_core_list("0-3,8,10-11"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_core_list("5,1,1"), (std::vector<int>{1, 5}));
  for (const char* bad : {"", "a", "3-1", "1,,2", "-2", "1-", "1 2", "0x3", "0-99999999"})
    EXPECT_THROW(parse_core_list(bad), Error) << bad;
}

TEST(Topology, CudaVisibleDevicesSelectsAndOrdersGpus) {
  const Topology topo = gh200_box();
  EXPECT_EQ(visible_gpus(topo.gpus, nullptr).size(), 4u);
  const auto two = visible_gpus(topo.gpus, "3,1");
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].numa_node, 3);
  EXPECT_EQ(two[1].numa_node, 1);
  EXPECT_EQ(visible_gpus(topo.gpus, "1,7,0").size(), 1u);  // CUDA stops at an index that does not exist
  EXPECT_TRUE(visible_gpus(topo.gpus, "").empty());
  EXPECT_THROW(visible_gpus(topo.gpus, "GPU-8f6c0a7e"), Error);
}

TEST(Topology, XmlRoundTripGivesTheSamePlacement) {
  const std::string description = "pack:2 numa:1 core:6 pu:2";
  const std::string path = temp_xml("roundtrip");
  export_synthetic_xml(description, path);
  const Topology direct = topology_from_synthetic(description);
  const Topology loaded = topology_from_xml(path);
  std::filesystem::remove(path);
  ASSERT_EQ(loaded.numa_nodes.size(), direct.numa_nodes.size());
  for (int ranks : {1, 2, 4, 8})
    for (int r = 0; r < ranks; ++r) {
      const RankPlacement a = place_rank(direct, r, ranks, 0.8), b = place_rank(loaded, r, ranks, 0.8);
      EXPECT_EQ(a.numa_node, b.numa_node);
      EXPECT_EQ(a.cores, b.cores);
      EXPECT_EQ(a.split.optimizer, b.split.optimizer);
    }
}

TEST(Topology, ThisMachineHasCoresOnEveryNode) {
  const Topology topo = topology_of_this_machine();
  ASSERT_FALSE(topo.numa_nodes.empty());
  for (const NumaNode& n : topo.numa_nodes) {
    EXPECT_FALSE(n.cores.empty());
    for (int c : n.cores) EXPECT_TRUE(std::binary_search(n.cpus.begin(), n.cpus.end(), c));
  }
}

}  // namespace
}  // namespace so
