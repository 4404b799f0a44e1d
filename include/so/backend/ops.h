#pragma once
// The compute ops the model and the engine need, enqueued on a stream. Pointers are backend
// ("device") memory. Activations and weights use the model's storage dtype `dt`; statistics
// kept for backward (rstd, lse) and loss accumulators are always fp32; token ids and positions
// are int32. Every op computes in fp32 whatever the storage dtype.
//
// Gradient outputs named d*_acc are accumulated into (+=); others are overwritten unless an
// explicit `accumulate` flag says otherwise. This lets weight gradients accumulate over layers
// (tied embeddings) and micro-batches without extra buffers.
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "so/backend/dropout_mask.h"
#include "so/core/dtype.h"
#include "so/optim/adamw.h"
#include "so/optim/clip_decision.h"

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
  // Right padding: [B] int32 (backend memory), per row the index of its first padding token; keys
  // from there on are hidden from every query of the row (transformers' attention_mask = 0), so a
  // padding query i sees keys [first key, key_end - 1]. A query that sees no key at all (its
  // document starts in the padding, or the window lies wholly in it) outputs zero, with lse the
  // sink's logit or -inf. 1 <= key_end[b] <= S.
  const int32_t* key_end = nullptr;
  // Sliding window (> 0): key j is visible to query i only when i - j < window, transformers'
  // `kv_idx > q_idx - sliding_window` (masking_utils.sliding_window_overlay): window keys per row,
  // the query's own included. 0 = no window.
  int64_t window = 0;
  // GPT-OSS attention sinks: [Hq] learned logits (dtype dt, backend memory), one extra column per
  // head in every row's softmax that takes probability mass and attends to nothing.
  const void* sinks = nullptr;
  // Attention-probability dropout (training; p = 0: none): O_i = sum_j P_ij keep_ij / (1 - p) V_j
  // with P the undropped softmax (lse is P's). keep_ij = attention_dropout_keep (dropout_mask.h)
  // of sample dropout.first_sample + b, query i, key j, global head first_head + h (the other
  // DropoutMask fields are unused: attention sees whole sequences).
  DropoutMask dropout;
  int64_t first_head = 0;
  // Host-side facts about doc_start, for implementations that lay documents out as sequences of
  // their own (cuDNN's ragged layout sizes its launch by them): how many documents the batch has
  // (a row's padding tail belongs to its last document) and the longest, in tokens. Upper bounds
  // are enough; 0 = unknown (the most the shape allows is assumed, which costs launch overhead).
  int64_t documents = 0, longest_document = 0;
};

// The logical shape of a tensor an op reads or writes (row-major, up to 4 dimensions).
struct TensorShape {
  std::array<int64_t, 4> dims{};
  int rank = 0;
  TensorShape() = default;
  TensorShape(std::initializer_list<int64_t> d);
  int64_t numel() const;
  bool operator==(const TensorShape& o) const { return rank == o.rank && dims == o.dims; }
  std::string text() const;  // "[a, b, c]"
};

// A tensor in backend memory handed to an op: where it is, its storage dtype, its shape.
// TensorView is written (or read and written); ConstTensorView is only read.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::F32;
  TensorShape shape;
};
struct ConstTensorView {
  const void* data = nullptr;
  DType dtype = DType::F32;
  TensorShape shape;
  ConstTensorView() = default;
  ConstTensorView(const void* p, DType dt, TensorShape s) : data(p), dtype(dt), shape(s) {}
  // Implicit: a written view reads too.
  ConstTensorView(const TensorView& v) : data(v.data), dtype(v.dtype), shape(v.shape) {}
};

