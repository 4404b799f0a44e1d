#include "parallel/communicator.h"
#include "so/core/error.h"

namespace so {

ProcessGroups make_process_groups(std::unique_ptr<Communicator> world, int sp_size) {
  SO_CHECK(world, "make_process_groups needs the world communicator");
  const int ranks = world->size();
  SO_CHECK(sp_size >= 1, "sequence_parallel_size must be at least 1, got ", sp_size);
  SO_CHECK(ranks % sp_size == 0, "sequence_parallel_size ", sp_size, " does not divide the ", ranks,
           " ranks of the job");
  ProcessGroups g;
  g.sp_size = sp_size;
  g.dp_size = ranks / sp_size;
  g.dp_rank = world->rank() / sp_size;
  g.sp_rank = world->rank() % sp_size;
  // Same dp_rank: one sequence-parallel group of neighbours; same sp_rank: one data-parallel group.
  g.sp = world->split(g.dp_rank, g.sp_rank, "sp");
  g.dp = world->split(g.sp_rank, g.dp_rank, "dp");
  g.world = std::move(world);
  return g;
}

}  // namespace so
