#include "cuda_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "cuda_attention.h"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "cudnn_attention.h"
#include "cuda_gemm.h"
#include "cuda_grouped_gemm.h"
#include "cuda_kernels.h"
#include "cuda_stream.h"
#include "src/optim/adam_constants.h"

namespace so::cuda {

CudaOps::CudaOps(CudaBackend& backend, CublasLtGemm& gemm, DeviceError* device_error, const std::string& attention,
                 bool deterministic_attention)
    : backend_(backend),
      gemm_(gemm),
      device_error_(device_error),
      attention_mode_(attention),
      deterministic_attention_(deterministic_attention) {}  // attention: checked with the config (run_config.cpp)

CudaOps::~CudaOps() = default;

void* CudaOps::grown(DeviceBuffer& buf, Stream& s, size_t bytes, const char* tag) {
  if (buf.bytes() < bytes) {
    if (buf) backend_.release_after(std::move(buf), s);  // kernels already enqueued on s may still use it
    buf = backend_.alloc_uninitialized(bytes, tag);
  }
  return buf.data();
}

void* CudaOps::scratch(Stream& s, size_t bytes) {
  return grown(scratch_[static_cast<int>(s.kind())], s, bytes, "ops scratch");
}

void* CudaOps::attention_workspace(Stream& s, size_t bytes) {
  return grown(attention_workspace_[static_cast<int>(s.kind())], s, bytes, "attention workspace");
}

void CudaOps::gemm(Stream& s, const Gemm& g) {
  gemm_.gemm(raw(s), g.trans_a, g.trans_b, g.M, g.N, g.K, g.alpha, g.A, g.B, g.ab, g.beta, g.C, g.c);
}

void CudaOps::embedding_forward(Stream& s, const EmbeddingShape& e, void* out, const void* table,
                                const int32_t* tokens) {
  launch_embedding_forward(raw(s), out, table, tokens, e.T, e.V, e.H, e.dtype, device_error_);
}

void CudaOps::embedding_backward(Stream& s, const EmbeddingShape& e, void* dtable_acc, const void* dout,
                                 const int32_t* tokens, int64_t padding_idx) {
  const size_t bytes = embedding_backward_workspace_bytes(e.T, e.V);
  launch_embedding_backward(raw(s), dtable_acc, dout, tokens, e.T, e.V, e.H, padding_idx, e.dtype, device_error_,
                            scratch(s, bytes), bytes);
}

void CudaOps::rmsnorm_forward(Stream& s, const RmsNormShape& n, void* out, float* rstd, const void* x, const void* w) {
  launch_rmsnorm_forward(raw(s), out, rstd, x, w, n.rows, n.dim, n.eps, n.dtype);
}

void CudaOps::rmsnorm_backward(Stream& s, const RmsNormShape& n, const RmsNormGrads& g, const void* dout, const void* x,
                               const void* w, const float* rstd) {
  const size_t bytes = rmsnorm_backward_workspace_bytes(n.rows, n.dim);
  launch_rmsnorm_backward(raw(s), g.dx, g.dw_acc, dout, x, w, rstd, n.rows, n.dim, g.accumulate, n.dtype,
                          scratch(s, bytes), bytes);
}

void CudaOps::rope(Stream& s, const Rope& r, void* x, bool inverse) {
  launch_rope(raw(s), x, r.positions, r.T, r.heads, r.head_dim, r.inv_freq, r.attention_scale, inverse, r.dtype);
}

const CudaOps::AttentionChoice& CudaOps::attention_choice(const AttentionShape& a, const AttentionMask& mask,
                                                          DType dt) {
  std::lock_guard<std::mutex> lock(attention_mu_);
  const bool documents = mask.doc_start != nullptr, padded = mask.key_end != nullptr, sinks = mask.sinks != nullptr,
             dropout = mask.dropout.p > 0.0f;
  uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &a.scale, sizeof scale_bits);
  const auto key =
      std::tuple{a.B, a.S, a.Hq, a.Hkv, a.D, scale_bits, documents, padded, mask.window, sinks, dropout, dt};
  if (auto it = attention_choices_.find(key); it != attention_choices_.end()) return it->second;
  const char* forced = std::getenv("SO_ATTENTION_KERNEL");  // a flash variant forced (tests, benchmarks)
  const std::string flash = "flash kernels (ours)";
  std::string why;
  if (attention_mode_ == "flash" || (forced != nullptr && *forced != '\0')) {
    why = attention_mode_ == "flash" ? "backend.attention is flash" : "SO_ATTENTION_KERNEL is set";
  } else {
    if (!cudnn_) cudnn_ = std::make_unique<CudnnAttention>(deterministic_attention_, device_error_);
    why = cudnn_->refusal(a, mask, dt);
    if (why.empty()) {
      // Held for the whole run (attention_workspace): one that cannot fit the pool is refused here,
      // named, rather than failing at the first backward.
      const MemoryStats m = backend_.memory_stats();
      const size_t ws = cudnn_->workspace_bytes(a, mask);
      if (m.capacity > 0 && ws > m.capacity - std::min(m.capacity, m.in_use))
        why = str_cat("its workspace of ", ws >> 20, " MiB does not fit the ",
                      (m.capacity - std::min(m.capacity, m.in_use)) >> 20, " MiB left of the device pool");
    }
    if (why.empty() && deterministic_attention_ && attention_mode_ == "auto") {
      // The deterministic backward's workspace grows as S^2 on Hopper: past a share of the
      // device, the flash kernels (deterministic and O(S)) serve instead.
      size_t free_bytes = 0, total_bytes = 0;
      SO_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
      const size_t ws = cudnn_->cudnn_backward_workspace(a, mask);
      if (ws > total_bytes / kDeterministicAttentionShare)
        why = str_cat("cuDNN's deterministic backward needs ", ws >> 20, " MiB of workspace at S=", a.S,
                      " (backend.deterministic_attention=false runs cuDNN's backward with atomics)");
    }
  }
  AttentionChoice c;
  if (why.empty()) {
    c.cudnn = true;
    const std::string parts = CudnnAttention::mask_text(mask);
    c.description =
        str_cat("cuDNN ", cudnn_->version(), " fused SDPA (", deterministic_attention_ ? "deterministic" : "atomic",
                " backward", parts.empty() ? std::string() : ", " + parts, ")");
  } else {
    SO_CHECK(attention_mode_ != "cudnn", "backend.attention is cudnn, but cuDNN cannot take attention over ", a.text(),
             " ", dtype_name(dt), ": ", why);
    c.description = str_cat(flash, " — not cuDNN: ", why);
  }
  return attention_choices_.emplace(key, std::move(c)).first->second;
}

