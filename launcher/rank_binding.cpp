#include "launcher/rank_binding.h"

#include <unistd.h>

#include "launcher/binding.h"
#include "launcher/node_ranks.h"
#include "launcher/placement.h"
#include "launcher/topology.h"
#include "so/core/error.h"
#include "so/core/log.h"

namespace so {

namespace {

std::string host_name() {
  char buf[256] = {};
  return gethostname(buf, sizeof buf - 1) == 0 ? std::string(buf) : std::string("unknown-host");
}

std::string describe_split(const std::vector<int>& cores, double optimizer_fraction) {
  if (cores.empty()) return "no cores";
  if (optimizer_fraction <= 0) return str_cat("compute ", format_core_list(cores), ", no optimizer pool");
  const CoreSplit s = split_cores(cores, optimizer_fraction);
  return str_cat("compute ", format_core_list(s.compute), ", optimizer ", format_core_list(s.optimizer));
}

// The GPUs this run drives: see bind_this_rank.
void keep_gpus_for_backend(Topology& topo, const std::string& backend, int local_size) {
  const size_t n = topo.gpus.size();
  if (backend == "cpu" || (backend == "auto" && n < static_cast<size_t>(local_size))) {
    if (n > 0 && backend == "auto")
      log_warn(str_cat(local_size, " ranks on ", topo.host, " but ", n,
                       " GPUs: placing ranks as for the CPU backend (backend.type \"cuda\" makes this an error)"));
    topo.gpus.clear();
  }
}

}  // namespace

BindOptions parse_bind_options(const std::string& mode, const std::string& core_list) {
  BindOptions o;
  SO_CHECK(mode == "auto" || mode == "none", "--bind '", mode, "': choose auto or none");
  o.mode = mode == "none" ? BindMode::None : BindMode::Auto;
  SO_CHECK(core_list.empty() || o.mode == BindMode::Auto, "--bind-core-list needs --bind auto (got --bind none)");
  if (!core_list.empty()) o.core_list = parse_core_list(core_list);
  return o;
}

RankBinding bind_this_rank(const BindOptions& opts, const std::string& backend, double optimizer_fraction) {
  const NodeRanks nr = node_ranks();
  const std::string who = str_cat("rank ", nr.rank, "/", nr.size, " host ", host_name(), " (local ", nr.local_rank, "/",
                                  nr.local_size, "): ");
  if (opts.mode == BindMode::None) {
    const std::vector<int> cores = process_cores();
    return {str_cat(who, "gpu -, numa node -, cores ", format_core_list(cores), " (",
                    describe_split(cores, optimizer_fraction), "), not bound (--bind none)"),
            backend == "cuda" ? nr.local_rank : -1};
  }
  Topology topo = topology_of_this_machine();
  keep_gpus_for_backend(topo, backend, nr.local_size);
  const RankPlacement p = place_rank(topo, nr.local_rank, nr.local_size, optimizer_fraction, opts.core_list);
  const BindResult r = bind_process(p);
  const std::string gpu =
      p.gpu < 0 ? "none" : str_cat(p.gpu, " (", topo.gpus[static_cast<size_t>(p.gpu)].pci_bus_id, ")");
  std::string status = r.bound ? "bound" : "not bound: " + r.problem;
  if (p.shares_cores)
    status += str_cat(", sharing cores: ", p.ranks_on_node, " ranks on the ", p.cores_on_node, " cores of NUMA node ",
                      p.numa_node);
  return {str_cat(who, "gpu ", gpu, ", numa node ", p.numa_node, ", cores ", format_core_list(r.effective), " (",
                  describe_split(r.effective, optimizer_fraction), "), ", status),
          p.gpu};
}

}  // namespace so