struct AttentionInputs {
  ConstTensorView q, k, v;
};
// The backward's outputs: dq, dk, dv overwritten; dsinks_acc [Hq] (dtype of q; only with
// mask.sinks, else empty) accumulated into.
struct AttentionGrads {
  TensorView dq, dk, dv, dsinks_acc;
};
// Causal grouped-query attention over B sequences of S tokens: Hq query heads, Hkv key/value
// heads (Hq a multiple of Hkv), head dimension D, scores scaled by `scale`. The layouts of its
// tensors: queries (q, out, dout, dq) [B*S, Hq*D], keys and values (k, v, dk, dv) [B*S, Hkv*D],
// the saved log-sum-exp [B, Hq, S] fp32.
struct AttentionShape {
  int64_t B = 0, S = 0, Hq = 0, Hkv = 0, D = 0;
  float scale = 0.0f;
  TensorShape queries() const { return {B * S, Hq * D}; }
  TensorShape keys() const { return {B * S, Hkv * D}; }
  TensorShape lse() const { return {B, Hq, S}; }
  std::string text() const;  // "B=.. S=.. Hq=.. Hkv=.. D=.."
  // Views in these layouts: a query-shaped tensor (out, dout), the lse, q/k/v, and the backward's
  // outputs (dsinks_acc [Hq], or none).
  TensorView query_view(void* p, DType dt) const { return {p, dt, queries()}; }
  TensorView lse_view(void* p) const { return {p, DType::F32, lse()}; }
  AttentionInputs inputs(DType dt, const void* q, const void* k, const void* v) const {
    return {{q, dt, queries()}, {k, dt, keys()}, {v, dt, keys()}};
  }
  AttentionGrads grads(DType dt, void* dq, void* dk, void* dv, void* dsinks_acc) const {
    return {{dq, dt, queries()},
            {dk, dt, keys()},
            {dv, dt, keys()},
            {dsinks_acc, dt, dsinks_acc != nullptr ? TensorShape{Hq} : TensorShape{}}};
  }
};
// Refuses views whose pointer is null, dtype differs from q's or shape from `a`'s layouts, naming
// the op and the tensor; returns q's dtype. dout may be an empty view (the forward's: not checked).
DType check_attention_tensors(const char* op, const AttentionShape& a, const AttentionInputs& in,
                              const ConstTensorView& out, const ConstTensorView& lse, const ConstTensorView& dout);
// The same for the backward's outputs (dsinks_acc only with mask.sinks).
void check_attention_grads(const char* op, const AttentionShape& a, const AttentionMask& mask, const AttentionGrads& g,
                           DType dt);

// Refuses doc_start [B*S] (host memory) that breaks AttentionMask's contract, naming row and token.
void check_attention_doc_start(const int32_t* doc_start, int64_t B, int64_t S);
// Refuses key_end [B] (host memory) outside [1, S], naming the row.
void check_attention_key_end(const int32_t* key_end, int64_t B, int64_t S);
// AttentionMask::documents and longest_document of a valid doc_start [B*S] (host memory).
struct AttentionDocuments {
  int64_t documents = 0, longest = 0;
};
AttentionDocuments count_attention_documents(const int32_t* doc_start, int64_t B, int64_t S);

// The three AdamW calls of speculation-then-validation (optim::AdamKernels): a step, its undo,
// and its undo followed by a step with another grad_scale, in one pass.
enum class AdamCall { Step, Rollback, Redo };

// How a mixture-of-experts router turns logits into k weights per token.
struct MoeRouting {
  enum class Kind {
    SoftmaxTopK,  // qwen3_moe: softmax over all E, top-k; renormalised to sum 1 when `normalize`
    TopKSoftmax,  // gpt_oss: top-k of the raw logits, softmax over those k
  };
  Kind kind = Kind::SoftmaxTopK;
  int64_t experts = 0, top_k = 0;
  bool normalize = false;
  // The storage dtype the weights are rounded through (transformers casts them to the model's).
  DType weight_dtype = DType::F32;
};

// C[M,N] = alpha * op(A) @ op(B) + beta * C; row-major; op(X) = X^T when trans_X.
// A and B share dtype `ab`; C has dtype `c` (fp32 C with bf16 inputs is allowed).
struct Gemm {
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  float alpha = 1.0f, beta = 0.0f;
  const void* A = nullptr;
  const void* B = nullptr;
  DType ab = DType::F32;
  void* C = nullptr;
  DType c = DType::F32;

