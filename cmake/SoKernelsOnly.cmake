# SO_KERNELS_ONLY: the dependencies of so_core + so_optim + test_grace_adam and nothing else, so
# the optimizer kernels build for another architecture (tests/cross/run_aarch64_tests.sh) without
# MPI, HDF5, BLAS or hwloc for it. GoogleTest is built from Debian's source package
# (/usr/src/googletest) because libgtest-dev ships host binaries only.
find_package(Threads REQUIRED)
set(SO_GTEST_SOURCE_DIR /usr/src/googletest/googletest CACHE PATH "GoogleTest sources (Debian: googletest)")
if(NOT EXISTS ${SO_GTEST_SOURCE_DIR}/CMakeLists.txt)
  message(FATAL_ERROR "SO_KERNELS_ONLY needs the GoogleTest sources in ${SO_GTEST_SOURCE_DIR} (Debian: googletest)")
endif()
set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
add_subdirectory(${SO_GTEST_SOURCE_DIR} ${CMAKE_BINARY_DIR}/googletest EXCLUDE_FROM_ALL)
target_compile_options(gtest PRIVATE -w)  # third-party code: GCC 12 false positives (-Wrestrict) are not ours
