#pragma once
// RAII owner of host memory for offloaded optimizer state: placed on one NUMA node with libnuma
// (the rank's node, so the optimizer reads local memory) and, when asked, pinned through the
// backend so copy engines reach it at full link speed.
#include <cstddef>
#include <utility>

namespace so {

class Backend;

class HostBuffer {
 public:
  HostBuffer() = default;
  // numa_node < 0 or a machine without NUMA support: the calling thread's local node.
  HostBuffer(size_t bytes, int numa_node, Backend* pin_with, const char* tag);
  HostBuffer(HostBuffer&& o) noexcept { *this = std::move(o); }
  HostBuffer& operator=(HostBuffer&& o) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() { reset(); }

  void reset();
  void* data() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }
  int numa_node() const { return node_; }  // where the pages are, -1 when unknown
  bool pinned() const { return pinned_by_ != nullptr; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  int node_ = -1;
  bool numa_ = false;  // allocated by libnuma (else aligned_alloc)
  Backend* pinned_by_ = nullptr;
};

}  // namespace so