  // The forms in use, every operand in dtype `dt`, named for the operands transposed (n: as
  // stored, t: transposed): nn C = A B, nt C = A B^T (a linear layer, x W^T), tn C = A^T B (a
  // weight's gradient). The modifiers give the rest: another dtype for C, alpha, any transposes.
  static Gemm nn(int64_t M, int64_t N, int64_t K, const void* A, const void* B, void* C, DType dt, float beta = 0.0f) {
    Gemm g;
    g.M = M, g.N = N, g.K = K, g.beta = beta, g.A = A, g.B = B, g.ab = dt, g.C = C, g.c = dt;
    return g;
  }
  static Gemm nt(int64_t M, int64_t N, int64_t K, const void* A, const void* B, void* C, DType dt, float beta = 0.0f) {
    return nn(M, N, K, A, B, C, dt, beta).transposed(false, true);
  }
  static Gemm tn(int64_t M, int64_t N, int64_t K, const void* A, const void* B, void* C, DType dt, float beta = 0.0f) {
    return nn(M, N, K, A, B, C, dt, beta).transposed(true, false);
  }
  Gemm transposed(bool a, bool b) const {
    Gemm g = *this;
    g.trans_a = a, g.trans_b = b;
    return g;
  }
  Gemm out_as(DType dtype) const {
    Gemm g = *this;
    g.c = dtype;
    return g;
  }
  Gemm scaled(float a) const {
    Gemm g = *this;
    g.alpha = a;
    return g;
  }
};

// Grouped GEMM over G groups of consecutive rows: a Gemm whose rows of A are split into groups,
// group g having the rows [offsets[g], offsets[g + 1]) of the varying dimension, M (trans_a false)
// or K (trans_a true). offsets (int32, G + 1 entries) are backend memory, read in stream
// order, so they may come from an op enqueued just before (moe_sort_slots): no size needs to come
// back to the host. max_rows bounds offsets[G] (it sizes the launch). Row-major, as Ops::gemm.
//   vary_m (trans_a false): C_g[m_g, N] = alpha op(A_g)[m_g, K] op(B_g) + beta C_g, with A_g and
//     C_g the group's rows of A [sum m, K] and C [sum m, N]; B_g one matrix per group.
//   vary_k (trans_a true, trans_b false): C_g[M, N] = alpha A_g^T B_g + beta C_g with A_g, B_g the
//     group's rows of A [sum k, M] and B [sum k, N]; C_g one matrix per group (a weight gradient);
//     an empty group leaves beta * C_g.
// The per-group matrix is per_group[g] (host array of G pointers: experts' weights need not be
// adjacent), or, when per_group is null, B + g * N * K (vary_m) / C + g * M * N (vary_k).
// Gemm's M, N, K are the fixed dimensions (the varying one is ignored).
struct GroupedGemm : Gemm {
  const int32_t* offsets = nullptr;
  int64_t max_rows = 0;
  int64_t groups = 0;
  void* const* per_group = nullptr;
  bool vary_k() const { return trans_a; }
};

// The load-balancing loss of transformers' load_balancing_loss_func (no attention mask), summed
// over a micro-batch's MoE layers on the device: moe_expert_stats adds each layer's selections and
// router probabilities to fp64 accumulators `tokens` and `probs` [E]; moe_aux_loss then adds
// weight * E * sum_e tokens_e probs_e / rows^2 to the loss accumulator (fp32 [1]), writes the
// gradient per token's probability of e, dprob_e = weight * E * tokens_e / rows^2 (fp32 [E]), and
// zeroes the accumulators (rows: the (layer, token) rows summed).
struct MoeAuxLoss {
  int64_t experts = 0;
  double weight = 0.0, rows = 0.0;
};

// An embedding lookup of T token ids (int32) into a table [V, H] of dtype `dtype`.
struct EmbeddingShape {
  int64_t T = 0, V = 0, H = 0;
  DType dtype = DType::F32;
};

// RMSNorm over the last dim of [rows, dim] in dtype `dtype`: rstd = 1 / sqrt(mean(x^2) + eps)
// (eps is the forward's: the backward uses the saved rstd).
struct RmsNormShape {
  int64_t rows = 0, dim = 0;
  float eps = 0.0f;
  DType dtype = DType::F32;
};
// The backward's outputs: dx (+= when accumulate), dw_acc +=.
struct RmsNormGrads {
  void* dx = nullptr;
  void* dw_acc = nullptr;
  bool accumulate = false;
};

// Rotary embedding (Hugging Face "rotate_half" convention) of x[T, heads, head_dim] at
// positions[T]: pair i turns by positions[t] * inv_freq[i] (fp64 [head_dim / 2], backend memory;
// angles in double), cos and sin multiplied by attention_scale (yarn; else 1).
struct Rope {
  int64_t T = 0, heads = 0, head_dim = 0;
  const int32_t* positions = nullptr;
  const double* inv_freq = nullptr;
  float attention_scale = 1.0f;
  DType dtype = DType::F32;
};

