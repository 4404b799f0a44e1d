#pragma once
// x rounded up to a multiple of `to` (> 0): buffer sizes to alignments, pages, segments.
#include <cstddef>

namespace so {

constexpr size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

}  // namespace so
