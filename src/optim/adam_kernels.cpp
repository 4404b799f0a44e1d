#include "so/optim/adam_kernels.h"

#include <algorithm>

#include "adam_kernels_isa.h"
#include "so/core/error.h"

namespace so {

const AdamKernels& adam_kernels(SimdIsa isa) {
  SO_CHECK(simd_isa_supported(isa), "AdamW kernels for '", simd_isa_name(isa),
           "' cannot run here (not built for this architecture, or this CPU lacks the instructions)");
  switch (isa) {
    case SimdIsa::Scalar: return optim::scalar_adam_kernels();
#if defined(__x86_64__)
    case SimdIsa::Avx2: return optim::avx2_adam_kernels();
    case SimdIsa::Avx512: return optim::avx512_adam_kernels();
    case SimdIsa::Avx512Bf16: return optim::avx512bf16_adam_kernels();
#elif defined(__aarch64__)
    case SimdIsa::Neon: return optim::neon_adam_kernels();
    case SimdIsa::Sve: return optim::sve_adam_kernels();
#endif
    default: SO_FAIL("no AdamW kernels compiled for '", simd_isa_name(isa), "'");
  }
}

const char* stream_probe_name(StreamProbe kind) {
  switch (kind) {
    case StreamProbe::Plain: return "plain";
    case StreamProbe::Prefetch: return "prefetch";
    case StreamProbe::NonTemporal: return "nt";
  }
  return "?";
}

double sum_squares_chunked(const AdamKernels& k, const void* x, DType dt, int64_t n) {
  const auto* bytes = static_cast<const char*>(x);
  double total = 0.0;
  for (int64_t i = 0; i < n; i += kSumSquaresChunk)
    total += k.sum_squares(bytes + i * dtype_size(dt), dt, std::min(kSumSquaresChunk, n - i));
  return total;
}

}  // namespace so