// Cross-entropy over one chunk of rows of fp32 logits[rows, V], with OLMo's z-loss (z_loss x
// logsumexp^2 per row, 0 = off), each row's terms multiplied by scale; dlogits in dtype `dtype`.
struct CrossEntropyLoss {
  int64_t rows = 0, V = 0;
  float scale = 1.0f, z_loss = 0.0f;
  DType dtype = DType::F32;
};

// The (token, choice) slots of a mixture-of-experts layer: T tokens, each sent to k experts,
// hidden rows of H values in dtype `dtype`; T*k slots t*k + j, sorted by moe_sort_slots.
struct MoeSlots {
  int64_t T = 0, k = 0, H = 0;
  DType dtype = DType::F32;
};

// GQA heads replicated for more sequence-parallel ranks than KV heads: rows x heads x head_dim,
// each head `copies` times, in dtype `dtype`.
struct HeadReplication {
  int64_t rows = 0, heads = 0, copies = 0, head_dim = 0;
  DType dtype = DType::F32;
};

class Ops {
 public:
  virtual ~Ops() = default;

  // See Gemm.
  virtual void gemm(Stream& s, const Gemm& g) = 0;

  // out[T,H] = table[tokens[t], :]. Token ids outside [0, V) are an error.
  virtual void embedding_forward(Stream& s, const EmbeddingShape& e, void* out, const void* table,
                                 const int32_t* tokens) = 0;
  // dtable_acc[tokens[t], :] += dout[t, :] for every token but padding_idx (-1: none), whose row
  // gets no gradient from the lookup (torch's nn.Embedding padding_idx).
  virtual void embedding_backward(Stream& s, const EmbeddingShape& e, void* dtable_acc, const void* dout,
                                  const int32_t* tokens, int64_t padding_idx) = 0;

  // out = x * rstd * w over the last dim; rstd[rows] (fp32) saved for backward.
  virtual void rmsnorm_forward(Stream& s, const RmsNormShape& n, void* out, float* rstd, const void* x,
                               const void* w) = 0;
  // See RmsNormGrads for what is written.
  virtual void rmsnorm_backward(Stream& s, const RmsNormShape& n, const RmsNormGrads& g, const void* dout,
                                const void* x, const void* w, const float* rstd) = 0;

  // In-place rotary embedding of x (Rope); inverse = true applies the transpose (the backward).
  virtual void rope(Stream& s, const Rope& r, void* x, bool inverse) = 0;

  // Causal grouped-query attention (AttentionShape), computed tile by tile (memory O(S)),
  // narrowed by `mask` (AttentionMask); lse is saved for backward (the log-sum-exp of each row's
  // softmax, sink included).
  virtual void attention_forward(Stream& s, const AttentionShape& a, const AttentionMask& mask,
                                 const AttentionInputs& in, TensorView out, TensorView lse) = 0;
  // Which implementation attention_forward/backward use for this shape and kind of mask (which of
  // its fields are set; the pointers are not read), and why (printed at start-up).
  virtual std::string attention_implementation(const AttentionShape& a, const AttentionMask& mask, DType dt) = 0;
  // The most device memory attention_forward/backward draw from the pool at once for this shape
  // and kind of mask (the memory planner's term).
  virtual size_t attention_workspace_bytes(const AttentionShape& a, const AttentionMask& mask, DType dt) = 0;
  // out and lse are the forward's; see AttentionGrads for what is written.
  virtual void attention_backward(Stream& s, const AttentionShape& a, const AttentionMask& mask,
                                  const AttentionInputs& in, ConstTensorView out, ConstTensorView lse,
                                  ConstTensorView dout, const AttentionGrads& g) = 0;

  // out = silu(gate) * up, elementwise over n.
  virtual void swiglu_forward(Stream& s, void* out, const void* gate, const void* up, int64_t n, DType dt) = 0;
  virtual void swiglu_backward(Stream& s, void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                               int64_t n, DType dt) = 0;
  // The same over the output of one GEMM with [W_gate; W_up]: gate_up [rows, 2 * cols] holds each
  // row's gate in its first cols and its up in its last cols; out and dout are [rows, cols];
  // backward writes dgate_up [rows, 2 * cols] alike (the input of one backward GEMM each).
  virtual void swiglu_rows_forward(Stream& s, void* out, const void* gate_up, int64_t rows, int64_t cols, DType dt) = 0;
  virtual void swiglu_rows_backward(Stream& s, void* dgate_up, const void* dout, const void* gate_up, int64_t rows,
                                    int64_t cols, DType dt) = 0;

