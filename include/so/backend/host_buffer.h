#pragma once
// RAII owner of host memory for offloaded optimizer state: placed on one NUMA node with libnuma
// (the rank's node, so the optimizer reads local memory) and, when asked, pinned through the
// backend so copy engines reach it at full link speed.
#include <cstddef>
#include <utility>

namespace so {

class Backend;

// Buffers that one loop streams through side by side (an optimizer's p, m, v, grads, ...) each get
// their own skew: their data starts stream_skew(k) bytes into its first page, k = 0, 1, 2, ...
// Page-aligned (and, for large ones, huge-page-aligned) allocations otherwise put element i of
// every stream at the same address modulo 4 KiB and 2 MiB, whatever the size: the same L1 and L2
// sets, 4K aliasing between one stream's stores and another's loads, and the same DRAM bank bits.
// 1088 bytes = 17 cache lines: the first 16 streams are pairwise apart modulo 4 KiB.
constexpr size_t kStreamSkew = 1088;
constexpr size_t stream_skew(int stream) { return static_cast<size_t>(stream) * kStreamSkew; }

class HostBuffer {
 public:
  HostBuffer() = default;
  // numa_node < 0 or a machine without NUMA support: the calling thread's local node. data() is
  // `skew` bytes past the start of the allocation (see stream_skew).
  HostBuffer(size_t bytes, int numa_node, Backend* pin_with, const char* tag, size_t skew = 0);
  HostBuffer(HostBuffer&& o) noexcept { *this = std::move(o); }
  HostBuffer& operator=(HostBuffer&& o) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() { reset(); }

  void reset();
  void* data() const { return ptr_ ? static_cast<char*>(ptr_) + skew_ : nullptr; }
  template <typename T>
  T* as() const { return static_cast<T*>(data()); }
  size_t bytes() const { return bytes_; }
  int numa_node() const { return node_; }  // where the pages are, -1 when unknown
  bool pinned() const { return pinned_by_ != nullptr; }

 private:
  void* ptr_ = nullptr;  // the allocation; data() = ptr_ + skew_
  size_t bytes_ = 0, skew_ = 0;
  int node_ = -1;
  bool numa_ = false;  // allocated by libnuma (else aligned_alloc)
  Backend* pinned_by_ = nullptr;
};

}  // namespace so
