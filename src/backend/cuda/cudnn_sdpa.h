#pragma once
// Causal grouped-query attention, optionally with a sliding window (the diagonal band's left
// bound), per-sequence lengths (cuDNN's padding mask), documents as ragged sequences and sink
// logits, through cuDNN's fused flash SDPA (the cuDNN frontend's graph API), bf16, forward and
// backward, in the layouts of Ops::attention_forward/backward: q/out/dout/dq [B*S, Hq*D],
// k/v/dk/dv [B*S, Hkv*D], lse fp32 [B, Hq, S] (ragged: token-major [B*S, Hq], see SdpaShape).
// cuDNN's softmax stats are the natural-log log-sum-exp of each scaled, masked score row (the
// sink's logit included) — what our flash kernels store — so `lse` means the same whichever
// implementation wrote it. Masks beyond these and rows that see no key are cudnn_attention.h's.
//
// cuDNN is loaded at run time (the frontend's dynamic loading): a machine without it, or with one
// too old, is told so by check_support and falls back, and nothing here links against it. The
// frontend's headers stay inside cudnn_sdpa.cpp (they bring their own JSON serialisers).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace so::cuda {

struct SdpaShape {
  int64_t B = 0, S = 0, Hq = 0, Hkv = 0, D = 0;
  float scale = 0.0f;
  int64_t window = 0;  // sliding window (AttentionMask::window), 0 = causal only
  // Per-sequence lengths (seq_len_q, seq_len_kv; cuDNN's padding mask): a sequence's queries see
  // keys below its key length only. Without `sequences`, the B rows are the sequences.
  bool lengths = false;
  // Ragged (> 0; with lengths): this many sequences of at most `longest` tokens each, placed on
  // the B*S token axis by offsets (the THD layout: ours is already token-major), stats token-major
  // [B*S, Hq]. A graph is built per (sequences, longest), so callers round them up to few values.
  int64_t sequences = 0, longest = 0;
  bool sinks = false;  // the forward takes one fp32 sink logit per query head
};

// The device tensors of one call (forward: q, k, v, out, stats; backward: all but sinks), the
// lengths with `lengths` ([sequences or B] int32) and the offsets when ragged ([sequences + 1]
// int64 element offsets of each sequence's first token).
struct SdpaTensors {
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  void* out = nullptr;
  float* stats = nullptr;
  const void* dout = nullptr;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;
  const int32_t *seq_q = nullptr, *seq_kv = nullptr;
  const int64_t *offset_q = nullptr, *offset_kv = nullptr, *offset_stats = nullptr;
  const float* sinks = nullptr;  // [Hq]
};

// The shape rules of cuDNN's fused kernels (bf16, D a multiple of 8 up to 256, Hq a multiple of
// Hkv, S >= 2; ragged: D a multiple of 16), without a GPU; "" when they hold, else why not.
std::string cudnn_sdpa_shape_refusal(const SdpaShape& s);

// One cuDNN handle (of the device current at construction) and the graphs built for it, one per
// shape and direction, built on first use and kept: building costs milliseconds to a few hundred,
// executing microseconds. Calls are serialised (the handle's stream is set per call).
class CudnnSdpa {
 public:
  // deterministic_backward: cuDNN's backward without atomics (bitwise repeatable; on Hopper from
  // cuDNN 9.25 its ordered-dQ path, B*Hq*S*D*4 bytes of workspace, before that about B*Hq*S^2*2,
  // see backward_workspace).
  explicit CudnnSdpa(bool deterministic_backward);
  ~CudnnSdpa();
  CudnnSdpa(const CudnnSdpa&) = delete;
  CudnnSdpa& operator=(const CudnnSdpa&) = delete;

  // "" when cuDNN is loaded, new enough for this GPU, and builds both graphs of the shape; else
  // the reason (the library missing, the version, the engine's refusal).
  std::string check_support(const SdpaShape& s);
  std::string version() const;  // of the loaded cuDNN, e.g. "9.13.0"
  bool deterministic_backward() const { return deterministic_; }

  size_t forward_workspace(const SdpaShape& s);
  size_t backward_workspace(const SdpaShape& s);
  void forward(cudaStream_t stream, const SdpaShape& s, const SdpaTensors& t, void* workspace);
  // dq, dk, dv are overwritten where cuDNN computes them (every row of a sequence).
  void backward(cudaStream_t stream, const SdpaShape& s, const SdpaTensors& t, void* workspace);

 private:
  struct Impl;
  bool deterministic_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace so::cuda
