#pragma once
// The walk over a GroupedGemm's groups (so/backend/ops.h) for a backend whose memory the host reads
// (the CPU's; the CUDA kernels read the offsets on the device): where each group's operands lie,
// which groups are empty, and what an empty one leaves (beta * C: C zeroed when beta is 0,
// untouched when 1). Offsets that decrease or pass max_rows are refused, naming the group. The
// backend supplies its GEMM and its zero-fill.
#include <functional>

#include "so/backend/ops.h"

namespace so {

// gemm(trans_a, trans_b, M, N, K, A, B, C) with g's alpha, beta and dtypes; zero(C, bytes).
void walk_grouped_gemm(
    const GroupedGemm& g,
    const std::function<void(bool, bool, int64_t, int64_t, int64_t, const void*, const void*, void*)>& gemm,
    const std::function<void(void*, size_t)>& zero);

}  // namespace so
