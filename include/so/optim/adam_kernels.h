#pragma once
// One instruction set's AdamW kernels over flat host arrays. Every variant computes exactly what
// optim::adamw_reference computes (same operations, same order, FMAs exactly where the reference
// has them and nowhere else), so results agree bit for bit with the scalar reference, and the
// tests hold them to exactly that (one documented exception: avx512bf16 stores subnormal weights
// as bf16 zeros; docs/optimizer.md).
#include <cstdint>

#include "so/core/dtype.h"
#include "so/optim/adamw.h"
#include "so/optim/simd_isa.h"

namespace so {

// The memory probes of `stream_probe`: the step's loads and stores streamed three ways, so that
// so_bench adam's memory bound is the best of them, not one guess at what the machine likes.
enum class StreamProbe {
  Plain,        // no software prefetch: the hardware prefetchers alone
  Prefetch,     // software prefetch kProbePrefetchAhead elements ahead
  NonTemporal,  // p, m, v written with non-temporal (streaming) stores where the ISA has them (x86),
                // else as Plain
};
const char* stream_probe_name(StreamProbe kind);  // "plain", "prefetch", "nt"
// The Prefetch probe's distance: the one tuned on Intel, so that on a CPU whose step prefetches
// nothing (AMD, adam_prefetch_ahead) the two probes still try both ways.
constexpr int64_t kProbePrefetchAhead = 512;

struct AdamKernels {
  SimdIsa isa;
  // adamw_reference over [0, n) of a (grad fp32 or bf16; out, if set, fp32 or bf16). With a
  // snapshot, the old p, m, v are also written there, in the same pass.
  void (*step)(const AdamArrays& a, int64_t n, const AdamWParams& hp);
  // Undoes `step` (same grad, same hp) in place and writes out: with a snapshot, copies it back
  // (bitwise); without, inverts the step arithmetically (error bound in docs/optimizer.md).
  void (*rollback)(const AdamArrays& a, int64_t n, const AdamWParams& hp);
  // `rollback` then `step` with grad_scale = final_scale, in one pass: the state a step with
  // final_scale would have produced (bitwise from a snapshot; within the documented bound from
  // the inverse). hp is the undone step's (its grad_scale the speculative one).
  void (*redo)(const AdamArrays& a, int64_t n, const AdamWParams& hp, float final_scale);
  // Sum of x^2 over [0, n), accumulated in double.
  double (*sum_squares)(const void* x, DType dt, int64_t n);
  // dst[i] = src[i] converted (fp32 <-> bf16 with round-to-nearest-even, NaN kept), or copied.
  void (*cast)(void* dst, DType dst_dt, const void* src, DType src_dt, int64_t n);
  // x[i] = sqrt(x[i]) / sqrt(1 - beta2^t) for x[i] >= 0, exactly as `step` computes it from v' (no
  // divide: see AdamMath::scaled_sqrt); tests hold it to IEEE division over every float.
  void (*scaled_sqrt)(float* x, int64_t n, const AdamWParams& hp);
  // The memory bound of `step`: the same loads and stores over the same arrays (p, m, v read and
  // written, grad read, out written) with one add per stream instead of the AdamW arithmetic,
  // streamed as `kind` says.
  void (*stream_probe)(const AdamArrays& a, int64_t n, StreamProbe kind);
};

const AdamKernels& adam_kernels(SimdIsa isa);  // error if not supported

// Sums of squares are taken over fixed chunks of this many elements, each chunk's double sum
// added in order, so the result does not depend on the thread count or on who computes it
// (the device-side ops on the CPU backend and the offloaded optimizer agree bit for bit).
constexpr int64_t kSumSquaresChunk = 16384;
double sum_squares_chunked(const AdamKernels& k, const void* x, DType dt, int64_t n);

}  // namespace so
