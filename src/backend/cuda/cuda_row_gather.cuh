#pragma once
// dst row r = src row src_row(r): the copy behind embedding_forward, transpose_blocks and the
// forward of replicate_heads. Rows are copied as raw bytes in the widest unit (16, 4 or 2 bytes) the
// row size and the pointers allow; a block covers ty rows of tx threads each, grid-stride over rows.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cuda_check.h"
#include "cuda_launch.cuh"

namespace so::cuda {

// SrcRow: a device-callable functor int64_t(int64_t r) giving the source row of destination row r,
// or a negative value to leave row r unwritten. All threads of the row call it.
template <typename Unit, typename SrcRow>
__global__ void gather_rows_kernel(Unit* dst, const Unit* src, int64_t rows, int64_t row_units, SrcRow src_row) {
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    const int64_t s = src_row(r);
    if (s < 0) continue;
    Unit* d = dst + r * row_units;
    const Unit* from = src + s * row_units;
    for (int64_t u = threadIdx.x; u < row_units; u += blockDim.x) d[u] = from[u];
  }
}

// row_bytes is a multiple of 2 (rows hold whole fp32 or bf16 elements).
template <typename SrcRow>
void launch_gather_rows(cudaStream_t stream, void* dst, const void* src, int64_t rows, size_t row_bytes,
                        SrcRow src_row) {
  if (rows == 0 || row_bytes == 0) return;
  auto launch = [&](auto unit) {
    using Unit = decltype(unit);
    const int64_t units = static_cast<int64_t>(row_bytes / sizeof(Unit));
    const int tx = static_cast<int>(std::min<int64_t>((units + 31) / 32 * 32, kBlockThreads));
    const int ty = kBlockThreads / tx;
    gather_rows_kernel<Unit><<<grid_for((rows + ty - 1) / ty), dim3(tx, ty), 0, stream>>>(
        static_cast<Unit*>(dst), static_cast<const Unit*>(src), rows, units, src_row);
    SO_CUDA_CHECK(cudaGetLastError());
  };
  const auto addr_bits = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src);
  if (row_bytes % 16 == 0 && addr_bits % 16 == 0)
    launch(uint4{});
  else if (row_bytes % 4 == 0 && addr_bits % 4 == 0)
    launch(uint32_t{});
  else
    launch(uint16_t{});
}

}  // namespace so::cuda
