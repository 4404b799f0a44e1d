// Token embedding lookup and its gradient.
//
// The backward is deterministic and equals the CPU bit for bit: every id's tokens are added in
// position order, rounding to the storage type after each add. Rather than atomics (whose order
// varies), the (id, position) pairs are radix-sorted (CUB, stable, so equal ids keep position
// order) and one block per distinct id walks its run, accumulating a row slice in registers: each
// touched table row is read and written once. Cost: a 4-array sort of T int32 pairs (tens of
// microseconds for T ~ 10^4) plus a read of dout; a frequent id (padding) makes one long serial
// run, O(run length) loads per thread, which is still far from the step's critical path.
#include <cub/device/device_radix_sort.cuh>

#include "cuda_bf16.cuh"
#include "cuda_check.h"
#include "cuda_device_error.cuh"
#include "cuda_kernels.h"
#include "cuda_launch.cuh"
#include "cuda_row_gather.cuh"

namespace so::cuda {

namespace {

// Source row of out[t]: the token's table row, or -1 (row skipped) for an id outside [0, V).
struct TokenRow {
  const int32_t* tokens;
  int64_t V;
  DeviceError* err;
  __device__ int64_t operator()(int64_t t) const {
    const int32_t id = tokens[t];
    if (id >= 0 && id < V) return id;
    if (threadIdx.x == 0) report_device_error(err, kTokenOutOfRange, t, id, V);
    return -1;
  }
};

// keys[t] = tokens[t], or V (a key sorting after every valid id, then skipped) for a bad id;
// positions[t] = t.
__global__ void embedding_sort_inputs_kernel(uint32_t* keys, int32_t* positions, const int32_t* tokens, int64_t T,
                                             int64_t V, DeviceError* err) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < T;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t id = tokens[t];
    const bool valid = id >= 0 && id < V;
    if (!valid) report_device_error(err, kTokenOutOfRange, t, id, V);
    keys[t] = valid ? static_cast<uint32_t>(id) : static_cast<uint32_t>(V);
    positions[t] = static_cast<int32_t>(t);
  }
}

// First index in [lo, T) whose key differs from key (keys sorted ascending).
__device__ int64_t run_end(const uint32_t* keys, int64_t lo, int64_t T, uint32_t key) {
  int64_t hi = T;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (keys[mid] <= key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// Block per sorted index i; the block at the start of an id's run adds the run's dout rows, in
// position order, to that id's table row. Threads own N-element column groups of the row.
template <typename T, int N>
__global__ void embedding_backward_runs_kernel(T* dtable, const T* dout, const uint32_t* keys, const int32_t* positions,
                                               int64_t T_, int64_t V, int64_t H, int64_t padding_idx) {
  for (int64_t i = blockIdx.x; i < T_; i += gridDim.x) {
    const uint32_t key = keys[i];
    if (key == static_cast<uint32_t>(V) || key == padding_idx || (i > 0 && keys[i - 1] == key)) continue;
    const int64_t end = run_end(keys, i + 1, T_, key);
    T* row = dtable + static_cast<int64_t>(key) * H;
    for (int64_t c = threadIdx.x * static_cast<int64_t>(N); c < H; c += static_cast<int64_t>(blockDim.x) * N) {
      float acc[N];
      load_f32<N>(acc, row, c, H);
#pragma unroll 4
      for (int64_t j = i; j < end; ++j) {
        float g[N];
        load_f32<N>(g, dout + static_cast<int64_t>(positions[j]) * H, c, H);
#pragma unroll
        for (int k = 0; k < N; ++k) acc[k] = to_float(from_float<T>(acc[k] + g[k]));
      }
      store_f32<N>(row, acc, c, H);
    }
  }
}

// Offsets of the workspace arrays, each 256-byte aligned.
struct SortWorkspace {
  size_t keys_in, keys_out, positions_in, positions_out, cub_temp, cub_bytes, total;
};

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

// Sort key bits: enough for the sentinel V.
int key_bits(int64_t V) {
  int bits = 1;
  while (bits < 32 && (int64_t{1} << bits) <= V) ++bits;
  return bits;
}

SortWorkspace sort_workspace(int64_t T, int64_t V) {
  SO_CHECK(T <= INT32_MAX && V <= INT32_MAX, "embedding_backward: T = ", T, " and V = ", V, " must fit in int32");
  size_t cub_bytes = 0;
  SO_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, cub_bytes, static_cast<const uint32_t*>(nullptr),
                                                static_cast<uint32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), static_cast<int>(T), 0, key_bits(V)));
  const size_t array = align256(static_cast<size_t>(T) * 4);
  // keys in, keys out, positions in, positions out, CUB's temporary storage.
  return SortWorkspace{0, array, 2 * array, 3 * array, 4 * array, cub_bytes, 4 * array + align256(cub_bytes)};
}

}  // namespace

void launch_embedding_forward(cudaStream_t stream, void* out, const void* table, const int32_t* tokens, int64_t T,
                              int64_t V, int64_t H, DType dt, DeviceError* err) {
  launch_gather_rows(stream, out, table, T, static_cast<size_t>(H) * dtype_size(dt), TokenRow{tokens, V, err});
}

size_t embedding_backward_workspace_bytes(int64_t T, int64_t V) { return T == 0 ? 0 : sort_workspace(T, V).total; }

void launch_embedding_backward(cudaStream_t stream, void* dtable_acc, const void* dout, const int32_t* tokens,
                               int64_t T, int64_t V, int64_t H, int64_t padding_idx, DType dt, DeviceError* err,
                               void* workspace, size_t workspace_bytes) {
  if (T == 0 || H == 0) return;
  const SortWorkspace ws = sort_workspace(T, V);
  SO_CHECK(workspace_bytes >= ws.total, "embedding_backward: workspace of ", workspace_bytes, " bytes, need ",
           ws.total);
  char* base = static_cast<char*>(workspace);
  auto* keys_in = reinterpret_cast<uint32_t*>(base + ws.keys_in);
  auto* keys_out = reinterpret_cast<uint32_t*>(base + ws.keys_out);
  auto* positions_in = reinterpret_cast<int32_t*>(base + ws.positions_in);
  auto* positions_out = reinterpret_cast<int32_t*>(base + ws.positions_out);

  embedding_sort_inputs_kernel<<<grid_for_elements(T, 1), kBlockThreads, 0, stream>>>(keys_in, positions_in, tokens, T,
                                                                                      V, err);
  SO_CUDA_CHECK(cudaGetLastError());
  size_t cub_bytes = ws.cub_bytes;
  SO_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + ws.cub_temp, cub_bytes, keys_in, keys_out, positions_in,
                                                positions_out, static_cast<int>(T), 0, key_bits(V), stream));
  dispatch_dtype(dt, [&](auto t) {
    using X = decltype(t);
    with_vector_width<kVec16<X>>(aligned16(dtable_acc) && aligned16(dout) && H % kVec16<X> == 0, [&](auto w) {
      constexpr int N = decltype(w)::value;
      embedding_backward_runs_kernel<X, N><<<grid_for(T), kBlockThreads, 0, stream>>>(
          static_cast<X*>(dtable_acc), static_cast<const X*>(dout), keys_out, positions_out, T, V, H, padding_idx);
      SO_CUDA_CHECK(cudaGetLastError());
    });
  });
}

}  // namespace so::cuda