std::string CudaOps::attention_implementation(const AttentionShape& a, const AttentionMask& mask, DType dt) {
  return attention_choice(a, mask, dt).description;
}

size_t CudaOps::attention_workspace_bytes(const AttentionShape& a, const AttentionMask& mask, DType dt) {
  if (!attention_choice(a, mask, dt).cudnn) return attention_backward_workspace_bytes(a, dt);
  return cudnn_->workspace_bytes(a, mask);
}

void CudaOps::attention_forward(Stream& s, const AttentionShape& a, const AttentionMask& mask,
                                const AttentionInputs& in, TensorView out, TensorView lse) {
  const DType dt = check_attention_tensors("attention_forward", a, in, out, lse, ConstTensorView{});
  if (attention_choice(a, mask, dt).cudnn) {
    cudnn_->forward(raw(s), a, mask, in, out.data, static_cast<float*>(lse.data),
                    attention_workspace(s, cudnn_->forward_workspace(a, mask)));
    return;
  }
  cuda::attention_forward(raw(s), a, mask, in, out.data, static_cast<float*>(lse.data));
}

void CudaOps::attention_backward(Stream& s, const AttentionShape& a, const AttentionMask& mask,
                                 const AttentionInputs& in, ConstTensorView out, ConstTensorView lse,
                                 ConstTensorView dout, const AttentionGrads& g) {
  const DType dt = check_attention_tensors("attention_backward", a, in, out, lse, dout);
  check_attention_grads("attention_backward", a, mask, g, dt);
  const auto* lse_data = static_cast<const float*>(lse.data);
  if (attention_choice(a, mask, dt).cudnn) {
    cudnn_->backward(raw(s), a, mask, in, out.data, lse_data, dout.data, g,
                     attention_workspace(s, cudnn_->backward_workspace(a, mask)));
    return;
  }
  // rowsum(dout * out) in fp32, B*Hq*S floats.
  const size_t bytes = attention_backward_workspace_bytes(a, dt);
  cuda::attention_backward(raw(s), a, mask, in, out.data, lse_data, dout.data, g,
                           AttentionWorkspace{attention_workspace(s, bytes), bytes});
}