  // Residual dropout over a block of rows [rows, cols] (include/so/backend/dropout_mask.h):
  // forward x += keep ? y / (1 - p) : 0, one fp32 fused multiply-add per kept value (bitwise the
  // same on every backend); backward dy = keep ? dx / (1 - p) : 0, the branch's gradient.
  virtual void dropout_add(Stream& s, void* x, const void* y, int64_t rows, int64_t cols, const DropoutMask& m,
                           DType dt) = 0;
  virtual void dropout_backward(Stream& s, void* dy, const void* dx, int64_t rows, int64_t cols, const DropoutMask& m,
                                DType dt) = 0;

  // Cross-entropy (CrossEntropyLoss): loss_acc += sum_t scale * (nll_t + z_loss * lse_t^2); when
  // dlogits is non-null it receives scale * (softmax * (1 + 2 z_loss lse) - onehot) in dtype
  // c.dtype. Targets < 0 are ignored (padding: no loss, no z-loss); targets >= V are an error.
  virtual void cross_entropy(Stream& s, const CrossEntropyLoss& c, float* loss_acc, void* dlogits, const float* logits,
                             const int32_t* targets) = 0;

  // ---- Mixture of experts (one token's hidden state goes to k of E experts) ----
  // Routing, as transformers computes it from fp32 router logits [T, E]: weights[T, k] (fp32) and
  // experts[T, k] (int32, in descending order of the value top-k ranks by; ties to the lower index).
  virtual void moe_route(Stream& s, const MoeRouting& r, float* weights, int32_t* experts, const float* logits,
                         int64_t T) = 0;
  // dlogits[T, E] (overwritten) from dweights[T, k]. aux_dprob [E] (or null) is added to the
  // gradient of every token's full softmax over E (the load-balancing loss's term).
  virtual void moe_route_backward(Stream& s, const MoeRouting& r, float* dlogits, const float* dweights,
                                  const float* logits, const int32_t* experts, const float* aux_dprob, int64_t T) = 0;
  // Sorts the T*k (token, choice) slots by expert, stably (token order within an expert):
  // slot_of[p] = t*k + j of sorted row p, row_of[t*k + j] = p, offsets[E + 1] the rows' starts.
  virtual void moe_sort_slots(Stream& s, int32_t* slot_of, int32_t* row_of, int32_t* offsets, const int32_t* experts,
                              int64_t T, int64_t k, int64_t E) = 0;
  // Dispatch: dst[p, :] = x[slot_of[p] / k, :] for the T*k sorted rows.
  virtual void moe_dispatch(Stream& s, const MoeSlots& m, void* dst, const void* x, const int32_t* slot_of) = 0;
  // Combine: out[t, :] (+= when accumulate) = sum_j w[t*k + j] * y[row_of[t*k + j], :], in fp32;
  // weights null = 1 (the dispatch's backward).
  virtual void moe_combine(Stream& s, const MoeSlots& m, void* out, const void* y, const float* weights,
                           const int32_t* row_of, bool accumulate) = 0;
  // The combine's backward: dy[p, :] = w[slot] * dout[slot / k, :] and dweights[slot] =
  // dot(dout[slot / k, :], y[p, :]) (overwritten), slot = slot_of[p].
  virtual void moe_combine_backward(Stream& s, const MoeSlots& m, void* dy, float* dweights, const void* dout,
                                    const void* y, const float* weights, const int32_t* slot_of) = 0;
  // One GEMM per group of consecutive rows (an expert's tokens), sized by offsets on the device.
  // See GroupedGemm for which operand is which.
  virtual void grouped_gemm(Stream& s, const GroupedGemm& g) = 0;
  // Per expert e of one MoE forward: its selections (offsets[e + 1] - offsets[e], offsets from
  // moe_sort_slots) added to counts_acc (int64, the run's metric) and tokens (fp64), and its router
  // probability summed over the T tokens (softmax over all E of the fp32 logits [T, E], per token
  // in fp32 as transformers) added to probs (fp64). Any of the three may be null.
  virtual void moe_expert_stats(Stream& s, int64_t* counts_acc, double* tokens, double* probs, const float* logits,
                                const int32_t* offsets, int64_t T, int64_t E) = 0;
  // The load-balancing loss from the accumulators (MoeAuxLoss), which it zeroes.
  virtual void moe_aux_loss(Stream& s, const MoeAuxLoss& a, float* loss_acc, float* dprob, double* tokens,
                            double* probs) = 0;
  // GPT-OSS's clamped GLU on its interleaved projection gate_up[2n] (gate at even, up at odd
  // positions): out[i] = g * sigmoid(alpha * g) * (u + 1) with g = min(gate_up[2i], limit),
  // u = clamp(gate_up[2i + 1], -limit, limit). Backward writes dgate_up[2n], interleaved alike.
  virtual void clamped_swiglu_forward(Stream& s, void* out, const void* gate_up, int64_t n, float alpha, float limit,
                                      DType dt) = 0;
  virtual void clamped_swiglu_backward(Stream& s, void* dgate_up, const void* dout, const void* gate_up, int64_t n,
                                       float alpha, float limit, DType dt) = 0;

