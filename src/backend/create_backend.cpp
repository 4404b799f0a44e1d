#include "cpu/cpu_backend.h"
#include "so/backend/backend.h"
#include "so/core/error.h"

namespace so {

// The CUDA backend registers itself here once it exists; until then "cuda" is refused by name.
std::unique_ptr<Backend> create_backend(const BackendOptions& opts) {
  if (opts.type == "cpu" || opts.type == "auto") return std::make_unique<cpu::CpuBackend>(opts);
  SO_FAIL("backend '", opts.type, "' is not available in this build (available: cpu)");
}

}  // namespace so