void CudaOps::swiglu_forward(Stream& s, void* out, const void* gate, const void* up, int64_t n, DType dt) {
  launch_swiglu_forward(raw(s), out, gate, up, n, dt);
}

void CudaOps::swiglu_rows_forward(Stream& s, void* out, const void* gate_up, int64_t rows, int64_t cols, DType dt) {
  launch_swiglu_rows_forward(raw(s), out, gate_up, rows, cols, dt);
}

void CudaOps::swiglu_rows_backward(Stream& s, void* dgate_up, const void* dout, const void* gate_up, int64_t rows,
                                   int64_t cols, DType dt) {
  launch_swiglu_rows_backward(raw(s), dgate_up, dout, gate_up, rows, cols, dt);
}

void CudaOps::dropout_add(Stream& s, void* x, const void* y, int64_t rows, int64_t cols, const DropoutMask& m,
                          DType dt) {
  launch_dropout_add(raw(s), x, y, rows, cols, m, dt);
}

void CudaOps::dropout_backward(Stream& s, void* dy, const void* dx, int64_t rows, int64_t cols, const DropoutMask& m,
                               DType dt) {
  launch_dropout_backward(raw(s), dy, dx, rows, cols, m, dt);
}

void CudaOps::swiglu_backward(Stream& s, void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                              int64_t n, DType dt) {
  launch_swiglu_backward(raw(s), dgate, dup, dout, gate, up, n, dt);
}

void CudaOps::cross_entropy(Stream& s, const CrossEntropyLoss& c, float* loss_acc, void* dlogits, const float* logits,
                            const int32_t* targets) {
  const size_t bytes = cross_entropy_workspace_bytes(c.rows);
  launch_cross_entropy(raw(s), loss_acc, dlogits, logits, targets, c.rows, c.V, c.scale, c.z_loss, c.dtype,
                       device_error_, scratch(s, bytes), bytes);
}

void CudaOps::moe_route(Stream& s, const MoeRouting& r, float* weights, int32_t* experts, const float* logits,
                        int64_t T) {
  SO_CHECK(r.experts > 0 && r.top_k > 0 && r.top_k <= r.experts, "moe: top_k (", r.top_k,
           ") must be in [1, experts = ", r.experts, "]");
  launch_moe_route(raw(s), r, weights, experts, logits, T);
}

void CudaOps::moe_route_backward(Stream& s, const MoeRouting& r, float* dlogits, const float* dweights,
                                 const float* logits, const int32_t* experts, const float* aux_dprob, int64_t T) {
  launch_moe_route_backward(raw(s), r, dlogits, dweights, logits, experts, aux_dprob, T);
}

void CudaOps::moe_sort_slots(Stream& s, int32_t* slot_of, int32_t* row_of, int32_t* offsets, const int32_t* experts,
                             int64_t T, int64_t k, int64_t E) {
  launch_moe_sort_slots(raw(s), slot_of, row_of, offsets, experts, T, k, E, scratch(s, E * sizeof(int32_t)));
}

void CudaOps::moe_dispatch(Stream& s, const MoeSlots& m, void* dst, const void* x, const int32_t* slot_of) {
  launch_moe_dispatch(raw(s), dst, x, slot_of, m.T, m.k, m.H, m.dtype);
}

void CudaOps::moe_combine(Stream& s, const MoeSlots& m, void* out, const void* y, const float* weights,
                          const int32_t* row_of, bool accumulate) {
  launch_moe_combine(raw(s), out, y, weights, row_of, m.T, m.k, m.H, accumulate, m.dtype);
}

void CudaOps::moe_combine_backward(Stream& s, const MoeSlots& m, void* dy, float* dweights, const void* dout,
                                   const void* y, const float* weights, const int32_t* slot_of) {
  launch_moe_combine_backward(raw(s), dy, dweights, dout, y, weights, slot_of, m.T, m.k, m.H, m.dtype);
}