  // out_acc += sum(x^2) in fp32 (non-finite inputs make it non-finite).
  virtual void sum_squares(Stream& s, float* out_acc, const void* x, int64_t n, DType dt) = 0;
  // A step validated on the device (clip_decision.h), in two parts so that the ranks' sums can be
  // gathered between them: *rank_sum = sum_in_order(bucket_sums, n); *out = decide_clip(rank_sums,
  // ranks, max_norm). Single-threaded and in order: bit for bit the host's decision.
  virtual void sum_in_order(Stream& s, double* rank_sum, const float* bucket_sums, int64_t n) = 0;
  virtual void clip_decision(Stream& s, ClipDecision* out, const double* rank_sums, int ranks, float max_norm) = 0;

  virtual void cast(Stream& s, void* dst, DType dst_dt, const void* src, DType src_dt, int64_t n) = 0;

  // dst[r][0, cols) = src[r][0, cols) for rows r, consecutive rows dst_stride and src_stride
  // elements apart (a column block of a wider matrix, to or from one of its own): the q, k and v
  // split out of the one q|k|v GEMM's rows, and their gradients gathered back into such rows.
  virtual void copy_columns(Stream& s, void* dst, int64_t dst_stride, const void* src, int64_t src_stride, int64_t rows,
                            int64_t cols, DType dt) = 0;
  // dst[j][i][:] = src[i][j][:] for src [d0][d1][inner]: the packing around Ulysses all-to-alls.
  virtual void transpose_blocks(Stream& s, void* dst, const void* src, int64_t d0, int64_t d1, int64_t inner,
                                DType dt) = 0;
  // GQA heads for more sequence-parallel ranks than KV heads (HeadReplication). Forward:
  // out[r][h*copies + c][:] = in[r][h][:]. reverse: out[r][h][:] = sum_c in[r][h*copies + c][:]
  // (the gradient), accumulated in fp32.
  virtual void replicate_heads(Stream& s, const HeadReplication& h, void* out, const void* in, bool reverse) = 0;

  // AdamW on the n fp32 master weights and moments of `a` (backend memory; optim::adamw_reference
  // and optim::AdamKernels semantics, bit for bit), writing the new weights to a.out (dtype
  // a.out_dt) in the same pass; with a snapshot in `a`, a step saves the old state there and
  // rollback / redo start from it. final_scale is a redo's grad_scale. With `guard` (a bucket's sum
  // of squared gradients, written earlier in stream order) the call does nothing when *guard is
  // not finite: a non-finite gradient is never applied, so it never has to be undone. With
  // `decision` (clip_decision's, earlier in stream order) the call does nothing when the step is
  // skipped and uses its clip_coef as hp.grad_scale: no value has to come back to the host first.
  virtual void adam(Stream& s, AdamCall call, const AdamArrays& a, int64_t n, const AdamWParams& hp,
                    float final_scale = 1.0f, const float* guard = nullptr, const ClipDecision* decision = nullptr) = 0;
};

}  // namespace so
