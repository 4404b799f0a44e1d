#pragma once
// Ops::grouped_gemm's CUDA kernels (see GroupedGemm in so/backend/ops.h): the groups' row offsets
// are read on the device, so no size comes back to the host. One launch per call (vary_m: two, a
// one-block schedule of the groups' row tiles first, in `workspace`).
#include <cuda_runtime.h>

#include <cstddef>

#include "cuda_device_error.h"
#include "so/backend/ops.h"

namespace so::cuda {

// The per-group matrices travel in the kernel's parameters (8 KiB at the most).
constexpr int kMaxGroupedGemmGroups = 1024;

size_t grouped_gemm_workspace_bytes(const GroupedGemm& g);

// Offsets that decrease or pass g.max_rows are recorded in err (thrown at the next
// synchronisation) and read as empty groups.
void launch_grouped_gemm(cudaStream_t stream, const GroupedGemm& g, void* workspace, DeviceError* err);

}  // namespace so::cuda
