// AVX-512 F+BW+VL kernels; bf16 rounding in integer arithmetic (see adam_kernels_avx512.h).
#include "adam_kernels_avx512.h"
#include "adam_kernels_isa.h"

namespace so::optim {

const AdamKernels& avx512_adam_kernels() {
  static const AdamKernels k = make_adam_kernels<Avx512<false>>(SimdIsa::Avx512);
  return k;
}

}  // namespace so::optim
