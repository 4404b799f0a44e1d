#include "so/backend/host_buffer.h"

#include <numa.h>

#include <cstdlib>
#include <cstring>

#include "so/backend/backend.h"
#include "so/core/error.h"

namespace so {

HostBuffer::HostBuffer(size_t bytes, int numa_node, Backend* pin_with, const char* tag, size_t skew)
    : bytes_(bytes), skew_(skew) {
  if (bytes == 0) return;
  const size_t total = bytes + skew;
  numa_ = numa_available() >= 0;
  if (numa_) {
    SO_CHECK(numa_node < 0 || numa_node <= numa_max_node(), "host buffer '", tag, "': NUMA node ", numa_node,
             " does not exist (this machine has nodes 0-", numa_max_node(), ")");
    ptr_ = numa_node >= 0 ? numa_alloc_onnode(total, numa_node) : numa_alloc_local(total);
    node_ = numa_node >= 0 ? numa_node : numa_preferred();
  } else {
    ptr_ = std::aligned_alloc(4096, (total + 4095) / 4096 * 4096);
  }
  SO_CHECK(ptr_, "host allocation of ", bytes / (1024.0 * 1024.0), " MiB for '", tag, "' failed",
           numa_node >= 0 ? str_cat(" on NUMA node ", numa_node) : "");
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
    node_ = std::exchange(o.node_, -1);
    numa_ = std::exchange(o.numa_, false);
    pinned_by_ = std::exchange(o.pinned_by_, nullptr);
  }
  return *this;
}

void HostBuffer::reset() {
  if (!ptr_) return;
  if (pinned_by_) pinned_by_->unpin_host_memory(ptr_);
  if (numa_)
    numa_free(ptr_, bytes_ + skew_);
  else
    std::free(ptr_);
  ptr_ = nullptr;
  bytes_ = skew_ = 0;
  pinned_by_ = nullptr;
}

}  // namespace so
