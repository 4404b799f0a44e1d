#pragma once
// Ops of the CUDA backend: each call enqueues on the given stream's cudaStream_t. GEMMs go to
// cuBLASLt (CublasLtGemm), attention to cuDNN's fused SDPA (cudnn_sdpa.h) or our flash kernels
// (cuda_attention.h) per BackendOptions::attention, everything
// else to the kernels of cuda_kernels.h. Bad token ids / targets are recorded in device_error and
// raised by the backend at synchronisation.
#include <array>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "cuda_device_error.h"
#include "so/backend/backend.h"
#include "so/backend/ops.h"

namespace so::cuda {

class CublasLtGemm;
class CudaBackend;
class CudnnAttention;

class CudaOps final : public Ops {
 public:
  // device_error: a device-visible pointer into host-mapped memory owned by the backend.
  // attention, deterministic_attention: BackendOptions'.
  CudaOps(CudaBackend& backend, CublasLtGemm& gemm, DeviceError* device_error, const std::string& attention,
          bool deterministic_attention);
  ~CudaOps() override;

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
  void cast(Stream& s, void* dst, DType dst_dt, const void* src, DType src_dt, int64_t n) override;
  void copy_columns(Stream& s, void* dst, int64_t dst_stride, const void* src, int64_t src_stride, int64_t rows,
                    int64_t cols, DType dt) override;
  void transpose_blocks(Stream& s, void* dst, const void* src, int64_t d0, int64_t d1, int64_t inner,
                        DType dt) override;
  void replicate_heads(Stream& s, const HeadReplication& h, void* out, const void* in, bool reverse) override;
  void adam(Stream& s, AdamCall call, const AdamArrays& a, int64_t n, const AdamWParams& hp, float final_scale,
            const float* guard, const ClipDecision* decision) override;

 private:
  // At least `bytes` of buf for kernels enqueued on s: kept between calls (no allocation, no host
  // callback per op), grown when too small (the old one released in stream order), never zeroed.
  // Streams run concurrently, so each buffer serves one stream kind; ops on one stream must be
  // issued from one host thread at a time (as for any stream-ordered use).
  void* grown(DeviceBuffer& buf, Stream& s, size_t bytes, const char* tag);
  // The small reductions' scratch.
  void* scratch(Stream& s, size_t bytes);
  // Attention's (cuDNN's up to B*Hq*S^2*2 bytes, our backward's B*Hq*S*4): one per stream, kept,
  // so however far the host runs ahead only one is alive — the planner's single term
  // (attention_workspace_bytes). A per-call allocation would leave one alive per queued call.
  void* attention_workspace(Stream& s, size_t bytes);

  // Attention by cuDNN's fused SDPA (cudnn_attention.h) or our flash kernels, decided per shape
  // and kind of mask (documents, padding, window, sinks, dropout) on first use and kept, so that a
  // forward and its backward agree.
  struct AttentionChoice {
    bool cudnn = false;
    std::string description;  // what runs, and why when it is not cuDNN
  };
  const AttentionChoice& attention_choice(const AttentionShape& a, const AttentionMask& mask, DType dt);

  CudaBackend& backend_;
  CublasLtGemm& gemm_;
  DeviceError* device_error_;
  std::array<DeviceBuffer, kNumStreamKinds> scratch_, attention_workspace_;
  std::string attention_mode_;  // auto | cudnn | flash
  bool deterministic_attention_;
  std::unique_ptr<CudnnAttention> cudnn_;
  std::mutex attention_mu_;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, uint32_t, bool, bool, int64_t, bool, bool, DType>,
           AttentionChoice>
      attention_choices_;
};

}  // namespace so::cuda
