# The NCCL communicator: tests/mpi/test_collectives.cpp built against NCCL and the CUDA backend.
# One rank: each test its own ctest case (runs on a 1-GPU machine). 2 and 4 ranks: the whole
# binary under mpirun, as gpu.nccl_collectives_np<N>. Without a GPU per rank every test skips
# with the message matched below, and ctest reports the case as skipped.
so_add_gtest(test_nccl_collectives LABELS gpu SOURCES ${PROJECT_SOURCE_DIR}/tests/mpi/test_collectives.cpp)
target_compile_definitions(test_nccl_collectives PRIVATE SO_TEST_NCCL=1)

foreach(np 2 4)
  add_test(NAME gpu.nccl_collectives_np${np}
           COMMAND ${MPIEXEC_BIN} --oversubscribe -np ${np} $<TARGET_FILE:test_nccl_collectives>)
  set_tests_properties(gpu.nccl_collectives_np${np} PROPERTIES LABELS "gpu;mpi" ENVIRONMENT "${SO_MPI_TEST_ENV}"
                       TIMEOUT 300 SKIP_REGULAR_EXPRESSION "NCCL test skipped:")
endforeach()
