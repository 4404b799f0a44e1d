#pragma once
// Synchronous CPU kernels behind the CPU backend's ops (which enqueue them on worker-thread
// streams). Templated on the storage type T (float or bf16); all arithmetic is fp32 or wider.
#include <cstdint>

#include "so/backend/dropout_mask.h"
#include "so/backend/ops.h"
#include "so/core/dtype.h"

namespace so::cpu {

// Calls f(T{}) with T the C++ storage type of dt.
template <typename F>
decltype(auto) dispatch_dtype(DType dt, F&& f) {
  if (dt == DType::F32) return f(float{});
  return f(bf16{});
}

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A, const void* B,
          DType ab, float beta, void* C, DType c);

template <typename T>
void embedding_forward(T* out, const T* table, const int32_t* tokens, int64_t T_, int64_t V, int64_t H);
template <typename T>
void embedding_backward(T* dtable, const T* dout, const int32_t* tokens, int64_t T_, int64_t V, int64_t H,
                        int64_t padding_idx);
template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* x, const T* w, int64_t rows, int64_t dim, float eps);
template <typename T>
void rmsnorm_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const float* rstd, int64_t rows, int64_t dim,
                      bool accumulate);
void transpose_blocks(void* dst, const void* src, int64_t d0, int64_t d1, size_t inner_bytes);
// row_bytes of each of rows rows, dst_pitch and src_pitch bytes apart (Ops::copy_columns).
void copy_columns(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, int64_t rows, size_t row_bytes);
template <typename T>
void replicate_heads(T* out, const T* in, int64_t rows, int64_t heads, int64_t copies, int64_t head_dim, bool reverse);
template <typename T>
void rope(T* x, const int32_t* positions, int64_t T_, int64_t heads, int64_t head_dim, const double* inv_freq,
          float attention_scale, bool inverse);
template <typename T>
void swiglu_forward(T* out, const T* gate, const T* up, int64_t n);
template <typename T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n);
template <typename T>
void dropout_add(T* x, const T* y, int64_t rows, int64_t cols, const DropoutMask& m);
template <typename T>
void dropout_backward(T* dy, const T* dx, int64_t rows, int64_t cols, const DropoutMask& m);
template <typename T>
void cross_entropy(float* loss_acc, T* dlogits, const float* logits, const int32_t* targets, int64_t rows, int64_t V,
                   float scale, float z_loss);
template <typename Dst, typename Src>
void cast(Dst* dst, const Src* src, int64_t n);

// Mixture of experts (cpu_moe_kernels.cpp); semantics in so/backend/ops.h.
void moe_route(float* weights, int32_t* experts, const float* logits, int64_t T, const MoeRouting& r);
void moe_route_backward(float* dlogits, const float* dweights, const float* logits, const int32_t* experts,
                        const float* aux_dprob, int64_t T, const MoeRouting& r);
void moe_sort_slots(int32_t* slot_of, int32_t* row_of, int32_t* offsets, const int32_t* experts, int64_t T, int64_t k,
                    int64_t E);
template <typename T>
void moe_dispatch(T* dst, const T* x, const int32_t* slot_of, int64_t T_, int64_t k, int64_t H);
template <typename T>
void moe_combine(T* out, const T* y, const float* weights, const int32_t* row_of, int64_t T_, int64_t k, int64_t H,
                 bool accumulate);
template <typename T>
void moe_combine_backward(T* dy, float* dweights, const T* dout, const T* y, const float* weights,
                          const int32_t* slot_of, int64_t T_, int64_t k, int64_t H);
void grouped_gemm(const GroupedGemm& g);
void moe_expert_stats(int64_t* counts_acc, double* tokens, double* probs, const float* logits, const int32_t* offsets,
                      int64_t T, int64_t E);
void moe_aux_loss(const MoeAuxLoss& a, float* loss_acc, float* dprob, double* tokens, double* probs);
template <typename T>
void clamped_swiglu_forward(T* out, const T* gate_up, int64_t n, float alpha, float limit);
template <typename T>
void clamped_swiglu_backward(T* dgate_up, const T* dout, const T* gate_up, int64_t n, float alpha, float limit);

template <typename T>
void attention_forward(T* out, float* lse, const T* q, const T* k, const T* v, const AttentionShape& sh,
                       const AttentionMask& mask);
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                        const float* lse, const AttentionShape& sh, const AttentionMask& mask, T* dsinks_acc);

}  // namespace so::cpu
