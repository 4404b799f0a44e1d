#pragma once
// The compute ops the model and the engine need, enqueued on a stream. Pointers are backend
// ("device") memory. Activations and weights use the model's storage dtype `dt`; statistics
// kept for backward (rstd, lse) and loss accumulators are always fp32; token ids and positions
// are int32. Every op computes in fp32 whatever the storage dtype.
//
// Gradient outputs named d*_acc are accumulated into (+=); others are overwritten unless an
// explicit `accumulate` flag says otherwise. This lets weight gradients accumulate over layers
// (tied embeddings) and micro-batches without extra buffers.
#include <cstdint>

#include "so/core/dtype.h"
#include "so/optim/adamw.h"

namespace so {

class Stream;

// Which keys a query of attention_forward/backward sees, beyond causal (key j <= query i, both
// indices within a row of S tokens). Every field is optional; all unset is plain causal.
struct AttentionMask {
  // Packed rows: [B*S] int32 (backend memory), per token the index within its row of the first
  // token of its document; key j is visible to query i only when doc_start[i] <= j. Documents are
  // contiguous: doc_start[0] = 0 and doc_start[i] is doc_start[i-1] or i (the model checks this
  // on the host; the kernels rely on it to skip tiles).
  const int32_t* doc_start = nullptr;
  // Sliding window (> 0): key j is visible to query i only when i - j < window, transformers'
  // `kv_idx > q_idx - sliding_window` (masking_utils.sliding_window_overlay): window keys per row,
  // the query's own included. 0 = no window.
  int64_t window = 0;
  // GPT-OSS attention sinks: [Hq] learned logits (dtype dt, backend memory), one extra column per
  // head in every row's softmax that takes probability mass and attends to nothing.
  const void* sinks = nullptr;
};

// Refuses doc_start [B*S] (host memory) that breaks AttentionMask's contract, naming row and token.
void check_attention_doc_start(const int32_t* doc_start, int64_t B, int64_t S);

// The three AdamW calls of speculation-then-validation (optim::AdamKernels): a step, its undo,
// and its undo followed by a step with another grad_scale, in one pass.
enum class AdamCall { Step, Rollback, Redo };

class Ops {
 public:
  virtual ~Ops() = default;

  // C[M,N] = alpha * op(A) @ op(B) + beta * C; row-major; op(X) = X^T when trans_X.
  // A and B share dtype `ab`; C has dtype `c` (fp32 C with bf16 inputs is allowed).
  virtual void gemm(Stream& s, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const void* A, const void* B, DType ab, float beta, void* C, DType c) = 0;

  // out[T,H] = table[tokens[t], :]. Token ids outside [0, V) are an error.
  virtual void embedding_forward(Stream& s, void* out, const void* table, const int32_t* tokens, int64_t T,
                                 int64_t V, int64_t H, DType dt) = 0;
  // dtable_acc[tokens[t], :] += dout[t, :] for every token but padding_idx (-1: none), whose row
  // gets no gradient from the lookup (torch's nn.Embedding padding_idx).
  virtual void embedding_backward(Stream& s, void* dtable_acc, const void* dout, const int32_t* tokens, int64_t T,
                                  int64_t V, int64_t H, int64_t padding_idx, DType dt) = 0;

  // out = x * rstd * w over the last dim; rstd[rows] (fp32) saved for backward.
  virtual void rmsnorm_forward(Stream& s, void* out, float* rstd, const void* x, const void* w, int64_t rows,
                               int64_t dim, float eps, DType dt) = 0;
  // dx (+= when accumulate), dw_acc +=.
  virtual void rmsnorm_backward(Stream& s, void* dx, void* dw_acc, const void* dout, const void* x, const void* w,
                                const float* rstd, int64_t rows, int64_t dim, bool accumulate, DType dt) = 0;

  // In-place rotary embedding (Hugging Face "rotate_half" convention) on x[T, heads, head_dim]
  // at positions[T]: pair i turns by positions[t] * inv_freq[i] (fp64 [head_dim / 2], backend
  // memory; angles in double), cos and sin multiplied by attention_scale (yarn; else 1).
  // inverse = true applies the transpose (the backward pass).
  virtual void rope(Stream& s, void* x, const int32_t* positions, int64_t T, int64_t heads, int64_t head_dim,
                    const double* inv_freq, float attention_scale, bool inverse, DType dt) = 0;

