#pragma once
// SO_MPI_CHECK(call, context...): every MPI call is checked; the error names the call, the
// context given after it (collective, count, dtype, group) and, through SO_FAIL, the world rank.
#include <mpi.h>

#include <string>

#include "so/core/error.h"

namespace so {

inline std::string mpi_error_string(int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return std::string(msg, static_cast<size_t>(len));
}

}  // namespace so

#define SO_MPI_CHECK(call, ...)                                                      \
  do {                                                                               \
    const int so_mpi_rc_ = (call);                                                   \
    if (so_mpi_rc_ != MPI_SUCCESS)                                                   \
      SO_FAIL("MPI call failed: ", #call __VA_OPT__(, " (", __VA_ARGS__, ")"), ": ", \
              ::so::mpi_error_string(so_mpi_rc_));                                   \
  } while (0)
