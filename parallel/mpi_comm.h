#pragma once
// The MPI communicator behind a Communicator, for MPI-aware libraries (parallel HDF5). Fails
// for communicators that are not MPI-backed.
#include <mpi.h>

#include "parallel/communicator.h"

namespace so {

MPI_Comm mpi_comm_of(const Communicator& comm);

}  // namespace so
