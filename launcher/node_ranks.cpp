#include "launcher/node_ranks.h"

#include <numeric>

#include "parallel/mpi_check.h"
#include "so/core/error.h"

namespace so {

NodeRanks node_ranks() {
  NodeRanks r;
  SO_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &r.rank));
  SO_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &r.size));
  MPI_Comm node = MPI_COMM_NULL;
  SO_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, r.rank, MPI_INFO_NULL, &node));
  const int rank_rc = MPI_Comm_rank(node, &r.local_rank);
  const int size_rc = MPI_Comm_size(node, &r.local_size);
  MPI_Comm_free(&node);
  SO_MPI_CHECK(rank_rc, "MPI_Comm_rank of the node communicator");
  SO_MPI_CHECK(size_rc, "MPI_Comm_size of the node communicator");
  return r;
}

std::vector<std::string> gather_at_root(const std::string& text) {
  int rank = 0, size = 1;
  SO_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  SO_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  int len = static_cast<int>(text.size());
  std::vector<int> lens(rank == 0 ? static_cast<size_t>(size) : 0), offsets(lens.size());
  SO_MPI_CHECK(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD));
  if (rank == 0) std::exclusive_scan(lens.begin(), lens.end(), offsets.begin(), 0);
  std::string all(rank == 0 ? static_cast<size_t>(std::accumulate(lens.begin(), lens.end(), 0)) : 0, '\0');
  SO_MPI_CHECK(
      MPI_Gatherv(text.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(), MPI_CHAR, 0, MPI_COMM_WORLD));
  std::vector<std::string> texts;
  for (size_t i = 0; i < lens.size(); ++i)
    texts.push_back(all.substr(static_cast<size_t>(offsets[i]), static_cast<size_t>(lens[i])));
  return texts;
}

}  // namespace so
