#pragma once
// SO_NCCL_CHECK(call, context...): every NCCL call is checked; the error names the call, the
// context given after it (collective, count, dtype, group and rank in it), NCCL's name for the
// result and NCCL's last error message (which says what actually went wrong: "Duplicate GPU
// detected", a socket error, ...) and, through SO_FAIL, the world rank.
#include <nccl.h>

#include <string>

#include "so/core/error.h"

namespace so {

inline std::string nccl_error_string(ncclResult_t rc) {
  std::string msg = ncclGetErrorString(rc);
  // NCCL's detail for the failure (it may be empty, or describe an earlier failure: context only).
  const char* last = ncclGetLastError(nullptr);
  if (last && *last) msg += str_cat(" (NCCL: ", last, ")");
  return msg;
}

}  // namespace so

#define SO_NCCL_CHECK(call, ...)                                                      \
  do {                                                                                \
    const ncclResult_t so_nccl_rc_ = (call);                                          \
    if (so_nccl_rc_ != ncclSuccess)                                                   \
      SO_FAIL("NCCL call failed: ", #call __VA_OPT__(, " (", __VA_ARGS__, ")"), ": ", \
              ::so::nccl_error_string(so_nccl_rc_));                                  \
  } while (0)
