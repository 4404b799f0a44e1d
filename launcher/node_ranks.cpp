#include "launcher/node_ranks.h"

#include <mpi.h>

#include <numeric>

#include "so/core/error.h"

namespace so {

namespace {
void mpi_check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  SO_FAIL("MPI call failed: ", call, ": ", std::string(msg, static_cast<size_t>(len)));
}
}  // namespace

NodeRanks node_ranks() {
  NodeRanks r;
  mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &r.rank), "MPI_Comm_rank");
  mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &r.size), "MPI_Comm_size");
  MPI_Comm node = MPI_COMM_NULL;
  mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, r.rank, MPI_INFO_NULL, &node),
            "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
  const int rank_rc = MPI_Comm_rank(node, &r.local_rank);
  const int size_rc = MPI_Comm_size(node, &r.local_size);
  MPI_Comm_free(&node);
  mpi_check(rank_rc, "MPI_Comm_rank(node)");
  mpi_check(size_rc, "MPI_Comm_size(node)");
  return r;
}

std::vector<std::string> gather_at_root(const std::string& text) {
  int rank = 0, size = 1;
  mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
  mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");
  int len = static_cast<int>(text.size());
  std::vector<int> lens(rank == 0 ? static_cast<size_t>(size) : 0), offsets(lens.size());
  mpi_check(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Gather(lengths)");
  if (rank == 0) std::exclusive_scan(lens.begin(), lens.end(), offsets.begin(), 0);
  std::string all(rank == 0 ? static_cast<size_t>(std::accumulate(lens.begin(), lens.end(), 0)) : 0, '\0');
  mpi_check(MPI_Gatherv(text.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(), MPI_CHAR, 0, MPI_COMM_WORLD),
            "MPI_Gatherv(texts)");
  std::vector<std::string> texts;
  for (size_t i = 0; i < lens.size(); ++i)
    texts.push_back(all.substr(static_cast<size_t>(offsets[i]), static_cast<size_t>(lens[i])));
  return texts;
}

}  // namespace so
