// Ops::grouped_gemm on the device (cuda_grouped_gemm.h): the groups' row offsets are read by the
// kernels, so an MoE layer's expert GEMMs follow moe_sort_slots in stream order with no host
// round trip. Tiles of 64 x 64 outputs, 4 warps, K in steps of 32 staged in shared memory in
// canonical layouts (A tile [m][k], B tile [k][n]) whatever the operands' transposes; bf16 on
// tensor cores (wmma 16x16x16, fp32 accumulators), fp32 in fp32 FMAs. Every output element is
// summed by one thread in a fixed order: bitwise repeatable.
//   vary_m: a schedule kernel numbers the row tiles of all groups (a group of n rows has
//     ceil(n / 64)); block x of the GEMM finds its group by binary search in that numbering.
//   vary_k: block (g, m tile, n tile) reduces over group g's rows; an empty group writes beta * C.
#include "cuda_grouped_gemm.h"

#include <cub/block/block_scan.cuh>
#include <mma.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda_bf16.cuh"
#include "cuda_check.h"
#include "cuda_device_error.cuh"
#include "so/core/error.h"

namespace so::cuda {

namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTM = 64, kTN = 64, kTK = 32, kThreads = 128;
constexpr int kScheduleThreads = 1024;
static_assert(kMaxGroupedGemmGroups <= kScheduleThreads, "one schedule thread per group");

struct Args {
  const void* A;
  const void* B;
  void* C;
  const int32_t* offsets;
  int groups;
  int64_t M, N, K;
  float alpha, beta;
  bool trans_b, c_f32, per_group;
  bool vec_a, vec_b;                                // bf16 operands read 16 bytes at a time (load_a8 / load_b8)
  const void* group_matrix[kMaxGroupedGemmGroups];  // per_group: B (vary_m) or C (vary_k) of each group
};

// tile_start[g] = row tiles of the groups before g; tile_start[G] = all of them. Offsets that
// decrease or pass max_rows are recorded (device error) and read as empty groups.
__global__ void __launch_bounds__(kScheduleThreads)
    schedule_kernel(int32_t* tile_start, const int32_t* offsets, int groups, int64_t max_rows, DeviceError* err) {
  using Scan = cub::BlockScan<int32_t, kScheduleThreads>;
  __shared__ typename Scan::TempStorage storage;
  const int g = threadIdx.x;
  int32_t tiles = 0;
  if (g < groups) {
    const int32_t lo = offsets[g], hi = offsets[g + 1];
    if (lo < 0 || hi < lo || hi > max_rows) {
      report_device_error(err, kGroupedGemmOffsets, g, hi, max_rows);
    } else {
      tiles = (hi - lo + kTM - 1) / kTM;
    }
  }
  int32_t start = 0, total = 0;
  Scan(storage).ExclusiveSum(tiles, start, total);
  if (g < groups) tile_start[g] = start;
  if (g == 0) tile_start[groups] = total;
}

template <typename T>
__device__ __forceinline__ float load(const void* p, int64_t i) {
  return to_float(static_cast<const T*>(p)[i]);
}

// Shared tiles: A [kTM][kTK + pad], B [kTK][kTN + pad] in the compute type (bf16 for wmma, fp32).
constexpr int kLdc = kTN + 4;  // the fp32 output staging of the tensor-core tile

template <typename T>
struct Smem {
  static constexpr int kLda = kTK + 8, kLdb = kTN + 8;
  T a[kTM * kLda];
  T b[kTK * kLdb];
};

// The block's problem: output rows [m0, m0 + m_rows) and columns [n0, n0 + kTN) of its group's C,
// reduced over k in [0, k_len). Where element (m, k) of op(A) and (k, n) of op(B) lie:
//   vary_m: A [rows, K] at row r0 + m; B_g [K, N] or [N, K] (trans_b); C [rows, N] at row r0 + m.
//   vary_k: A [rows, M] read transposed (rows r0 + k, column m0 + m); B [rows, N] at row r0 + k;
//           C_g [M, N].
struct Tile {
  int64_t r0, m0, n0;
  int m_rows, k_len;
  const void* b;  // B_g (vary_m)
  void* c;        // C (vary_m) or C_g (vary_k)
};

// bf16 operands in 16-byte chunks of 8 along their contiguous index, where Args::vec_a / vec_b
// say the operand's base is 16-byte aligned and its row stride a multiple of 8 (so a chunk that
// starts inside the matrix lies wholly inside it). A chunk lands in shared memory as one 16-byte
// store when the tile's layout keeps the 8 adjacent, else as 8 scalar stores.
__device__ __forceinline__ uint4 load8(const void* base, int64_t i, bool valid) {
  return valid ? *reinterpret_cast<const uint4*>(static_cast<const bf16*>(base) + i) : make_uint4(0u, 0u, 0u, 0u);
}
__device__ __forceinline__ void scatter8(bf16* dst, int stride, uint4 v) {
  const bf16* x = reinterpret_cast<const bf16*>(&v);
#pragma unroll
  for (int j = 0; j < 8; ++j) dst[j * stride] = x[j];
}

template <bool kVaryK>
__device__ __forceinline__ void load_a8(Smem<bf16>& s, const Args& a, const Tile& t, int k0) {
  constexpr int kLda = Smem<bf16>::kLda;
  for (int c = threadIdx.x; c < kTM * kTK / 8; c += kThreads) {
    if (kVaryK) {  // A [rows, M] transposed: 8 consecutive m of one k
      const int k = c / (kTM / 8), m = (c % (kTM / 8)) * 8;
      const uint4 v = load8(a.A, (t.r0 + k0 + k) * a.M + t.m0 + m, k0 + k < t.k_len && m < t.m_rows);
      scatter8(&s.a[m * kLda + k], kLda, v);
    } else {  // A [rows, K]: 8 consecutive k of one row
      const int m = c / (kTK / 8), k = (c % (kTK / 8)) * 8;
      *reinterpret_cast<uint4*>(&s.a[m * kLda + k]) =
          load8(a.A, (t.r0 + m) * a.K + k0 + k, m < t.m_rows && k0 + k < t.k_len);
    }
  }
}

template <bool kVaryK>
__device__ __forceinline__ void load_b8(Smem<bf16>& s, const Args& a, const Tile& t, int k0) {
  constexpr int kLdb = Smem<bf16>::kLdb;
  for (int c = threadIdx.x; c < kTK * kTN / 8; c += kThreads) {
    if (!kVaryK && a.trans_b) {  // B_g [N, K]: 8 consecutive k of one n
      const int n = c / (kTK / 8), k = (c % (kTK / 8)) * 8;
      const uint4 v = load8(t.b, (t.n0 + n) * a.K + k0 + k, t.n0 + n < a.N && k0 + k < t.k_len);
      scatter8(&s.b[k * kLdb + n], kLdb, v);
    } else {  // B [rows, N] or B_g [K, N]: 8 consecutive n of one k
      const int k = c / (kTN / 8), n = (c % (kTN / 8)) * 8;
      const int64_t row = kVaryK ? t.r0 + k0 + k : static_cast<int64_t>(k0 + k);
      const void* base = kVaryK ? a.B : t.b;
      *reinterpret_cast<uint4*>(&s.b[k * kLdb + n]) =
          load8(base, row * a.N + t.n0 + n, k0 + k < t.k_len && t.n0 + n < a.N);
    }
  }
}

template <typename T, bool kVaryK>
__device__ __forceinline__ void load_tiles(Smem<T>& s, const Args& a, const Tile& t, int k0) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (a.vec_a && a.vec_b) {
      load_a8<kVaryK>(s, a, t, k0);
      load_b8<kVaryK>(s, a, t, k0);
      return;
    }
  }
  // A: contiguous along k (vary_m) or along m (vary_k); threads walk the contiguous index fastest.
  for (int i = threadIdx.x; i < kTM * kTK; i += kThreads) {
    const int m = kVaryK ? i % kTM : i / kTK, k = kVaryK ? i / kTM : i % kTK;
    float v = 0.0f;
    if (m < t.m_rows && k0 + k < t.k_len)
      v = kVaryK ? load<T>(a.A, (t.r0 + k0 + k) * a.M + t.m0 + m) : load<T>(a.A, (t.r0 + m) * a.K + k0 + k);
    s.a[m * Smem<T>::kLda + k] = from_float<T>(v);
  }
  // B: contiguous along n, except trans_b (along k).
  const bool k_fast = !kVaryK && a.trans_b;
  for (int i = threadIdx.x; i < kTK * kTN; i += kThreads) {
    const int k = k_fast ? i % kTK : i / kTN, n = k_fast ? i / kTK : i % kTN;
    float v = 0.0f;
    if (k0 + k < t.k_len && t.n0 + n < a.N) {
      if (kVaryK)
        v = load<T>(a.B, (t.r0 + k0 + k) * a.N + t.n0 + n);
      else if (a.trans_b)
        v = load<T>(t.b, (t.n0 + n) * a.K + k0 + k);
      else
        v = load<T>(t.b, static_cast<int64_t>(k0 + k) * a.N + t.n0 + n);
    }
    s.b[k * Smem<T>::kLdb + n] = from_float<T>(v);
  }
}

