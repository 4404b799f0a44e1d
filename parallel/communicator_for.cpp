#include "parallel/communicator.h"
#include "so/backend/backend.h"
#include "so/core/error.h"
#ifdef SO_HAVE_CUDA
#include "parallel/nccl_communicator.h"
#endif

namespace so {

std::unique_ptr<Communicator> communicator_for(const Backend& backend, std::unique_ptr<Communicator> mpi) {
  if (backend.device_is_host()) return mpi;
#ifdef SO_HAVE_CUDA
  return make_nccl_communicator(std::move(mpi));
#else
  SO_FAIL("backend '", backend.name(), "' keeps device memory but this build has no NCCL communicator");
#endif
}

}  // namespace so
