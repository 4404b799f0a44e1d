// AdamW on the device, bit for bit optim::adamw_reference and optim::AdamKernels (step, rollback,
// redo): the same constants (derived on the host by optim::adam_constants, as torch derives them),
// the same operation order, and every operation an explicitly rounded intrinsic: FMAs (__fmaf_rn)
// exactly where the host kernels have them and nowhere else, because nvcc would otherwise contract
// other a*b+c pairs. (IEEE division and square root also hold without the intrinsics unless
// --use_fast_math; spelling them out keeps the file flag-proof. The host's divide-free
// sqrt(v)/bc2_sqrt equals IEEE division, so __fdiv_rn matches it.) This is what lets the on-device
// optimizer and the CPU-offloaded GraceAdam produce the same weights, and a device bucket be
// speculated, redone and rolled back as the offloaded ones are.
#include "cuda_bf16.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_launch.cuh"

namespace so::cuda {

namespace {

// The constants the kernels use, passed by value as a kernel argument.
struct Consts {
  float neg_step_size, bc2_sqrt, decay, beta2, one_minus_b1, one_minus_b2, eps, grad_scale;
  float inv_decay, inv_beta1, inv_beta2, final_scale;
};

// The step's change of the decayed weight: (-step_size * m') / (sqrt(v')/bc2_sqrt + eps).
__device__ __forceinline__ float update(const Consts& c, float m1, float v1) {
  return __fdiv_rn(__fmul_rn(c.neg_step_size, m1), __fadd_rn(__fdiv_rn(__fsqrt_rn(v1), c.bc2_sqrt), c.eps));
}

// Line by line the reference:  pd = p * decay;  m' = fma(1-b1, g - m, m);  v' = fma((1-b2) g, g, v b2)
// p' = pd + update(m', v');  g already scaled.
__device__ __forceinline__ void step(const Consts& c, float g, float& p, float& m, float& v) {
  const float pd = __fmul_rn(p, c.decay);
  m = __fmaf_rn(c.one_minus_b1, __fsub_rn(g, m), m);
  v = __fmaf_rn(__fmul_rn(c.one_minus_b2, g), g, __fmul_rn(v, c.beta2));
  p = __fadd_rn(pd, update(c, m, v));
}

// AdamMath::undo_decayed: the state before a step with g, the weight still decayed.
__device__ __forceinline__ void undo_decayed(const Consts& c, float g, float& p, float& m, float& v) {
  const float pd = __fsub_rn(p, update(c, m, v));
  m = __fmul_rn(__fmaf_rn(-c.one_minus_b1, g, m), c.inv_beta1);
  const float v0 = __fmul_rn(__fmaf_rn(__fmul_rn(-c.one_minus_b2, g), g, v), c.inv_beta2);
  v = v0 > 0.0f ? v0 : 0.0f;  // max0: NaN -> +0, as the host's
  p = pd;
}

template <AdamCall kCall, bool kSnapshot, typename G, typename O, int N>
__global__ void adam_kernel(float* p, float* m, float* v, float* sp, float* sm, float* sv, const G* grad, O* out,
                            int64_t n, Consts c, const float* guard, const ClipDecision* decision) {
  if (guard != nullptr && !isfinite(*guard)) return;     // a non-finite bucket is never applied
  if (decision != nullptr && decision->skipped) return;  // decided on the device: a skipped step changes nothing
  [[maybe_unused]] const float grad_scale = decision != nullptr ? decision->clip_coef : c.grad_scale;
  for (int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * N; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x * N) {
    float pv[N], mv[N], vv[N], gv[N];
    // The state the call starts from: the snapshot for an exact rollback or redo, else in place.
    const bool from_snapshot = kSnapshot && kCall != AdamCall::Step;
    load_f32<N>(pv, from_snapshot ? sp : p, i, n);
    load_f32<N>(mv, from_snapshot ? sm : m, i, n);
    load_f32<N>(vv, from_snapshot ? sv : v, i, n);
    load_f32<N>(gv, grad, i, n);
    if constexpr (kSnapshot && kCall == AdamCall::Step) {
      store_f32<N>(sp, pv, i, n);
      store_f32<N>(sm, mv, i, n);
      store_f32<N>(sv, vv, i, n);
    }
#pragma unroll
    for (int k = 0; k < N; ++k) {
      if constexpr (kCall == AdamCall::Step) {
        step(c, __fmul_rn(gv[k], grad_scale), pv[k], mv[k], vv[k]);
      } else if constexpr (kCall == AdamCall::Rollback) {
        if constexpr (!kSnapshot) {
          undo_decayed(c, __fmul_rn(gv[k], grad_scale), pv[k], mv[k], vv[k]);
          pv[k] = __fmul_rn(pv[k], c.inv_decay);
        }
      } else if constexpr (kSnapshot) {  // redo from the snapshot: a step with the final scale
        step(c, __fmul_rn(gv[k], c.final_scale), pv[k], mv[k], vv[k]);
      } else {  // redo in place: p'' = (p' - update') + update'', never through 1/decay
        undo_decayed(c, __fmul_rn(gv[k], grad_scale), pv[k], mv[k], vv[k]);
        const float g = __fmul_rn(gv[k], c.final_scale);
        mv[k] = __fmaf_rn(c.one_minus_b1, __fsub_rn(g, mv[k]), mv[k]);
        vv[k] = __fmaf_rn(__fmul_rn(c.one_minus_b2, g), g, __fmul_rn(vv[k], c.beta2));
        pv[k] = __fadd_rn(pv[k], update(c, mv[k], vv[k]));
      }
    }
    store_f32<N>(p, pv, i, n);
    store_f32<N>(m, mv, i, n);
    store_f32<N>(v, vv, i, n);
    if (out != nullptr) store_f32<N>(out, pv, i, n);
  }
}

template <AdamCall kCall>
void launch(cudaStream_t stream, const AdamArrays& a, int64_t n, const Consts& k, const float* guard,
            const ClipDecision* decision) {
  const bool snapshot = a.has_snapshot();
  const bool wide = aligned16(a.p) && aligned16(a.m) && aligned16(a.v) && aligned16(a.grad) && aligned16(a.out) &&
                    (!snapshot || (aligned16(a.snapshot_p) && aligned16(a.snapshot_m) && aligned16(a.snapshot_v)));
  dispatch_dtype(a.grad_dt, [&](auto g) {
    dispatch_dtype(a.out_dt, [&](auto o) {
      using G = decltype(g);
      using O = decltype(o);
      // Groups of 8: 32 bytes of each fp32 array, 16 of a bf16 one.
      with_vector_width<8>(wide, [&](auto vw) {
        constexpr int N = decltype(vw)::value;
        auto run = [&](auto kernel) {
          kernel<<<grid_for_elements(n, N), kBlockThreads, 0, stream>>>(a.p, a.m, a.v, a.snapshot_p, a.snapshot_m,
                                                                        a.snapshot_v, static_cast<const G*>(a.grad),
                                                                        static_cast<O*>(a.out), n, k, guard, decision);
        };
        snapshot ? run(adam_kernel<kCall, true, G, O, N>) : run(adam_kernel<kCall, false, G, O, N>);
        SO_CUDA_CHECK(cudaGetLastError());
      });
    });
  });
}

}  // namespace

void launch_adam(cudaStream_t stream, AdamCall call, const AdamArrays& a, int64_t n, const optim::AdamConstants& c,
                 float final_scale, const float* guard, const ClipDecision* decision) {
  if (n == 0) return;
  const Consts k{c.neg_step_size, c.bc2_sqrt,   c.decay,     c.beta2,     c.one_minus_b1, c.one_minus_b2,
                 c.eps,           c.grad_scale, c.inv_decay, c.inv_beta1, c.inv_beta2,    final_scale};
  switch (call) {
    case AdamCall::Step: return launch<AdamCall::Step>(stream, a, n, k, guard, decision);
    case AdamCall::Rollback: return launch<AdamCall::Rollback>(stream, a, n, k, guard, decision);
    case AdamCall::Redo: return launch<AdamCall::Redo>(stream, a, n, k, guard, decision);
  }
}

}  // namespace so::cuda
