#include <cstdlib>

#include "cpu/cpu_backend.h"
#include "so/backend/backend.h"
#include "so/core/error.h"
#ifdef SO_HAVE_CUDA
#include "cuda/cuda_backend.h"
#include "cuda/cuda_cast.h"
#endif

namespace so {

// "auto" takes the GPU when this build has the CUDA backend and a device is visible.
std::unique_ptr<Backend> create_backend(const BackendOptions& opts) {
#ifdef SO_HAVE_CUDA
  const bool have_gpu = cuda::device_count() > 0;
  if (opts.type == "cuda" || (opts.type == "auto" && have_gpu)) {
    SO_CHECK(have_gpu, "backend 'cuda' requested but no CUDA device is visible (CUDA_VISIBLE_DEVICES='",
             std::getenv("CUDA_VISIBLE_DEVICES") ? std::getenv("CUDA_VISIBLE_DEVICES") : "", "')");
    return std::make_unique<cuda::CudaBackend>(opts);
  }
  if (opts.type == "cpu" || opts.type == "auto") return std::make_unique<cpu::CpuBackend>(opts);
  SO_FAIL("backend '", opts.type, "' is unknown (available: auto, cpu, cuda)");
#else
  if (opts.type == "cpu" || opts.type == "auto") return std::make_unique<cpu::CpuBackend>(opts);
  SO_FAIL("backend '", opts.type,
          "' is not available in this build (available: auto, cpu; configure with -DSO_CUDA=ON for cuda)");
#endif
}

}  // namespace so
