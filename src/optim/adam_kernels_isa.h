#pragma once
// One entry point per ISA kernel file; adam_kernels() picks among them. Each file is compiled
// under its own -m flags, so only call an entry after simd_isa_supported() said yes.
#include "so/optim/adam_kernels.h"

namespace so::optim {

const AdamKernels& scalar_adam_kernels();
#if defined(__x86_64__)
const AdamKernels& avx2_adam_kernels();
const AdamKernels& avx512_adam_kernels();
const AdamKernels& avx512bf16_adam_kernels();
#elif defined(__aarch64__)
const AdamKernels& neon_adam_kernels();
const AdamKernels& sve_adam_kernels();
#endif

}  // namespace so::optim
