#pragma once
// Causal grouped-query flash attention on the GPU (FlashAttention-2 style: tiles of queries per
// block, K/V streamed through shared memory, online softmax; memory O(S)). Same layouts and
// semantics as Ops::attention_forward/backward: q/out/dout/dq [B*S, Hq*D], k/v/dk/dv
// [B*S, Hkv*D], lse [B, Hq, S] fp32, mask as AttentionMask (documents, window, sinks; key tiles
// a mask hides entirely are skipped). dt is BF16 or F32; D is any multiple of 8 up to 256.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "so/backend/ops.h"
#include "so/core/dtype.h"

namespace so::cuda {

void attention_forward(cudaStream_t stream, void* out, float* lse, const void* q, const void* k, const void* v,
                       int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t D, float scale, const AttentionMask& mask,
                       DType dt);

// Scratch the backward pass needs (fp32 row sums of dout*out, fp32 dq/dk/dv accumulators, ...);
// the caller allocates it from the backend's caching allocator.
size_t attention_backward_workspace_bytes(int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t D, DType dt);

// dq, dk, dv are overwritten; dsinks_acc [Hq] (with mask.sinks) is accumulated into.
void attention_backward(cudaStream_t stream, void* dq, void* dk, void* dv, const void* dout, const void* q,
                        const void* k, const void* v, const void* out, const float* lse, int64_t B, int64_t S,
                        int64_t Hq, int64_t Hkv, int64_t D, float scale, const AttentionMask& mask, void* dsinks_acc,
                        DType dt, void* workspace, size_t workspace_bytes);

}  // namespace so::cuda
