#pragma once
// Ops::attention_forward/backward through cuDNN's fused SDPA (cudnn_sdpa.h) for every mask a
// fine-tuning row brings (AttentionMask), with our semantics exactly:
//   - padded rows: cuDNN's padding mask with seq_len_q = S (every query, padding ones included, is
//     computed) and seq_len_kv = key_end: keys from key_end on are hidden from every query, a
//     padding query sees the row's tokens (transformers' attention_mask = 0);
//   - packed documents: each document one of cuDNN's ragged sequences on the token axis (the THD
//     layout; ours is token-major already), lengths and offsets made on the device from doc_start
//     and key_end (cudnn_attention_kernels.h); the graph's sequence count and longest sequence are
//     the host's AttentionMask::documents / longest_document rounded up to a power of two, so a
//     run builds a few graphs, not one per batch;
//   - windows as cuDNN's diagonal band, top-left aligned in each sequence;
//   - sinks: cuDNN's sink token in the forward (its stats include the sink, as our lse does); the
//     sinks' gradient is ours (attention_sink_grad), the backward needs nothing more;
//   - rows that see no key (a document wholly in the padding, a window wholly past it): output 0
//     and lse the sink's logit or -inf, written after cuDNN; in backward cuDNN reads +inf for
//     them (probabilities 0) and their dq, and the padding keys' dk/dv, are zeroed after.
// Attention dropout is not taken (refusal): cuDNN draws its own Philox bits or reads a
// materialised [B, H, S, S] mask, and ours is a counter-based hash (dropout_mask.h).
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string>

#include "cuda_device_error.h"
#include "so/backend/ops.h"

namespace so::cuda {

class CudnnSdpa;
struct SdpaShape;

class CudnnAttention {
 public:
  // deterministic_backward: CudnnSdpa's. err: where a batch that breaks its mask's host-side
  // counts is recorded (cuda_device_error.h).
  CudnnAttention(bool deterministic_backward, DeviceError* err);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // "" when cuDNN takes attention of this shape and kind of mask (which fields are set), else why
  // not. Builds the graphs of the largest layout the kind can have.
  std::string refusal(const AttentionShape& a, const AttentionMask& kind, DType dt);
  std::string version() const;
  // What the description says beyond "cuDNN <version> fused SDPA": the mask's parts.
  static std::string mask_text(const AttentionMask& kind);

  // The most workspace a call of this shape and kind of mask draws (cuDNN's and ours).
  size_t workspace_bytes(const AttentionShape& a, const AttentionMask& kind);
  // The workspace of one call with this mask (its documents' counts decide the graph).
  size_t forward_workspace(const AttentionShape& a, const AttentionMask& mask);
  size_t backward_workspace(const AttentionShape& a, const AttentionMask& mask);
  // cuDNN's own deterministic backward workspace for this shape (the S^2 term on older Hopper).
  size_t cudnn_backward_workspace(const AttentionShape& a, const AttentionMask& kind);

  void forward(cudaStream_t stream, const AttentionShape& a, const AttentionMask& mask, const AttentionInputs& in,
               void* out, float* lse, void* workspace);
  void backward(cudaStream_t stream, const AttentionShape& a, const AttentionMask& mask, const AttentionInputs& in,
                const void* out, const float* lse, const void* dout, const AttentionGrads& g, void* workspace);

 private:
  std::unique_ptr<CudnnSdpa> sdpa_;
  DeviceError* err_;
};

}  // namespace so::cuda
