#pragma once
// Ops of the CPU backend: each call enqueues the matching kernel on the given stream's worker.
#include "so/backend/ops.h"

namespace so::cpu {

class CpuBackend;

class CpuOps final : public Ops {
 public:
  explicit CpuOps(CpuBackend& backend) : backend_(backend) {}

  void gemm(Stream& s, const Gemm& g) override;
  void embedding_forward(Stream& s, const EmbeddingShape& e, void* out, const void* table,
                         const int32_t* tokens) override;
  void embedding_backward(Stream& s, const EmbeddingShape& e, void* dtable_acc, const void* dout, const int32_t* tokens,
                          int64_t padding_idx) override;
  void rmsnorm_forward(Stream& s, const RmsNormShape& n, void* out, float* rstd, const void* x, const void* w) override;
  void rmsnorm_backward(Stream& s, const RmsNormShape& n, const RmsNormGrads& g, const void* dout, const void* x,
                        const void* w, const float* rstd) override;
  void rope(Stream& s, const Rope& r, void* x, bool inverse) override;
  void attention_forward(Stream& s, const AttentionShape& a, const AttentionMask& mask, const AttentionInputs& in,
                         TensorView out, TensorView lse) override;
  std::string attention_implementation(const AttentionShape& a, const AttentionMask& mask, DType dt) override;
  size_t attention_workspace_bytes(const AttentionShape& a, const AttentionMask& mask, DType dt) override;
  void attention_backward(Stream& s, const AttentionShape& a, const AttentionMask& mask, const AttentionInputs& in,
                          ConstTensorView out, ConstTensorView lse, ConstTensorView dout,
                          const AttentionGrads& g) override;
  void swiglu_forward(Stream& s, void* out, const void* gate, const void* up, int64_t n, DType dt) override;
  void dropout_add(Stream& s, void* x, const void* y, int64_t rows, int64_t cols, const DropoutMask& m,
                   DType dt) override;
  void dropout_backward(Stream& s, void* dy, const void* dx, int64_t rows, int64_t cols, const DropoutMask& m,
                        DType dt) override;
  void swiglu_backward(Stream& s, void* dgate, void* dup, const void* dout, const void* gate, const void* up, int64_t n,
                       DType dt) override;
  void swiglu_rows_forward(Stream& s, void* out, const void* gate_up, int64_t rows, int64_t cols, DType dt) override;
  void swiglu_rows_backward(Stream& s, void* dgate_up, const void* dout, const void* gate_up, int64_t rows,
                            int64_t cols, DType dt) override;
  void cross_entropy(Stream& s, const CrossEntropyLoss& c, float* loss_acc, void* dlogits, const float* logits,
                     const int32_t* targets) override;
  void moe_route(Stream& s, const MoeRouting& r, float* weights, int32_t* experts, const float* logits,
                 int64_t T) override;
  void moe_route_backward(Stream& s, const MoeRouting& r, float* dlogits, const float* dweights, const float* logits,
                          const int32_t* experts, const float* aux_dprob, int64_t T) override;
  void moe_sort_slots(Stream& s, int32_t* slot_of, int32_t* row_of, int32_t* offsets, const int32_t* experts, int64_t T,
                      int64_t k, int64_t E) override;
  void moe_dispatch(Stream& s, const MoeSlots& m, void* dst, const void* x, const int32_t* slot_of) override;
  void moe_combine(Stream& s, const MoeSlots& m, void* out, const void* y, const float* weights, const int32_t* row_of,
                   bool accumulate) override;
  void moe_combine_backward(Stream& s, const MoeSlots& m, void* dy, float* dweights, const void* dout, const void* y,
                            const float* weights, const int32_t* slot_of) override;
  void grouped_gemm(Stream& s, const GroupedGemm& g) override;
  void moe_expert_stats(Stream& s, int64_t* counts_acc, double* tokens, double* probs, const float* logits,
                        const int32_t* offsets, int64_t T, int64_t E) override;
  void moe_aux_loss(Stream& s, const MoeAuxLoss& a, float* loss_acc, float* dprob, double* tokens,
                    double* probs) override;
  void clamped_swiglu_forward(Stream& s, void* out, const void* gate_up, int64_t n, float alpha, float limit,
                              DType dt) override;
  void clamped_swiglu_backward(Stream& s, void* dgate_up, const void* dout, const void* gate_up, int64_t n, float alpha,
                               float limit, DType dt) override;
  void sum_squares(Stream& s, float* out_acc, const void* x, int64_t n, DType dt) override;
  void sum_in_order(Stream& s, double* rank_sum, const float* bucket_sums, int64_t n) override;
  void clip_decision(Stream& s, ClipDecision* out, const double* rank_sums, int ranks, float max_norm) override;
  void copy_columns(Stream& s, void* dst, int64_t dst_stride, const void* src, int64_t src_stride, int64_t rows,
                    int64_t cols, DType dt) override;
  void transpose_blocks(Stream& s, void* dst, const void* src, int64_t d0, int64_t d1, int64_t inner,
                        DType dt) override;
  void replicate_heads(Stream& s, const HeadReplication& h, void* out, const void* in, bool reverse) override;
  void cast(Stream& s, void* dst, DType dst_dt, const void* src, DType src_dt, int64_t n) override;
  void adam(Stream& s, AdamCall call, const AdamArrays& a, int64_t n, const AdamWParams& hp, float final_scale,
            const float* guard, const ClipDecision* decision) override;

 private:
  CpuBackend& backend_;
};

}  // namespace so::cpu
