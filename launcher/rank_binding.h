#pragma once
// so_train's binding step, run by every rank before training: find this rank's place on its
// node, read the node's topology, place and bind the rank, and describe the outcome in one line.
// train() then splits whatever cores the process is bound to (process_cores()), so the compute
// stream and the optimizer pool follow the binding without knowing about it.
#include <string>
#include <vector>

namespace so {

enum class BindMode { Auto, None };

struct BindOptions {
  BindMode mode = BindMode::Auto;  // None: leave the process as launched (no topology read at all)
  std::vector<int> core_list;      // --bind-core-list: hand out these CPUs instead of the topology's
};

// From so_train's --bind and --bind-core-list ("" when not given).
BindOptions parse_bind_options(const std::string& mode, const std::string& core_list);

struct RankBinding {
  std::string description;  // the one line below
  int gpu = -1;             // CUDA device of this rank (-1: none placed)
};

// backend: the run's backend type. GPUs are paired with ranks for "cuda", and for "auto" when
// every local rank can have one; "cpu" places ranks as if the node had no GPU.
// optimizer_fraction: cpuadam_cores_perc, or 0 when the run has no optimizer pool (no offload).
// Collective over MPI_COMM_WORLD. The description reads e.g.
//   rank 1/2 host gh01 (local 1/2): gpu 1 (0019:01:00.0), numa node 1, cores 72-143
//   (compute 72-78, optimizer 79-143), bound
// With --bind none no topology is read: backend "cuda" drives the local rank's GPU (torchrun's
// LOCAL_RANK), "auto" and "cpu" none.
RankBinding bind_this_rank(const BindOptions& opts, const std::string& backend, double optimizer_fraction);

}  // namespace so