// C = alpha * acc + beta * C for the tile's valid elements; beta 0 never reads C (it may hold NaN).
__device__ __forceinline__ void store_c(const Args& a, const Tile& t, int m, int n, float acc) {
  if (m >= t.m_rows || t.n0 + n >= a.N) return;
  const int64_t i = (t.m0 + m) * a.N + t.n0 + n;
  if (a.c_f32) {
    float* c = static_cast<float*>(t.c);
    c[i] = a.alpha * acc + (a.beta != 0.0f ? a.beta * c[i] : 0.0f);
  } else {
    bf16* c = static_cast<bf16*>(t.c);
    c[i] = from_float<bf16>(a.alpha * acc + (a.beta != 0.0f ? a.beta * to_float(c[i]) : 0.0f));
  }
}

// The block's tile of C, tensor cores: warp w owns rows (w / 2) * 32 and columns (w % 2) * 32,
// 2 x 2 fragments of 16 x 16.
template <bool kVaryK>
__device__ void tile_bf16(const Args& a, const Tile& t) {
  __shared__ __align__(32) Smem<bf16> s;
  __shared__ __align__(32) float sc[kTM * kLdc];
  const int warp = threadIdx.x / 32, wr = (warp / 2) * 32, wc = (warp % 2) * 32;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
  for (auto& row : acc)
    for (auto& f : row) wmma::fill_fragment(f, 0.0f);
  for (int k0 = 0; k0 < t.k_len; k0 += kTK) {
    load_tiles<bf16, kVaryK>(s, a, t, k0);
    __syncthreads();
    const auto* sa = reinterpret_cast<const __nv_bfloat16*>(s.a);
    const auto* sb = reinterpret_cast<const __nv_bfloat16*>(s.b);
#pragma unroll
    for (int kk = 0; kk < kTK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb[2];
      for (int i = 0; i < 2; ++i)
        wmma::load_matrix_sync(fa[i], sa + (wr + i * 16) * Smem<bf16>::kLda + kk, Smem<bf16>::kLda);
      for (int j = 0; j < 2; ++j)
        wmma::load_matrix_sync(fb[j], sb + kk * Smem<bf16>::kLdb + wc + j * 16, Smem<bf16>::kLdb);
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    __syncthreads();
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(sc + (wr + i * 16) * kLdc + wc + j * 16, acc[i][j], kLdc, wmma::mem_row_major);
  __syncthreads();
  for (int i = threadIdx.x; i < kTM * kTN; i += kThreads)
    store_c(a, t, i / kTN, i % kTN, sc[(i / kTN) * kLdc + i % kTN]);
}

// The same in fp32: thread (ty, tx) of a 16 x 8 grid owns rows ty * 4 .. + 4, columns tx * 8 .. + 8.
template <bool kVaryK>
__device__ void tile_f32(const Args& a, const Tile& t) {
  __shared__ Smem<float> s;
  const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;
  float acc[4][8] = {};
  for (int k0 = 0; k0 < t.k_len; k0 += kTK) {
    load_tiles<float, kVaryK>(s, a, t, k0);
    __syncthreads();
    for (int k = 0; k < kTK; ++k) {
      float av[4], bv[8];
      for (int i = 0; i < 4; ++i) av[i] = s.a[(ty * 4 + i) * Smem<float>::kLda + k];
      for (int j = 0; j < 8; ++j) bv[j] = s.b[k * Smem<float>::kLdb + tx * 8 + j];
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 8; ++j) store_c(a, t, ty * 4 + i, tx * 8 + j, acc[i][j]);
}

template <typename T, bool kVaryK>
__device__ __forceinline__ void run_tile(const Args& a, const Tile& t) {
  if constexpr (std::is_same_v<T, bf16>)
    tile_bf16<kVaryK>(a, t);
  else
    tile_f32<kVaryK>(a, t);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) vary_m_kernel(const __grid_constant__ Args a, const int32_t* tile_start) {
  const int32_t tile = static_cast<int32_t>(blockIdx.x);
  if (tile >= tile_start[a.groups]) return;
  int lo = 0, hi = a.groups - 1;  // the last group whose first tile is <= tile (empty groups share starts)
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tile_start[mid] <= tile)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int g = lo;
  Tile t;
  t.r0 = a.offsets[g] + static_cast<int64_t>(tile - tile_start[g]) * kTM;
  t.m0 = t.r0;  // C's rows are A's
  t.n0 = static_cast<int64_t>(blockIdx.y) * kTN;
  t.m_rows = static_cast<int>(min(static_cast<int64_t>(kTM), a.offsets[g + 1] - t.r0));
  t.k_len = static_cast<int>(a.K);
  t.b = a.per_group ? a.group_matrix[g] : static_cast<const T*>(a.B) + g * a.N * a.K;
  t.c = a.C;
  run_tile<T, false>(a, t);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) vary_k_kernel(const __grid_constant__ Args a) {
  const int g = static_cast<int>(blockIdx.x);
  const int32_t lo = a.offsets[g], hi = a.offsets[g + 1];
  Tile t;
  t.r0 = lo;
  t.m0 = static_cast<int64_t>(blockIdx.y) * kTM;
  t.n0 = static_cast<int64_t>(blockIdx.z) * kTN;
  t.m_rows = static_cast<int>(min(static_cast<int64_t>(kTM), a.M - t.m0));
  t.k_len = hi > lo ? hi - lo : 0;  // an empty group: C = beta * C
  t.b = nullptr;
  t.c =
      a.per_group ? const_cast<void*>(a.group_matrix[g]) : static_cast<char*>(a.C) + g * a.M * a.N * (a.c_f32 ? 4 : 2);
  run_tile<T, true>(a, t);
}

}  // namespace

size_t grouped_gemm_workspace_bytes(const GroupedGemm& g) {
  return g.vary_k() ? 0 : static_cast<size_t>(g.groups + 1) * sizeof(int32_t);
}

void launch_grouped_gemm(cudaStream_t stream, const GroupedGemm& g, void* workspace, DeviceError* err) {
  SO_CHECK(g.groups >= 1 && g.groups <= kMaxGroupedGemmGroups, "grouped_gemm: ", g.groups,
           " groups; the CUDA kernel takes 1 to ", kMaxGroupedGemmGroups);
  SO_CHECK(g.offsets != nullptr && g.max_rows >= 0 && g.max_rows < (int64_t{1} << 31), "grouped_gemm: offsets ",
           g.offsets == nullptr ? "missing" : "", " max_rows ", g.max_rows);
  SO_CHECK(g.ab == g.c || (g.ab == DType::BF16 && g.c == DType::F32), "grouped_gemm: ", dtype_name(g.ab),
           " inputs with ", dtype_name(g.c), " C");
  Args a{};
  a.A = g.A, a.B = g.B, a.C = g.C, a.offsets = g.offsets, a.groups = static_cast<int>(g.groups);
  a.M = g.M, a.N = g.N, a.K = g.K, a.alpha = g.alpha, a.beta = g.beta;
  a.trans_b = g.trans_b, a.c_f32 = g.c == DType::F32, a.per_group = g.per_group != nullptr;
  if (g.per_group != nullptr)
    for (int64_t i = 0; i < g.groups; ++i) a.group_matrix[i] = g.per_group[i];
  const bool bf16_inputs = g.ab == DType::BF16;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  a.vec_a = bf16_inputs && aligned(g.A) && (g.vary_k() ? g.M : g.K) % 8 == 0;
  const int64_t b_contiguous = g.vary_k() ? g.N : (g.trans_b ? g.K : g.N);  // B's elements along a row
  a.vec_b = bf16_inputs && b_contiguous % 8 == 0;
  if (g.vary_k() || g.per_group == nullptr)
    a.vec_b = a.vec_b && aligned(g.B) && (g.vary_k() || (g.N * g.K) % 8 == 0);
  else
    for (int64_t i = 0; i < g.groups; ++i) a.vec_b = a.vec_b && aligned(g.per_group[i]);
  if (g.vary_k()) {
    SO_CHECK(g.M > 0 && g.N > 0, "grouped_gemm (vary_k): M=", g.M, " N=", g.N);
    const dim3 grid(static_cast<unsigned>(g.groups), static_cast<unsigned>((g.M + kTM - 1) / kTM),
                    static_cast<unsigned>((g.N + kTN - 1) / kTN));
    SO_CHECK(grid.y <= 65535 && grid.z <= 65535, "grouped_gemm (vary_k): M=", g.M, " N=", g.N, " past the grid");
    if (bf16_inputs)
      vary_k_kernel<bf16><<<grid, kThreads, 0, stream>>>(a);
    else
      vary_k_kernel<float><<<grid, kThreads, 0, stream>>>(a);
    SO_CUDA_CHECK(cudaGetLastError());
    return;
  }
  SO_CHECK(g.N > 0 && g.K > 0, "grouped_gemm: N=", g.N, " K=", g.K);
  if (g.max_rows == 0) return;
  auto* tile_start = static_cast<int32_t*>(workspace);
  schedule_kernel<<<1, kScheduleThreads, 0, stream>>>(tile_start, g.offsets, static_cast<int>(g.groups), g.max_rows,
                                                      err);
  SO_CUDA_CHECK(cudaGetLastError());
  // At most ceil(rows / 64) full tiles plus one partial tile per group.
  const int64_t slots = (g.max_rows + kTM - 1) / kTM + g.groups;
  const dim3 grid(static_cast<unsigned>(slots), static_cast<unsigned>((g.N + kTN - 1) / kTN));
  SO_CHECK(grid.y <= 65535, "grouped_gemm: N=", g.N, " past the grid");
  if (bf16_inputs)
    vary_m_kernel<bf16><<<grid, kThreads, 0, stream>>>(a, tile_start);
  else
    vary_m_kernel<float><<<grid, kThreads, 0, stream>>>(a, tile_start);
  SO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace so::cuda
