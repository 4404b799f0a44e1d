// gtest main shared by all test binaries: MPI is initialised because the engine's communicator
// is MPI even on one rank.
#include <gtest/gtest.h>

#include <cstdio>

#include "parallel/communicator.h"
#include "so/core/error.h"

namespace {

// Under mpirun a rank that fails an assertion may skip a collective its peers are already in:
// end the whole job at the first failure (after gtest has printed it) instead of hanging.
class AbortJobOnFailure : public ::testing::EmptyTestEventListener {
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] test failed: aborting the job so that no rank waits for this one\n",
                 so::error_rank());
    std::fflush(stdout);
    std::fflush(stderr);
    so::MpiSession::abort_job(1);
  }
};

}  // namespace

int main(int argc, char** argv) {
  so::MpiSession mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (mpi.world_size() > 1) ::testing::UnitTest::GetInstance()->listeners().Append(new AbortJobOnFailure);
  return RUN_ALL_TESTS();
}
