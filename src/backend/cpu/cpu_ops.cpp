#include "cpu_ops.h"

#include <cmath>
#include <vector>

#include "cpu_backend.h"
#include "cpu_kernels.h"
#include "so/optim/adam_kernels.h"

namespace so::cpu {

namespace {
// Typed views of the untyped op arguments, for the storage type T chosen by dispatch_dtype.
template <typename T>
T* typed(void* p) {
  return static_cast<T*>(p);
}
template <typename T>
const T* typed(const void* p) {
  return static_cast<const T*>(p);
}

// The optimizer kernels of this CPU (or SO_SIMD's), chosen once: they equal the scalar reference
// bit for bit, and sums of squares come out the same as GraceAdam's.
const AdamKernels& optimizer_kernels() {
  static const AdamKernels& k = adam_kernels(default_simd_isa());
  return k;
}
}  // namespace

#define SO_ENQUEUE(stream, body) CpuBackend::as_cpu(stream).enqueue([=] { body; })

void CpuOps::gemm(Stream& s, const Gemm& g) {
  SO_ENQUEUE(s, cpu::gemm(g.trans_a, g.trans_b, g.M, g.N, g.K, g.alpha, g.A, g.B, g.ab, g.beta, g.C, g.c));
}

void CpuOps::embedding_forward(Stream& s, const EmbeddingShape& e, void* out, const void* table,
                               const int32_t* tokens) {
  SO_ENQUEUE(s, dispatch_dtype(e.dtype, [&](auto t) {
               using X = decltype(t);
               cpu::embedding_forward(typed<X>(out), typed<X>(table), tokens, e.T, e.V, e.H);
             }));
}

void CpuOps::embedding_backward(Stream& s, const EmbeddingShape& e, void* dtable, const void* dout,
                                const int32_t* tokens, int64_t padding_idx) {
  SO_ENQUEUE(s, dispatch_dtype(e.dtype, [&](auto t) {
               using X = decltype(t);
               cpu::embedding_backward(typed<X>(dtable), typed<X>(dout), tokens, e.T, e.V, e.H, padding_idx);
             }));
}

void CpuOps::rmsnorm_forward(Stream& s, const RmsNormShape& n, void* out, float* rstd, const void* x, const void* w) {
  SO_ENQUEUE(s, dispatch_dtype(n.dtype, [&](auto t) {
               using X = decltype(t);
               cpu::rmsnorm_forward(typed<X>(out), rstd, typed<X>(x), typed<X>(w), n.rows, n.dim, n.eps);
             }));
}

void CpuOps::rmsnorm_backward(Stream& s, const RmsNormShape& n, const RmsNormGrads& g, const void* dout, const void* x,
                              const void* w, const float* rstd) {
  SO_ENQUEUE(s, dispatch_dtype(n.dtype, [&](auto t) {
               using X = decltype(t);
               cpu::rmsnorm_backward(typed<X>(g.dx), typed<X>(g.dw_acc), typed<X>(dout), typed<X>(x), typed<X>(w), rstd,
                                     n.rows, n.dim, g.accumulate);
             }));
}

void CpuOps::rope(Stream& s, const Rope& r, void* x, bool inverse) {
  SO_ENQUEUE(s, dispatch_dtype(r.dtype, [&](auto t) {
               using X = decltype(t);
               cpu::rope(typed<X>(x), r.positions, r.T, r.heads, r.head_dim, r.inv_freq, r.attention_scale, inverse);
             }));
}

std::string CpuOps::attention_implementation(const AttentionShape&, const AttentionMask&, DType) {
  return "CPU tiled attention (the reference)";
}

size_t CpuOps::attention_workspace_bytes(const AttentionShape&, const AttentionMask&, DType) { return 0; }

void CpuOps::attention_forward(Stream& s, const AttentionShape& a, const AttentionMask& mask, const AttentionInputs& in,
                               TensorView out, TensorView lse) {
  const DType dt = check_attention_tensors("attention_forward", a, in, out, lse, ConstTensorView{});
  SO_ENQUEUE(s, dispatch_dtype(dt, [&](auto t) {
               using X = decltype(t);
               cpu::attention_forward(typed<X>(out.data), static_cast<float*>(lse.data), typed<X>(in.q.data),
                                      typed<X>(in.k.data), typed<X>(in.v.data), a, mask);
             }));
}

void CpuOps::attention_backward(Stream& s, const AttentionShape& a, const AttentionMask& mask,
                                const AttentionInputs& in, ConstTensorView out, ConstTensorView lse,
                                ConstTensorView dout, const AttentionGrads& g) {
  const DType dt = check_attention_tensors("attention_backward", a, in, out, lse, dout);
  check_attention_grads("attention_backward", a, mask, g, dt);
  SO_ENQUEUE(s, dispatch_dtype(dt, [&](auto t) {
               using X = decltype(t);
               cpu::attention_backward(typed<X>(g.dq.data), typed<X>(g.dk.data), typed<X>(g.dv.data),
                                       typed<X>(dout.data), typed<X>(in.q.data), typed<X>(in.k.data),
                                       typed<X>(in.v.data), typed<X>(out.data), static_cast<const float*>(lse.data), a,
                                       mask, typed<X>(g.dsinks_acc.data));
             }));
}

void CpuOps::swiglu_forward(Stream& s, void* out, const void* gate, const void* up, int64_t n, DType dt) {
  SO_ENQUEUE(s, dispatch_dtype(dt, [&](auto t) {
               using X = decltype(t);
               cpu::swiglu_forward(typed<X>(out), typed<X>(gate), typed<X>(up), n);
             }));
}

void CpuOps::swiglu_backward(Stream& s, void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                             int64_t n, DType dt) {
  SO_ENQUEUE(s, dispatch_dtype(dt, [&](auto t) {
               using X = decltype(t);
               cpu::swiglu_backward(typed<X>(dgate), typed<X>(dup), typed<X>(dout), typed<X>(gate), typed<X>(up), n);
             }));
}

// Row by row: each row's gate and up are the two halves of its gate_up row.
void CpuOps::swiglu_rows_forward(Stream& s, void* out, const void* gate_up, int64_t rows, int64_t cols, DType dt) {
  SO_ENQUEUE(s, dispatch_dtype(dt, [&](auto t) {
               using X = decltype(t);
               for (int64_t r = 0; r < rows; ++r) {
                 const X* gu = typed<X>(gate_up) + r * 2 * cols;
                 cpu::swiglu_forward(typed<X>(out) + r * cols, gu, gu + cols, cols);
               }
             }));
}

void CpuOps::swiglu_rows_backward(Stream& s, void* dgate_up, const void* dout, const void* gate_up, int64_t rows,
                                  int64_t cols, DType dt) {
  SO_ENQUEUE(s, dispatch_dtype(dt, [&](auto t) {
               using X = decltype(t);
               for (int64_t r = 0; r < rows; ++r) {
                 const X* gu = typed<X>(gate_up) + r * 2 * cols;
                 X* dgu = typed<X>(dgate_up) + r * 2 * cols;
                 cpu::swiglu_backward(dgu, dgu + cols, typed<X>(dout) + r * cols, gu, gu + cols, cols);
               }
             }));
}

void CpuOps::dropout_add(Stream& s, void* x, const void* y, int64_t rows, int64_t cols, const DropoutMask& m,
                         DType dt) {
  SO_ENQUEUE(s, dispatch_dtype(dt, [&](auto t) {
               using X = decltype(t);
               cpu::dropout_add(typed<X>(x), typed<X>(y), rows, cols, m);
             }));
}

void CpuOps::dropout_backward(Stream& s, void* dy, const void* dx, int64_t rows, int64_t cols, const DropoutMask& m,
                              DType dt) {
  SO_ENQUEUE(s, dispatch_dtype(dt, [&](auto t) {
               using X = decltype(t);
               cpu::dropout_backward(typed<X>(dy), typed<X>(dx), rows, cols, m);
             }));
}

void CpuOps::cross_entropy(Stream& s, const CrossEntropyLoss& c, float* loss_acc, void* dlogits, const float* logits,
                           const int32_t* targets) {
  SO_ENQUEUE(s, dispatch_dtype(c.dtype, [&](auto t) {
               using X = decltype(t);
               cpu::cross_entropy(loss_acc, typed<X>(dlogits), logits, targets, c.rows, c.V, c.scale, c.z_loss);
             }));
}

void CpuOps::moe_route(Stream& s, const MoeRouting& r, float* weights, int32_t* experts, const float* logits,
                       int64_t T) {
  SO_ENQUEUE(s, cpu::moe_route(weights, experts, logits, T, r));
}

void CpuOps::moe_route_backward(Stream& s, const MoeRouting& r, float* dlogits, const float* dweights,
                                const float* logits, const int32_t* experts, const float* aux_dprob, int64_t T) {
  SO_ENQUEUE(s, cpu::moe_route_backward(dlogits, dweights, logits, experts, aux_dprob, T, r));
}

void CpuOps::moe_sort_slots(Stream& s, int32_t* slot_of, int32_t* row_of, int32_t* offsets, const int32_t* experts,
                            int64_t T, int64_t k, int64_t E) {
  SO_ENQUEUE(s, cpu::moe_sort_slots(slot_of, row_of, offsets, experts, T, k, E));
}

void CpuOps::moe_dispatch(Stream& s, const MoeSlots& m, void* dst, const void* x, const int32_t* slot_of) {
  SO_ENQUEUE(s, dispatch_dtype(m.dtype, [&](auto t) {
               using X = decltype(t);
               cpu::moe_dispatch(typed<X>(dst), typed<X>(x), slot_of, m.T, m.k, m.H);
             }));
}

void CpuOps::moe_combine(Stream& s, const MoeSlots& m, void* out, const void* y, const float* weights,
                         const int32_t* row_of, bool accumulate) {
  SO_ENQUEUE(s, dispatch_dtype(m.dtype, [&](auto t) {
               using X = decltype(t);
               cpu::moe_combine(typed<X>(out), typed<X>(y), weights, row_of, m.T, m.k, m.H, accumulate);
             }));
}

void CpuOps::moe_combine_backward(Stream& s, const MoeSlots& m, void* dy, float* dweights, const void* dout,
                                  const void* y, const float* weights, const int32_t* slot_of) {
  SO_ENQUEUE(s, dispatch_dtype(m.dtype, [&](auto t) {
               using X = decltype(t);
               cpu::moe_combine_backward(typed<X>(dy), dweights, typed<X>(dout), typed<X>(y), weights, slot_of, m.T,
                                         m.k, m.H);
             }));
}

void CpuOps::grouped_gemm(Stream& s, const GroupedGemm& g) {
  // The per-group matrices are the caller's host array: copied, the call runs later (and reads
  // the offsets then, in stream order).
  std::vector<void*> per_group;
  if (g.per_group) per_group.assign(g.per_group, g.per_group + g.groups);
  SO_ENQUEUE(s, {
    GroupedGemm call = g;
    if (call.per_group) call.per_group = per_group.data();
    cpu::grouped_gemm(call);
  });
}

void CpuOps::moe_expert_stats(Stream& s, int64_t* counts_acc, double* tokens, double* probs, const float* logits,
                              const int32_t* offsets, int64_t T, int64_t E) {
  SO_ENQUEUE(s, cpu::moe_expert_stats(counts_acc, tokens, probs, logits, offsets, T, E));
}

void CpuOps::moe_aux_loss(Stream& s, const MoeAuxLoss& a, float* loss_acc, float* dprob, double* tokens,
                          double* probs) {
  SO_ENQUEUE(s, cpu::moe_aux_loss(a, loss_acc, dprob, tokens, probs));
}

void CpuOps::clamped_swiglu_forward(Stream& s, void* out, const void* gate_up, int64_t n, float alpha, float limit,
                                    DType dt) {
  SO_ENQUEUE(s, dispatch_dtype(dt, [&](auto t) {
               using X = decltype(t);
               cpu::clamped_swiglu_forward(typed<X>(out), typed<X>(gate_up), n, alpha, limit);
             }));
}

void CpuOps::clamped_swiglu_backward(Stream& s, void* dgate_up, const void* dout, const void* gate_up, int64_t n,
                                     float alpha, float limit, DType dt) {
  SO_ENQUEUE(s, dispatch_dtype(dt, [&](auto t) {
               using X = decltype(t);
               cpu::clamped_swiglu_backward(typed<X>(dgate_up), typed<X>(dout), typed<X>(gate_up), n, alpha, limit);
             }));
}

void CpuOps::sum_squares(Stream& s, float* out_acc, const void* x, int64_t n, DType dt) {
  SO_ENQUEUE(s, *out_acc += static_cast<float>(sum_squares_chunked(optimizer_kernels(), x, dt, n)));
}

void CpuOps::sum_in_order(Stream& s, double* rank_sum, const float* bucket_sums, int64_t n) {
  SO_ENQUEUE(s, *rank_sum = so::sum_in_order(bucket_sums, n));
}

void CpuOps::clip_decision(Stream& s, ClipDecision* out, const double* rank_sums, int ranks, float max_norm) {
  SO_ENQUEUE(s, *out = decide_clip(rank_sums, ranks, max_norm));
}

void CpuOps::cast(Stream& s, void* dst, DType dst_dt, const void* src, DType src_dt, int64_t n) {
  SO_ENQUEUE(s, dispatch_dtype(dst_dt, [&](auto d) {
               dispatch_dtype(src_dt, [&](auto x) { cpu::cast(typed<decltype(d)>(dst), typed<decltype(x)>(src), n); });
             }));
}

void CpuOps::adam(Stream& s, AdamCall call, const AdamArrays& a, int64_t n, const AdamWParams& hp, float final_scale,
                  const float* guard, const ClipDecision* decision) {
  SO_ENQUEUE(s, {
    if (guard && !std::isfinite(*guard)) return;
    if (decision && decision->skipped) return;
    AdamWParams h = hp;
    if (decision) h.grad_scale = decision->clip_coef;
    const AdamKernels& k = optimizer_kernels();
    switch (call) {
      case AdamCall::Step: return k.step(a, n, h);
      case AdamCall::Rollback: return k.rollback(a, n, h);
      case AdamCall::Redo: return k.redo(a, n, h, final_scale);
    }
  });
}

void CpuOps::copy_columns(Stream& s, void* dst, int64_t dst_stride, const void* src, int64_t src_stride, int64_t rows,
                          int64_t cols, DType dt) {
  const size_t e = dtype_size(dt);
  SO_ENQUEUE(s, cpu::copy_columns(dst, dst_stride * e, src, src_stride * e, rows, cols * e));
}

void CpuOps::transpose_blocks(Stream& s, void* dst, const void* src, int64_t d0, int64_t d1, int64_t inner, DType dt) {
  const size_t inner_bytes = static_cast<size_t>(inner) * dtype_size(dt);
  SO_ENQUEUE(s, cpu::transpose_blocks(dst, src, d0, d1, inner_bytes));
}

void CpuOps::replicate_heads(Stream& s, const HeadReplication& h, void* out, const void* in, bool reverse) {
  SO_ENQUEUE(s, dispatch_dtype(h.dtype, [&](auto t) {
               using X = decltype(t);
               cpu::replicate_heads(typed<X>(out), typed<X>(in), h.rows, h.heads, h.copies, h.head_dim, reverse);
             }));
}

#undef SO_ENQUEUE

}  // namespace so::cpu
