#pragma once
// What the launcher asks MPI before training: this rank's place in the job and on its node,
// from MPI itself (a shared-memory split of MPI_COMM_WORLD), so mpirun, srun --mpi=pmix and
// sbatch need no wrapper exporting LOCAL_RANK. Uses MPI directly: it runs before the training
// communicator exists. Both calls are collective over MPI_COMM_WORLD.
#include <string>
#include <vector>

namespace so {

struct NodeRanks {
  int rank = 0, size = 1;              // in MPI_COMM_WORLD
  int local_rank = 0, local_size = 1;  // among the ranks on this node, ordered by world rank
};
NodeRanks node_ranks();

// Rank 0 receives every rank's `text`, in rank order; the other ranks get an empty vector.
std::vector<std::string> gather_at_root(const std::string& text);

}  // namespace so