// Our kernels, the group offsets read on the device (cuda_grouped_gemm.h): no host round trip.
void CudaOps::grouped_gemm(Stream& s, const GroupedGemm& g) {
  const size_t bytes = grouped_gemm_workspace_bytes(g);
  launch_grouped_gemm(raw(s), g, bytes > 0 ? scratch(s, bytes) : nullptr, device_error_);
}

void CudaOps::moe_expert_stats(Stream& s, int64_t* counts_acc, double* tokens, double* probs, const float* logits,
                               const int32_t* offsets, int64_t T, int64_t E) {
  launch_moe_expert_stats(raw(s), counts_acc, tokens, probs, logits, offsets, T, E,
                          probs != nullptr ? scratch(s, moe_expert_stats_workspace_bytes(T)) : nullptr);
}

void CudaOps::moe_aux_loss(Stream& s, const MoeAuxLoss& a, float* loss_acc, float* dprob, double* tokens,
                           double* probs) {
  launch_moe_aux_loss(raw(s), a, loss_acc, dprob, tokens, probs);
}

void CudaOps::clamped_swiglu_forward(Stream& s, void* out, const void* gate_up, int64_t n, float alpha, float limit,
                                     DType dt) {
  launch_clamped_swiglu_forward(raw(s), out, gate_up, n, alpha, limit, dt);
}

void CudaOps::clamped_swiglu_backward(Stream& s, void* dgate_up, const void* dout, const void* gate_up, int64_t n,
                                      float alpha, float limit, DType dt) {
  launch_clamped_swiglu_backward(raw(s), dgate_up, dout, gate_up, n, alpha, limit, dt);
}

void CudaOps::sum_squares(Stream& s, float* out_acc, const void* x, int64_t n, DType dt) {
  const size_t bytes = sum_squares_workspace_bytes(n);
  launch_sum_squares(raw(s), out_acc, x, n, dt, scratch(s, bytes), bytes);
}

void CudaOps::sum_in_order(Stream& s, double* rank_sum, const float* bucket_sums, int64_t n) {
  launch_sum_in_order(raw(s), rank_sum, bucket_sums, n);
}

void CudaOps::clip_decision(Stream& s, ClipDecision* out, const double* rank_sums, int ranks, float max_norm) {
  launch_clip_decision(raw(s), out, rank_sums, ranks, max_norm);
}

void CudaOps::cast(Stream& s, void* dst, DType dst_dt, const void* src, DType src_dt, int64_t n) {
  launch_cast(raw(s), dst, dst_dt, src, src_dt, n);
}

void CudaOps::copy_columns(Stream& s, void* dst, int64_t dst_stride, const void* src, int64_t src_stride, int64_t rows,
                           int64_t cols, DType dt) {
  if (rows == 0 || cols == 0) return;
  const size_t e = dtype_size(dt);
  SO_CUDA_CHECK(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_stride) * e, src, static_cast<size_t>(src_stride) * e,
                                  static_cast<size_t>(cols) * e, static_cast<size_t>(rows), cudaMemcpyDeviceToDevice,
                                  raw(s)));
}

void CudaOps::transpose_blocks(Stream& s, void* dst, const void* src, int64_t d0, int64_t d1, int64_t inner, DType dt) {
  launch_transpose_blocks(raw(s), dst, src, d0, d1, inner, dt);
}

void CudaOps::replicate_heads(Stream& s, const HeadReplication& h, void* out, const void* in, bool reverse) {
  launch_replicate_heads(raw(s), out, in, h.rows, h.heads, h.copies, h.head_dim, reverse, h.dtype);
}

void CudaOps::adam(Stream& s, AdamCall call, const AdamArrays& a, int64_t n, const AdamWParams& hp, float final_scale,
                   const float* guard, const ClipDecision* decision) {
  // The reference's own constants (derived on the host as torch derives them), so the device's
  // calls equal the host kernels bit for bit.
  launch_adam(raw(s), call, a, n, optim::adam_constants(hp), final_scale, guard, decision);
}

}  // namespace so::cuda
