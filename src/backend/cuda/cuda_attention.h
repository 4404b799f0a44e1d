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

void attention_forward(cudaStream_t stream, const AttentionShape& a, const AttentionMask& mask,
                       const AttentionInputs& in, void* out, float* lse);

// Scratch the backward pass needs (fp32 row sums of dout*out, fp32 dq/dk/dv accumulators, ...);
// the caller allocates it from the backend's caching allocator.
size_t attention_backward_workspace_bytes(const AttentionShape& a, DType dt);

// dq, dk, dv are overwritten; dsinks_acc [Hq] (with mask.sinks) is accumulated into.
struct AttentionWorkspace {
  void* data = nullptr;
  size_t bytes = 0;
};
void attention_backward(cudaStream_t stream, const AttentionShape& a, const AttentionMask& mask,
                        const AttentionInputs& in, const void* out, const float* lse, const void* dout,
                        const AttentionGrads& g, AttentionWorkspace ws);

// dsinks_acc[h] -= sum over rows of exp(sinks[h] - lse) * rowsum(dout * out): the sinks' gradient,
// which needs the forward's lse and output only (any implementation's). drow: B*Hq*S floats.
void attention_sink_grad(cudaStream_t stream, const AttentionShape& a, const void* sinks, void* dsinks_acc,
                         const float* lse, const void* dout, const void* out, float* drow, DType dt);

}  // namespace so::cuda
