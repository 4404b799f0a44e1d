#include "cuda_allocator.h"

#include <algorithm>
#include <iterator>
#include <vector>

#include "cuda_check.h"
#include "so/core/log.h"
#include "so/core/round_up.h"
#include "so/core/units.h"

namespace so::cuda {

namespace {

// Segments of 64 MiB (or the request rounded to the driver's 2 MiB page when larger) keep the
// number of cudaMalloc calls small while wasting little on small models.
constexpr size_t kSegmentBytes = size_t{64} << 20;
constexpr size_t kSegmentGranularity = size_t{2} << 20;

size_t device_total_memory(int device) {
  SO_CUDA_CHECK(cudaSetDevice(device));
  size_t free_bytes = 0, total_bytes = 0;
  SO_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return total_bytes;
}

}  // namespace

CudaAllocator::CudaAllocator(int device, size_t capacity)
    : device_(device), capacity_(capacity ? capacity : device_total_memory(device)) {}

CudaAllocator::~CudaAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  if (in_use_ != 0)
    log(LogLevel::Error, str_cat("CUDA allocator destroyed with ", mib(in_use_),
                                 " MiB still allocated (device buffers outlived the backend)"));
  if (segments_.empty()) return;
  SO_CUDA_WARN(cudaSetDevice(device_));
  for (const auto& [base, bytes] : segments_) SO_CUDA_WARN(cudaFree(base));
}

std::string CudaAllocator::describe(size_t requested, const char* tag) const {
  return str_cat("'", tag, "': ", mib(requested), " requested, ", mib(in_use_), " in use (peak ", mib(peak_), ") of ",
                 mib(capacity_), " capacity on CUDA device ", device_, ", ", mib(reserved_), " reserved in ",
                 segments_.size(), " cached segments");
}

void* CudaAllocator::allocate(size_t bytes, const char* tag) {
  SO_CHECK(bytes > 0, "CUDA allocator: zero-byte allocation for '", tag, "'");
  if (bytes > capacity_) {  // also keeps round_up from overflowing
    std::lock_guard<std::mutex> lock(mu_);
    SO_FAIL("out of device memory (over capacity) allocating ", describe(bytes, tag));
  }
  const size_t rounded = round_up(bytes, kBlockAlign);
  // Another thread may take the new segment's space between grow() and the retry; a few rounds
  // cover that, a persistent failure is reported as out of memory.
  for (int round = 0; round < 4; ++round) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (void* p = take_free_block(rounded, tag)) return p;
    }
    if (!grow(rounded, tag)) break;
  }
  std::lock_guard<std::mutex> lock(mu_);
  SO_FAIL("out of device memory (cudaMalloc failed) allocating ", describe(bytes, tag));
}

void* CudaAllocator::take_free_block(size_t rounded, const char* tag) {
  SO_CHECK(in_use_ + rounded <= capacity_, "out of device memory (over capacity) allocating ", describe(rounded, tag));
  auto fit = free_.lower_bound({rounded, nullptr});
  if (fit == free_.end()) return nullptr;
  char* ptr = fit->second;
  free_.erase(fit);
  Block& b = blocks_.at(ptr);
  if (b.size > rounded) {  // split: the tail stays free (both are 512-byte multiples)
    const size_t rest = b.size - rounded;
    blocks_.emplace(ptr + rounded, Block{rest, b.segment, true});
    free_.emplace(rest, ptr + rounded);
    b.size = rounded;
  }
  b.free = false;
  in_use_ += rounded;
  peak_ = std::max(peak_, in_use_);
  return ptr;
}

bool CudaAllocator::grow(size_t rounded, const char* tag) {
  const size_t fitted = round_up(rounded, kSegmentGranularity);
  const size_t preferred = std::max(kSegmentBytes, fitted);
  if (add_segment(preferred, tag)) return true;
  if (fitted < preferred && add_segment(fitted, tag)) return true;
  // Out of memory: cached empty segments may be in the way (e.g. many small ones where one large
  // request now has to go); hand them back and retry once.
  return release_empty_segments() && add_segment(fitted, tag);
}

bool CudaAllocator::add_segment(size_t bytes, const char* tag) {
  // Outside mu_: cudaMalloc may wait on the device, whose host callbacks may be waiting in free().
  SO_CUDA_CHECK(cudaSetDevice(device_));
  void* base = nullptr;
  const cudaError_t err = cudaMalloc(&base, bytes);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // handled here: keep it from surfacing at the next error check
    return false;
  }
  if (err != cudaSuccess)
    SO_FAIL("cudaMalloc of a ", mib(bytes), " MiB segment for '", tag, "' failed: ", cudaGetErrorName(err), " (",
            cudaGetErrorString(err), ")");
  char* seg = static_cast<char*>(base);
  std::lock_guard<std::mutex> lock(mu_);
  segments_.emplace(seg, bytes);
  blocks_.emplace(seg, Block{bytes, seg, true});
  free_.emplace(bytes, seg);
  reserved_ += bytes;
  return true;
}

bool CudaAllocator::release_empty_segments() {
  std::vector<char*> empty;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = segments_.begin(); it != segments_.end();) {
      const auto block = blocks_.find(it->first);
      if (block != blocks_.end() && block->second.free && block->second.size == it->second) {
        free_.erase({block->second.size, it->first});
        blocks_.erase(block);
        reserved_ -= it->second;
        empty.push_back(it->first);
        it = segments_.erase(it);
      } else {
        ++it;
      }
    }
  }
  SO_CUDA_CHECK(cudaSetDevice(device_));
  for (char* base : empty) SO_CUDA_CHECK(cudaFree(base));
  return !empty.empty();
}

void CudaAllocator::free(void* p) noexcept {
  char* ptr = static_cast<char*>(p);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blocks_.find(ptr);
  if (it == blocks_.end() || it->second.free) {
    log(LogLevel::Error, str_cat("CUDA allocator: free of ", p, ", which ",
                                 it == blocks_.end() ? "it did not allocate" : "is already free", " (ignored)"));
    return;
  }
  in_use_ -= it->second.size;
  it->second.free = true;
  // Coalesce with the next block, then with the previous one, when free and in the same segment.
  auto next = std::next(it);
  if (next != blocks_.end() && next->second.free && next->second.segment == it->second.segment) {
    free_.erase({next->second.size, next->first});
    it->second.size += next->second.size;
    blocks_.erase(next);
  }
  if (it != blocks_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.free && prev->second.segment == it->second.segment) {
      free_.erase({prev->second.size, prev->first});
      prev->second.size += it->second.size;
      blocks_.erase(it);
      it = prev;
    }
  }
  free_.emplace(it->second.size, it->first);
}

MemoryStats CudaAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return MemoryStats{in_use_, peak_, capacity_};
}

}  // namespace so::cuda
