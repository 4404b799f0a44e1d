#pragma once
// The NCCL implementation of Communicator, for the CUDA backend: buffer collectives run as NCCL
// kernels on the backend's CUDA streams, one ncclComm_t per process group.
#include <memory>

#include "parallel/communicator.h"

namespace so {

// Wraps `mpi`, an MPI-backed communicator of the same group: host-side calls (all_reduce_sum,
// barrier, split) go through it, and it bootstraps NCCL (rank 0's ncclUniqueId is broadcast over
// it). Collective over the group. This rank's GPU is the calling thread's current CUDA device,
// so create the CUDA backend (which selects it) first; attach() then takes that backend.
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> mpi);

}  // namespace so
