// AdamW on the device, bit for bit optim::adamw_reference: the same constants (derived on the host
// by optim::adam_constants, bias corrections in double), the same operation order, and every
// operation an explicitly rounded intrinsic, because nvcc would otherwise contract a*b+c into an FMA
// and round once where the reference rounds twice. (IEEE division and square root also hold
// without the intrinsics unless --use_fast_math; spelling them out keeps the file flag-proof.)
// This is what lets the on-device optimizer and the CPU-offloaded GraceAdam produce the same weights.
#include "cuda_bf16.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_launch.cuh"

namespace so::cuda {

namespace {

// The constants the step uses, passed by value as a kernel argument.
struct StepConstants {
  float step_size, bc2_sqrt, decay, beta2, one_minus_b1, one_minus_b2, eps, grad_scale;
};

template <typename G, typename O, int N>
__global__ void adamw_kernel(float* p, float* m, float* v, const G* grad, O* out, int64_t n, StepConstants c) {
  for (int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * N; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x * N) {
    float pv[N], mv[N], vv[N], gv[N];
    load_f32<N>(pv, p, i, n);
    load_f32<N>(mv, m, i, n);
    load_f32<N>(vv, v, i, n);
    load_f32<N>(gv, grad, i, n);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      // Line by line the reference:
      //   g = grad * grad_scale;  pi = p * decay;  mi = m + (1-b1) * (g - m);
      //   vi = b2 * v + (1-b2) * g * g;  denom = sqrt(vi) / bc2_sqrt + eps;  pi -= step_size * (mi / denom)
      const float g = __fmul_rn(gv[k], c.grad_scale);
      const float pi = __fmul_rn(pv[k], c.decay);
      const float mi = __fadd_rn(mv[k], __fmul_rn(c.one_minus_b1, __fsub_rn(g, mv[k])));
      const float vi = __fadd_rn(__fmul_rn(c.beta2, vv[k]), __fmul_rn(__fmul_rn(c.one_minus_b2, g), g));
      const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.bc2_sqrt), c.eps);
      pv[k] = __fsub_rn(pi, __fmul_rn(c.step_size, __fdiv_rn(mi, denom)));
      mv[k] = mi;
      vv[k] = vi;
    }
    store_f32<N>(p, pv, i, n);
    store_f32<N>(m, mv, i, n);
    store_f32<N>(v, vv, i, n);
    if (out != nullptr) store_f32<N>(out, pv, i, n);
  }
}

}  // namespace

void launch_adamw(cudaStream_t stream, float* p, float* m, float* v, const void* grad, DType grad_dt, void* out,
                  DType out_dt, int64_t n, const optim::AdamConstants& c) {
  if (n == 0) return;
  const StepConstants k{c.step_size, c.bc2_sqrt,     c.decay, c.beta2,
                        c.one_minus_b1, c.one_minus_b2, c.eps,   c.grad_scale};
  const bool wide = aligned16(p) && aligned16(m) && aligned16(v) && aligned16(grad) && aligned16(out);
  dispatch_dtype(grad_dt, [&](auto g) {
    dispatch_dtype(out_dt, [&](auto o) {
      using G = decltype(g);
      using O = decltype(o);
      // Groups of 8: 32 bytes of each fp32 array, 16 of a bf16 one.
      with_vector_width<8>(wide, [&](auto vw) {
        constexpr int N = decltype(vw)::value;
        adamw_kernel<G, O, N><<<grid_for_elements(n, N), kBlockThreads, 0, stream>>>(
            p, m, v, static_cast<const G*>(grad), static_cast<O*>(out), n, k);
        SO_CUDA_CHECK(cudaGetLastError());
      });
    });
  });
}

}  // namespace so::cuda