  // Causal grouped-query attention over B sequences of S tokens, computed tile by tile (memory
  // O(S)), narrowed by `mask` (AttentionMask). q/out: [B*S, Hq*D]; k, v: [B*S, Hkv*D]; lse:
  // [B, Hq, S] fp32 saved for backward (the log-sum-exp of each row's softmax, sink included).
  virtual void attention_forward(Stream& s, void* out, float* lse, const void* q, const void* k, const void* v,
                                 int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t D, float scale,
                                 const AttentionMask& mask, DType dt) = 0;
  // Which implementation attention_forward/backward use for this shape and kind of mask (which of
  // its fields are set; the pointers are not read), and why (printed at start-up).
  virtual std::string attention_implementation(int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t D,
                                               const AttentionMask& mask, DType dt) = 0;
  // The most device memory attention_forward/backward draw from the pool at once for this shape
  // and kind of mask (the memory planner's term).
  virtual size_t attention_workspace_bytes(int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t D,
                                           const AttentionMask& mask, DType dt) = 0;
  // dq, dk, dv are overwritten; dsinks_acc [Hq] (dt; only with mask.sinks) is accumulated into.
  virtual void attention_backward(Stream& s, void* dq, void* dk, void* dv, const void* dout, const void* q,
                                  const void* k, const void* v, const void* out, const float* lse, int64_t B,
                                  int64_t S, int64_t Hq, int64_t Hkv, int64_t D, float scale,
                                  const AttentionMask& mask, void* dsinks_acc, DType dt) = 0;

  // out = silu(gate) * up, elementwise over n.
  virtual void swiglu_forward(Stream& s, void* out, const void* gate, const void* up, int64_t n, DType dt) = 0;
  virtual void swiglu_backward(Stream& s, void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                               int64_t n, DType dt) = 0;

  // Cross-entropy over one chunk of rows of fp32 logits[rows, V], with OLMo's z-loss (z_loss x
  // logsumexp^2 per row, 0 = off): loss_acc += sum_t scale * (nll_t + z_loss * lse_t^2); when
  // dlogits is non-null it receives scale * (softmax * (1 + 2 z_loss lse) - onehot) in dtype dt.
  // Targets < 0 are ignored (padding: no loss, no z-loss); targets >= V are an error.
  virtual void cross_entropy(Stream& s, float* loss_acc, void* dlogits, const float* logits, const int32_t* targets,
                             int64_t rows, int64_t V, float scale, float z_loss, DType dt) = 0;

  // out_acc += sum(x^2) in fp32 (non-finite inputs make it non-finite).
  virtual void sum_squares(Stream& s, float* out_acc, const void* x, int64_t n, DType dt) = 0;

  virtual void cast(Stream& s, void* dst, DType dst_dt, const void* src, DType src_dt, int64_t n) = 0;

  // dst[j][i][:] = src[i][j][:] for src [d0][d1][inner]: the packing around Ulysses all-to-alls.
  virtual void transpose_blocks(Stream& s, void* dst, const void* src, int64_t d0, int64_t d1, int64_t inner,
                                DType dt) = 0;
  // GQA heads for more sequence-parallel ranks than KV heads. Forward: out[r][h*copies + c][:] =
  // in[r][h][:] over rows x heads x head_dim. reverse: out[r][h][:] = sum_c in[r][h*copies + c][:]
  // (the gradient), accumulated in fp32.
  virtual void replicate_heads(Stream& s, void* out, const void* in, int64_t rows, int64_t heads, int64_t copies,
                               int64_t head_dim, bool reverse, DType dt) = 0;

  // AdamW on the n fp32 master weights and moments of `a` (backend memory; optim::adamw_reference
  // and optim::AdamKernels semantics, bit for bit), writing the new weights to a.out (dtype
  // a.out_dt) in the same pass; with a snapshot in `a`, a step saves the old state there and
  // rollback / redo start from it. final_scale is a redo's grad_scale. With `guard` (a bucket's sum
  // of squared gradients, written earlier in stream order) the call does nothing when *guard is
  // not finite: a non-finite gradient is never applied, so it never has to be undone.
  virtual void adam(Stream& s, AdamCall call, const AdamArrays& a, int64_t n, const AdamWParams& hp,
                    float final_scale = 1.0f, const float* guard = nullptr) = 0;
};

}  // namespace so
