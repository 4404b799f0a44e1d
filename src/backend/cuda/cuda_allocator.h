#pragma once
// The CUDA backend's caching allocator: device memory is taken from the driver in large segments
// (cudaMalloc) and carved into blocks, so the training step loop never calls cudaMalloc/cudaFree
// once the cache has warmed up. Blocks are 512-byte multiples chosen best-fit, split when larger
// than the request and coalesced with free neighbours of the same segment when freed. Segments go
// back to the driver only at destruction, or when cudaMalloc runs out of memory (cached empty
// segments are released and the cudaMalloc retried once).
//
// free() may run on any host thread, including CUDA host-callback threads (Backend::release_after
// frees inside cudaLaunchHostFunc), where CUDA calls are forbidden: it only takes the mutex and
// updates the free lists. allocate() never holds the mutex across a CUDA call, so a callback
// blocked in free() cannot deadlock against a cudaMalloc/cudaFree that waits for the device.
#include <cstddef>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "so/backend/backend.h"

namespace so::cuda {

class CudaAllocator {
 public:
  static constexpr size_t kBlockAlign = 512;
  // capacity: most bytes in use at once (the sum of live blocks, like the CPU backend's budget);
  // 0 = the device's total memory.
  CudaAllocator(int device, size_t capacity);
  ~CudaAllocator();
  CudaAllocator(const CudaAllocator&) = delete;
  CudaAllocator& operator=(const CudaAllocator&) = delete;

  // A block of at least `bytes` (> 0), 512-byte aligned. Throws an so::Error naming `tag`, the
  // request, the bytes in use, the peak and the capacity when over capacity or out of memory.
  void* allocate(size_t bytes, const char* tag);
  // Returns the block at ptr to the cache. No CUDA calls; a pointer this allocator does not own
  // (or owns but already freed) is logged and ignored.
  void free(void* ptr) noexcept;
  MemoryStats stats() const;

 private:
  struct Block {
    size_t size;
    char* segment;  // base of the segment the block lies in (only neighbours there coalesce)
    bool free;
  };

  // Under mu_: a free block of `rounded` bytes, split off the best fit; nullptr when none fits.
  void* take_free_block(size_t rounded, const char* tag);
  // Adds one segment able to hold `rounded` bytes; false when the device has no room for it even
  // after the cached empty segments went back to the driver.
  bool grow(size_t rounded, const char* tag);
  // cudaMalloc of one segment; false on cudaErrorMemoryAllocation, throws on other errors.
  bool add_segment(size_t bytes, const char* tag);
  // Returns every cached segment with no block in use to the driver; false if there was none.
  bool release_empty_segments();
  std::string describe(size_t requested, const char* tag) const;  // under mu_

  const int device_;
  const size_t capacity_;
  mutable std::mutex mu_;
  std::map<char*, Block> blocks_;            // every block, by address
  std::set<std::pair<size_t, char*>> free_;  // free blocks by (size, address): best fit
  std::map<char*, size_t> segments_;         // segment base -> bytes
  size_t reserved_ = 0;                      // bytes in segments
  size_t in_use_ = 0;
  size_t peak_ = 0;
};

}  // namespace so::cuda
