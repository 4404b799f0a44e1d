#pragma once
// Host launchers of the CUDA backend's own kernels (everything but GEMM and attention), with the
// semantics of so::Ops (include/so/backend/ops.h) and of the CPU reference kernels. Each launcher
// enqueues on `stream` and returns; pointers are device memory; dt picks fp32 or bf16 storage and
// the math is fp32 (wider where noted). Launch errors throw (SO_CUDA_CHECK); bad token ids and
// targets are recorded in `err` (cuda_device_error.h) and the backend throws at synchronisation.
//
// Every result is deterministic: no floating-point atomics; reductions run in a fixed order. Ops
// that reduce across blocks take a device `workspace` of at least *_workspace_bytes(...) bytes
// (16-byte aligned) that must not be shared with work running concurrently on another stream.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda_device_error.h"
#include "so/backend/ops.h"
#include "so/core/dtype.h"
#include "src/optim/adam_constants.h"

namespace so::cuda {

// out[t,:] = table[tokens[t],:]; an id outside [0,V) is recorded in err and its row left unwritten.
void launch_embedding_forward(cudaStream_t stream, void* out, const void* table, const int32_t* tokens, int64_t T,
                              int64_t V, int64_t H, DType dt, DeviceError* err);

size_t embedding_backward_workspace_bytes(int64_t T, int64_t V);
// dtable_acc[tokens[t],:] += dout[t,:], each id's tokens added in order t and rounded to dt after
// every add (the CPU's exact result): sort (id, t), then one block walks each id's run of tokens.
// The run of padding_idx (-1: none) is skipped.
void launch_embedding_backward(cudaStream_t stream, void* dtable_acc, const void* dout, const int32_t* tokens,
                               int64_t T, int64_t V, int64_t H, int64_t padding_idx, DType dt, DeviceError* err,
                               void* workspace, size_t workspace_bytes);

// out = w * (x * rstd) per row, rstd = 1/sqrt(mean(x^2) + eps) saved (fp32); one block per row.
void launch_rmsnorm_forward(cudaStream_t stream, void* out, float* rstd, const void* x, const void* w, int64_t rows,
                            int64_t dim, float eps, DType dt);

size_t rmsnorm_backward_workspace_bytes(int64_t rows, int64_t dim);
// dx (= or += when accumulate) per row, one block per row; dw_acc += sum over rows of dout*x*rstd via
// per-block fp32 partials added in block order by a second kernel.
void launch_rmsnorm_backward(cudaStream_t stream, void* dx, void* dw_acc, const void* dout, const void* x,
                             const void* w, const float* rstd, int64_t rows, int64_t dim, bool accumulate, DType dt,
                             void* workspace, size_t workspace_bytes);

// In-place rotate_half rotary embedding of x[T, heads, head_dim] (inverse: the transpose rotation);
// angles in double as the CPU computes them, rotations without FMA contraction.
void launch_rope(cudaStream_t stream, void* x, const int32_t* positions, int64_t T, int64_t heads, int64_t head_dim,
                 const double* inv_freq, float attention_scale, bool inverse, DType dt);

// out = silu(gate) * up, elementwise.
void launch_swiglu_forward(cudaStream_t stream, void* out, const void* gate, const void* up, int64_t n, DType dt);
// dgate = dout * up * sig * (1 + gate * (1 - sig)), dup = dout * silu(gate), elementwise.
void launch_swiglu_backward(cudaStream_t stream, void* dgate, void* dup, const void* dout, const void* gate,
                            const void* up, int64_t n, DType dt);
// gate_up [rows, 2 * cols]: each row's gate, then its up (Ops::swiglu_rows_forward).
void launch_swiglu_rows_forward(cudaStream_t stream, void* out, const void* gate_up, int64_t rows, int64_t cols,
                                DType dt);
void launch_swiglu_rows_backward(cudaStream_t stream, void* dgate_up, const void* dout, const void* gate_up,
                                 int64_t rows, int64_t cols, DType dt);

// Residual dropout (Ops::dropout_add / dropout_backward), the mask of include/so/backend/dropout_mask.h.
void launch_dropout_add(cudaStream_t stream, void* x, const void* y, int64_t rows, int64_t cols, const DropoutMask& m,
                        DType dt);
void launch_dropout_backward(cudaStream_t stream, void* dy, const void* dx, int64_t rows, int64_t cols,
                             const DropoutMask& m, DType dt);

// Mixture of experts (cuda_moe_kernels.cu), semantics of the Ops calls of the same names.
void launch_moe_route(cudaStream_t stream, const MoeRouting& r, float* weights, int32_t* experts, const float* logits,
                      int64_t T);
void launch_moe_route_backward(cudaStream_t stream, const MoeRouting& r, float* dlogits, const float* dweights,
                               const float* logits, const int32_t* experts, const float* aux_dprob, int64_t T);
// workspace: E int32 (the per-expert counts).
void launch_moe_sort_slots(cudaStream_t stream, int32_t* slot_of, int32_t* row_of, int32_t* offsets,
                           const int32_t* experts, int64_t T, int64_t k, int64_t E, void* workspace);
void launch_moe_dispatch(cudaStream_t stream, void* dst, const void* x, const int32_t* slot_of, int64_t T, int64_t k,
                         int64_t H, DType dt);
void launch_moe_combine(cudaStream_t stream, void* out, const void* y, const float* weights, const int32_t* row_of,
                        int64_t T, int64_t k, int64_t H, bool accumulate, DType dt);
// moe_expert_stats' per-token softmax statistics: T float2s of workspace.
size_t moe_expert_stats_workspace_bytes(int64_t T);
void launch_moe_expert_stats(cudaStream_t stream, int64_t* counts_acc, double* tokens, double* probs,
                             const float* logits, const int32_t* offsets, int64_t T, int64_t E, void* workspace);
void launch_moe_aux_loss(cudaStream_t stream, const MoeAuxLoss& a, float* loss_acc, float* dprob, double* tokens,
                         double* probs);
void launch_moe_combine_backward(cudaStream_t stream, void* dy, float* dweights, const void* dout, const void* y,
                                 const float* weights, const int32_t* slot_of, int64_t T, int64_t k, int64_t H,
                                 DType dt);
void launch_clamped_swiglu_forward(cudaStream_t stream, void* out, const void* gate_up, int64_t n, float alpha,
                                   float limit, DType dt);
void launch_clamped_swiglu_backward(cudaStream_t stream, void* dgate_up, const void* dout, const void* gate_up,
                                    int64_t n, float alpha, float limit, DType dt);

size_t cross_entropy_workspace_bytes(int64_t rows);
// One block per row of fp32 logits[rows, V]: online max / sum of exp, per-row nll (double) to the
// workspace (plus z_loss * lse^2), optional dlogits = scale * (softmax * (1 + 2 z_loss lse) - onehot)
// in dt (zeros on ignored rows); then one block adds the nll in a fixed order: loss_acc +=
// float(scale * sum). Targets >= V go to err.
void launch_cross_entropy(cudaStream_t stream, float* loss_acc, void* dlogits, const float* logits,
                          const int32_t* targets, int64_t rows, int64_t V, float scale, float z_loss, DType dt,
                          DeviceError* err, void* workspace, size_t workspace_bytes);

size_t sum_squares_workspace_bytes(int64_t n);
// out_acc += float(sum of x^2): double sums over kSumSquaresChunk-element chunks (one block each),
// then added in chunk order in double, the structure of so::sum_squares_chunked.
void launch_sum_squares(cudaStream_t stream, float* out_acc, const void* x, int64_t n, DType dt, void* workspace,
                        size_t workspace_bytes);

// Ops::sum_in_order and Ops::clip_decision: one thread each, clip_decision.h's functions themselves.
void launch_sum_in_order(cudaStream_t stream, double* rank_sum, const float* bucket_sums, int64_t n);
void launch_clip_decision(cudaStream_t stream, ClipDecision* out, const double* rank_sums, int ranks, float max_norm);

// dst = src converted fp32 <-> bf16 (round to nearest even, NaN kept); same dtype: a byte copy.
void launch_cast(cudaStream_t stream, void* dst, DType dst_dt, const void* src, DType src_dt, int64_t n);

// dst[j][i][:] = src[i][j][:] for src [d0][d1][inner]: a row gather.
void launch_transpose_blocks(cudaStream_t stream, void* dst, const void* src, int64_t d0, int64_t d1, int64_t inner,
                             DType dt);

// Forward: out[r][h*copies + c][:] = in[r][h][:] (a row gather). reverse: out[r][h][:] = sum over
// c in order of in[r][h*copies + c][:], in fp32.
void launch_replicate_heads(cudaStream_t stream, void* out, const void* in, int64_t rows, int64_t heads, int64_t copies,
                            int64_t head_dim, bool reverse, DType dt);

// Ops::adam: optim::adamw_reference and optim::AdamKernels' rollback and redo element by element, bit
// for bit (same operation order, FMAs where they have them), with the constants the host derived
// by optim::adam_constants; skipped when guard is set and *guard is not finite, or when decision is
// set and decision->skipped; decision->clip_coef (read on the device) replaces c.grad_scale.
void launch_adam(cudaStream_t stream, AdamCall call, const AdamArrays& a, int64_t n, const optim::AdamConstants& c,
                 float final_scale, const float* guard, const ClipDecision* decision);

}  // namespace so::cuda
