#pragma once
// The small kernels around cuDNN's SDPA that let it take AttentionMask's documents and padding
// (cudnn_attention.cpp): per-sequence lengths and offsets made on the device from doc_start and
// key_end (no host round trip), and the fix-ups that give rows which see no key our semantics
// (output 0, lse the sink's logit or -inf, no gradient) whatever cuDNN leaves there.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_device_error.h"
#include "so/backend/ops.h"

namespace so::cuda {

// cuDNN's view of a batch of packed rows: documents as ragged sequences of the [B*S] token axis.
// Entry i < the batch's documents is document i in token order: its query length (0 when all
// of it lies in the row's padding: none of its queries sees a key), key length (its tokens before
// the row's padding) and element offsets of its first token in q/out ([B*S, Hq*D]), k/v
// ([B*S, Hkv*D]) and the token-major stats ([B*S, Hq]). Entries past the documents have length 0
// and offsets at the end; offsets[n] is the end.
struct RaggedSequences {
  int32_t* seq_q;         // [n]
  int32_t* seq_kv;        // [n]
  int64_t* offset_q;      // [n + 1]
  int64_t* offset_kv;     // [n + 1]
  int64_t* offset_stats;  // [n + 1]
  int64_t n;              // the graph's sequences
  int64_t longest;        // the graph's longest sequence
};

// Fills `r` from doc_start [B*S] and key_end [B] (or null). A batch with more than r.n documents
// or one longer than r.longest (the host's AttentionMask::documents/longest_document were wrong)
// is recorded in err, and thrown at the next synchronisation; the lengths written stay within the
// graph's bounds.
void launch_ragged_sequences(cudaStream_t stream, const RaggedSequences& r, const int32_t* doc_start,
                             const int32_t* key_end, const AttentionShape& a, DeviceError* err);

// seq_q[b] = S for the B rows of a padded batch (every query is computed; key_end is seq_kv).
void launch_fill_row_lengths(cudaStream_t stream, int32_t* seq_q, int64_t B, int64_t S);

// After cuDNN's forward: where `stats_tokens` ([B*S, Hq], the ragged layout) is given, lse [B, Hq,
// S] is read from it; rows that see no key (mask) get lse = sinks[h] (fp32 [Hq], or -inf without)
// and a zero output row.
void launch_forward_fixup(cudaStream_t stream, void* out, float* lse, const float* stats_tokens,
                          const AttentionMask& mask, const float* sinks, const AttentionShape& a, DType dt);

// Before cuDNN's backward: its stats from lse [B, Hq, S], token-major [B*S, Hq] when `tokens`
// (ragged) else in lse's layout, with +inf for rows that see no key so that every probability of
// such a row is exp(-inf) = 0 (cuDNN would compute exp(-inf - -inf) from our -inf).
void launch_backward_stats(cudaStream_t stream, float* stats, const float* lse, bool tokens, const AttentionMask& mask,
                           const AttentionShape& a);

// After cuDNN's backward: dq rows of queries that see no key and dk/dv rows of keys no query sees
// (from the row's padding on) are zero, whatever cuDNN wrote or left there.
void launch_backward_fixup(cudaStream_t stream, void* dq, void* dk, void* dv, const AttentionMask& mask,
                           const AttentionShape& a, DType dt);

}  // namespace so::cuda
