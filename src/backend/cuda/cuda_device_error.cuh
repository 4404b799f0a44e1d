#pragma once
// Kernel side of cuda_device_error.h: record the first bad input an op finds. The first error wins
// (atomicCAS on code); the fields are plain stores the host reads once the stream has synchronised.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_device_error.h"

namespace so::cuda {

__device__ __forceinline__ void report_device_error(DeviceError* err, DeviceErrorCode code, int64_t index,
                                                    int64_t value, int64_t limit) {
  if (err == nullptr) return;
  if (atomicCAS(&err->code, static_cast<int>(kDeviceErrorNone), static_cast<int>(code)) != kDeviceErrorNone) return;
  err->index = index;
  err->value = value;
  err->limit = limit;
  __threadfence_system();
}

}  // namespace so::cuda
