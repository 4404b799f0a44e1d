#include "so/backend/host_buffer.h"

#include <numa.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <fstream>

#include "so/backend/backend.h"
#include "so/core/error.h"
#include "so/core/round_up.h"

namespace so {

ThpSettings thp_settings() {
  static const ThpSettings settings = [] {
    ThpSettings s;
    std::ifstream enabled("/sys/kernel/mm/transparent_hugepage/enabled");  // e.g. "always [madvise] never"
    std::string line;
    if (std::getline(enabled, line)) {
      const size_t open = line.find('['), close = line.find(']');
      if (open != std::string::npos && close != std::string::npos && close > open)
        s.mode = line.substr(open + 1, close - open - 1);
    }
    std::ifstream size("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size");
    if (!(size >> s.huge_page)) s.huge_page = 0;
    return s;
  }();
  return settings;
}

size_t huge_page_alignment(size_t bytes, const ThpSettings& thp) {
  const bool on = thp.mode == "always" || thp.mode == "madvise";
  return on && thp.huge_page > 0 && bytes >= thp.huge_page ? thp.huge_page : 0;
}

size_t huge_page_bytes(const void* begin, size_t bytes) {
  const auto lo = reinterpret_cast<uintptr_t>(begin), hi = lo + bytes;
  std::ifstream smaps("/proc/self/smaps");
  double total = 0;
  uintptr_t vma_lo = 0, vma_hi = 0;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long a = 0, b = 0, kib = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &a, &b) == 2 && line.find(':') > line.find(' ')) {
      vma_lo = a, vma_hi = b;
    } else if (std::sscanf(line.c_str(), "AnonHugePages: %lu kB", &kib) == 1 && vma_lo < hi && lo < vma_hi) {
      const double overlap = static_cast<double>(std::min(hi, vma_hi) - std::max(lo, vma_lo));
      total += kib * 1024.0 * overlap / static_cast<double>(vma_hi - vma_lo);
    }
  }
  return static_cast<size_t>(total);
}

HostBuffer::HostBuffer(size_t bytes, int numa_node, Backend* pin_with, const char* tag, size_t skew, bool huge_pages)
    : bytes_(bytes), skew_(skew) {
  if (bytes == 0) return;
  const bool numa = numa_available() >= 0;
  if (numa)
    SO_CHECK(numa_node < 0 || numa_node <= numa_max_node(), "host buffer '", tag, "': NUMA node ", numa_node,
             " does not exist (this machine has nodes 0-", numa_max_node(), ")");
  // A size near SIZE_MAX would wrap in the sums below into a small mapping.
  SO_CHECK(bytes <= (SIZE_MAX >> 1) && skew <= (SIZE_MAX >> 2), "host buffer '", tag, "': ", bytes, " bytes (skew ",
           skew, ") is beyond any machine's memory");
  const size_t total = bytes + skew;
  const size_t align = huge_pages ? huge_page_alignment(total, thp_settings()) : 0;
  mapped_ = round_up(total, static_cast<size_t>(sysconf(_SC_PAGESIZE)));
  // Map one alignment unit more than needed, then unmap the head and tail around the aligned span.
  const size_t reserved = mapped_ + align;
  void* raw = mmap(nullptr, reserved, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  SO_CHECK(raw != MAP_FAILED, "host allocation of ", bytes / (1024.0 * 1024.0), " MiB for '", tag,
           "' failed: ", std::strerror(errno));
  char* start = static_cast<char*>(raw);
  if (align > 0) {
    char* aligned = reinterpret_cast<char*>(round_up(reinterpret_cast<uintptr_t>(start), align));
    const size_t head = aligned - start, tail = reserved - head - mapped_;
    if (head > 0) munmap(start, head);
    if (tail > 0) munmap(aligned + mapped_, tail);
    start = aligned;
    // Before the first touch, so the faults below already fill huge pages. Refused (a kernel
    // without THP): ordinary pages, nothing else changes.
    huge_ = madvise(start, mapped_, MADV_HUGEPAGE) == 0;
  }
  ptr_ = start;
  if (numa) {
    if (numa_node >= 0) numa_tonode_memory(ptr_, mapped_, numa_node);
    node_ = numa_node >= 0 ? numa_node : numa_preferred();  // else first touch: this thread's node
  }
  std::memset(ptr_, 0, total);  // first touch: the pages now exist on that node
  if (pin_with) {
    pin_with->pin_host_memory(ptr_, total);
    pinned_by_ = pin_with;
  }
}

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    skew_ = std::exchange(o.skew_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
    node_ = std::exchange(o.node_, -1);
    huge_ = std::exchange(o.huge_, false);
    pinned_by_ = std::exchange(o.pinned_by_, nullptr);
  }
  return *this;
}

void HostBuffer::reset() {
  if (!ptr_) return;
  if (pinned_by_) pinned_by_->unpin_host_memory(ptr_);
  munmap(ptr_, mapped_);
  ptr_ = nullptr;
  bytes_ = skew_ = mapped_ = 0;
  huge_ = false;
  pinned_by_ = nullptr;
}

}  // namespace so
