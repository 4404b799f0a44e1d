# Every external library so_train links, found the standard way. scripts/install-deps.sh installs them.
find_package(Threads REQUIRED)
find_package(MPI REQUIRED COMPONENTS C CXX)
find_package(PkgConfig REQUIRED)
pkg_check_modules(HWLOC REQUIRED IMPORTED_TARGET hwloc)
pkg_check_modules(NUMA REQUIRED IMPORTED_TARGET numa)
pkg_check_modules(RE2 REQUIRED IMPORTED_TARGET re2)  # linear-time regular expressions (train.weight_decay_exclude)
find_package(Boost 1.74 REQUIRED COMPONENTS program_options)
set(HDF5_PREFER_PARALLEL ON)
find_package(HDF5 REQUIRED COMPONENTS C)
if(NOT HDF5_IS_PARALLEL)
  message(FATAL_ERROR "so_train needs the parallel (MPI) build of HDF5 (Debian: libhdf5-openmpi-dev)")
endif()
find_package(nlohmann_json 3.10 REQUIRED)
find_package(GTest REQUIRED)
find_package(Protobuf 3.12 REQUIRED)  # TensorBoard event files (src/train/tensorboard_event.proto)

# OpenBLAS: the pthread build, deliberately. so_train's own threads (streams, optimizer pool) are
# std::threads; an OpenMP BLAS would add a second, competing OpenMP pool. The CPU backend sets
# the BLAS thread count explicitly at start-up.
find_package(OpenBLAS CONFIG REQUIRED
  PATHS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-pthread/cmake/openblas NO_DEFAULT_PATH)
add_library(so_openblas INTERFACE)
target_include_directories(so_openblas INTERFACE ${OpenBLAS_INCLUDE_DIRS})
target_link_libraries(so_openblas INTERFACE ${OpenBLAS_LIBRARIES})

add_library(so_hdf5 INTERFACE)
target_include_directories(so_hdf5 INTERFACE ${HDF5_C_INCLUDE_DIRS})
target_link_libraries(so_hdf5 INTERFACE ${HDF5_C_LIBRARIES} MPI::MPI_C)
target_compile_definitions(so_hdf5 INTERFACE ${HDF5_C_DEFINITIONS})

# CUDA: on by default when a toolkit is found (it compiles and links without a GPU).
if(SO_CUDA STREQUAL "AUTO")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(SO_CUDA ON)
  else()
    set(SO_CUDA OFF)
  endif()
endif()
if(SO_CUDA)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  set(CMAKE_CUDA_ARCHITECTURES ${SO_CUDA_ARCHS})
  set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 has no CUDA20 flags for nvcc
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  find_library(SO_CUDNN_LIB cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} REQUIRED)
  find_library(SO_NCCL_LIB nccl HINTS ${CUDAToolkit_LIBRARY_DIR} REQUIRED)
  find_path(SO_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} REQUIRED)
  # cuDNN's C++ frontend (fused attention): header-only, published on PyPI only;
  # scripts/install-deps.sh unpacks the pinned version under /opt.
  set(SO_CUDNN_FRONTEND_VERSION 1.32.0)
  find_path(CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h
            HINTS /opt/cudnn-frontend-${SO_CUDNN_FRONTEND_VERSION}/include ENV CUDNN_FRONTEND_INCLUDE_DIR)
  if(NOT CUDNN_FRONTEND_INCLUDE_DIR)
    message(FATAL_ERROR "cuDNN frontend headers not found: run scripts/install-deps.sh (it unpacks nvidia-cudnn-frontend "
                        "${SO_CUDNN_FRONTEND_VERSION} from PyPI into /opt), or pass -DCUDNN_FRONTEND_INCLUDE_DIR=DIR, or build "
                        "without CUDA (-DSO_CUDA=OFF)")
  endif()
  message(STATUS "so_train: CUDA backend ON (archs ${CMAKE_CUDA_ARCHITECTURES}, cudnn ${SO_CUDNN_LIB}, nccl ${SO_NCCL_LIB}, "
                 "cudnn frontend ${CUDNN_FRONTEND_INCLUDE_DIR})")
else()
  message(STATUS "so_train: CUDA backend OFF")
endif()
