#include "cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cpu_kernels.h"
#include "cpu_ops.h"
#include "so/core/cpu_affinity.h"
#include "so/core/error.h"
#include "so/core/units.h"

namespace so::cpu {

namespace {
constexpr size_t kAlign = 64;
}  // namespace

CpuBackend::CpuBackend(const BackendOptions& opts) : capacity_(opts.device_memory_limit) {
  for (int k = 0; k < kNumStreamKinds; ++k) streams_[k] = std::make_unique<CpuStream>(static_cast<StreamKind>(k));
  ops_ = std::make_unique<CpuOps>(*this);
  // One BLAS pool, sized to the compute cores; only the compute stream calls BLAS. Pinning the
  // compute stream keeps it off the optimizer pool's cores.
  const std::vector<int> cores = opts.compute_cores.empty() ? process_cores() : opts.compute_cores;
  openblas_set_num_threads(opts.compute_threads > 0 ? opts.compute_threads : static_cast<int>(cores.size()));
  if (!opts.compute_cores.empty()) {
    // The copy and communication streams stand in for DMA engines: keep them off the compute
    // cores too (on the remaining cores, when there are any).
    std::vector<int> others;
    for (int c : process_cores())
      if (std::find(cores.begin(), cores.end(), c) == cores.end()) others.push_back(c);
    for (int k = 0; k < kNumStreamKinds; ++k) {
      const std::vector<int> set = k == static_cast<int>(StreamKind::Compute) || others.empty() ? cores : others;
      streams_[k]->enqueue([set, k] {
        SO_CHECK(pin_current_thread(set), "cannot pin the ", stream_kind_name(static_cast<StreamKind>(k)),
                 " stream to cores ", format_core_list(set));
      });
      streams_[k]->synchronize();
    }
  }
}

CpuBackend::~CpuBackend() = default;

DeviceBuffer CpuBackend::alloc(size_t bytes, const char* tag) {
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  {
    std::lock_guard<std::mutex> lock(mem_mu_);
    SO_CHECK(capacity_ == 0 || in_use_ + rounded <= capacity_, "out of device memory allocating '", tag,
             "': ", mib(rounded), " requested, ", mib(in_use_), " in use of ", mib(capacity_));
    in_use_ += rounded;
    peak_ = std::max(peak_, in_use_);
  }
  void* p = rounded ? std::aligned_alloc(kAlign, rounded) : nullptr;
  SO_CHECK(p || rounded == 0, "host allocation of ", mib(rounded), " MiB for '", tag, "' failed");
  if (p) std::memset(p, 0, rounded);
  return DeviceBuffer(this, p, rounded);
}

void CpuBackend::free(void* ptr, size_t bytes) {
  std::free(ptr);
  std::lock_guard<std::mutex> lock(mem_mu_);
  in_use_ -= bytes;
}

size_t CpuBackend::allocation_granularity() const { return kAlign; }

MemoryStats CpuBackend::memory_stats() const {
  std::lock_guard<std::mutex> lock(mem_mu_);
  return MemoryStats{in_use_, peak_, capacity_};
}

void CpuBackend::record(Event& e, Stream& s) {
  auto state = static_cast<CpuEvent&>(e).state;
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    gen = ++state->recorded;
    state->error = nullptr;
  }
  as_cpu(s).enqueue_control([state, gen](std::exception_ptr& err) { state->complete(gen, err); });
}

void CpuBackend::wait(Stream& s, Event& e) {
  auto state = static_cast<CpuEvent&>(e).state;
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    gen = state->recorded;
  }
  as_cpu(s).enqueue_control([state, gen](std::exception_ptr& err) {
    std::exception_ptr upstream = state->wait_for(gen);
    if (upstream && !err) err = upstream;
  });
}

void CpuBackend::synchronize(Event& e) { static_cast<CpuEvent&>(e).state->wait_recorded(); }

double CpuBackend::event_time(Event& e) {
  EventState& state = *static_cast<CpuEvent&>(e).state;
  state.wait_recorded();
  std::lock_guard<std::mutex> lock(state.mu);
  return state.completed_at;
}

void CpuBackend::copy(void* dst, const void* src, size_t bytes, Stream& s) {
  as_cpu(s).enqueue([=] { std::memcpy(dst, src, bytes); });
}

void CpuBackend::memset_zero(void* dst, size_t bytes, Stream& s) {
  as_cpu(s).enqueue([=] { std::memset(dst, 0, bytes); });
}

Ops& CpuBackend::ops() { return *ops_; }

// Measured once: the best of a few square sgemms (after a warm-up that starts the BLAS threads)
// large enough to reach steady state on the process's cores. bf16 runs through the same fp32
// GEMM here, so one peak serves both.
double CpuBackend::peak_tflops(DType) {
  if (peak_tflops_ > 0) return peak_tflops_;
  const int64_t n = 1024;
  std::vector<float> a(n * n, 1.0f), b(n * n, 1.0f), c(n * n, 0.0f);
  gemm(false, false, n, n, n, 1.0f, a.data(), b.data(), DType::F32, 0.0f, c.data(), DType::F32);
  double best = 0.0;
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    gemm(false, false, n, n, n, 1.0f, a.data(), b.data(), DType::F32, 0.0f, c.data(), DType::F32);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * n * n * n / s / 1e12);
  }
  peak_tflops_ = best;
  return best;
}

}  // namespace so::cpu
