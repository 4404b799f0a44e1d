#pragma once
// RAII owner of host memory for offloaded optimizer state: placed on one NUMA node with libnuma
// (the rank's node, so the optimizer reads local memory), backed by transparent huge pages when it
// is large enough, and, when asked, pinned through the backend so copy engines reach it at full
// link speed.
#include <cstddef>
#include <string>
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

// Transparent huge pages as this kernel offers them (/sys/kernel/mm/transparent_hugepage). Streaming
// GraceAdam's arrays through 4 KiB pages costs a TLB miss every 4 KiB of each stream; on an AMD EPYC
// the step ran ~10% faster from 2 MiB pages (docs/optimizer.md). With THP in `madvise` mode (the
// Debian and RHEL default) memory only gets them if it asks, with madvise(MADV_HUGEPAGE).
struct ThpSettings {
  std::string mode;      // "always", "madvise" or "never"; empty when the kernel has no THP
  size_t huge_page = 0;  // bytes of one PMD-sized page: 2 MiB on x86, 512 MiB on 64 KiB-page arm64
};
ThpSettings thp_settings();  // this machine's, read once
// The alignment a buffer of `bytes` gets: the huge page when it spans at least one and THP is on
// (`always` or `madvise`), else 0 (ordinary pages, no madvise).
size_t huge_page_alignment(size_t bytes, const ThpSettings& thp);
// How many bytes of [begin, begin + bytes) the kernel backs with huge pages right now: the
// AnonHugePages of the mappings that overlap it in /proc/self/smaps, each prorated by its overlap
// (adjacent buffers with the same flags share one mapping). 0 where smaps cannot be read.
size_t huge_page_bytes(const void* begin, size_t bytes);

class HostBuffer {
 public:
  HostBuffer() = default;
  // numa_node < 0 or a machine without NUMA support: the calling thread's local node. data() is
  // `skew` bytes past the start of the allocation (see stream_skew). huge_pages: align the
  // allocation to a huge page and madvise(MADV_HUGEPAGE) it when huge_page_alignment says so.
  HostBuffer(size_t bytes, int numa_node, Backend* pin_with, const char* tag, size_t skew = 0, bool huge_pages = true);
  HostBuffer(HostBuffer&& o) noexcept { *this = std::move(o); }
  HostBuffer& operator=(HostBuffer&& o) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() { reset(); }

  void reset();
  void* data() const { return ptr_ ? static_cast<char*>(ptr_) + skew_ : nullptr; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data());
  }
  size_t bytes() const { return bytes_; }
  int numa_node() const { return node_; }  // where the pages are, -1 when unknown
  bool pinned() const { return pinned_by_ != nullptr; }
  // The allocation starts on a huge-page boundary and madvise(MADV_HUGEPAGE) accepted it (whether
  // the kernel found free huge pages for it is its business: /proc/self/smaps, AnonHugePages).
  bool huge_pages() const { return huge_; }
  size_t huge_page_bytes() const { return ptr_ ? so::huge_page_bytes(ptr_, mapped_) : 0; }
  size_t mapped_bytes() const { return mapped_; }

 private:
  void* ptr_ = nullptr;  // the mapping; data() = ptr_ + skew_
  size_t bytes_ = 0, skew_ = 0, mapped_ = 0;
  int node_ = -1;
  bool huge_ = false;
  Backend* pinned_by_ = nullptr;
};

}  // namespace so
