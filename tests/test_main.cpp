// gtest main shared by all test binaries: MPI is initialised because the engine's communicator
// is MPI even on one rank.
#include <gtest/gtest.h>

#include "parallel/communicator.h"

int main(int argc, char** argv) {
  so::MpiSession mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
