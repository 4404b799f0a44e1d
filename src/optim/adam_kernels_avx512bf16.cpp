// AVX-512 kernels with vcvtneps2bf16 for the bf16 stores (see adam_kernels_avx512.h for how it
// differs from so::f32_to_bf16 on subnormals).
#include "adam_kernels_avx512.h"
#include "adam_kernels_isa.h"

namespace so::optim {

const AdamKernels& avx512bf16_adam_kernels() {
  static const AdamKernels k = make_adam_kernels<Avx512<true>>(SimdIsa::Avx512Bf16);
  return k;
}

}  // namespace so::optim
