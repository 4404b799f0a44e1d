#include "grouped_gemm.h"

#include "so/core/error.h"

namespace so {

void walk_grouped_gemm(
    const GroupedGemm& g,
    const std::function<void(bool, bool, int64_t, int64_t, int64_t, const void*, const void*, void*)>& gemm,
    const std::function<void(void*, size_t)>& zero) {
  const size_t ab = dtype_size(g.ab), c = dtype_size(g.c);
  const auto* A = static_cast<const char*>(g.A);
  SO_CHECK(g.offsets != nullptr, "grouped_gemm: no offsets");
  for (int64_t grp = 0; grp < g.groups; ++grp) {
    const int64_t start = g.offsets[grp], n = g.offsets[grp + 1] - start;
    SO_CHECK(start >= 0 && n >= 0 && start + n <= g.max_rows, "grouped_gemm: group ", grp, " has rows [", start, ", ",
             start + n, "), outside [0, max_rows = ", g.max_rows, ") or reversed");
    if (!g.vary_k()) {
      const void* B = g.per_group ? g.per_group[grp] : static_cast<const char*>(g.B) + grp * g.N * g.K * ab;
      if (n > 0)
        gemm(false, g.trans_b, n, g.N, g.K, A + start * g.K * ab, B, static_cast<char*>(g.C) + start * g.N * c);
    } else {
      void* C = g.per_group ? g.per_group[grp] : static_cast<char*>(g.C) + grp * g.M * g.N * c;
      if (n > 0) {
        gemm(true, false, g.M, g.N, n, A + start * g.M * ab, static_cast<const char*>(g.B) + start * g.N * ab, C);
      } else if (g.beta != 1.0f) {  // an expert without tokens: its gradient is beta * C
        SO_CHECK(g.beta == 0.0f, "grouped_gemm: an empty group with beta ", g.beta, " (only 0 or 1 is supported)");
        zero(C, static_cast<size_t>(g.M * g.N) * c);
      }
    }
  }
}

}  // namespace so
