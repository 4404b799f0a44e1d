#pragma once
// The CUDA backend: device memory from a caching allocator, the engine's lanes as CUDA
// streams, events as CUDA events, ops as CUDA kernels and cuBLASLt GEMMs.
//
// Errors follow the CPU backend's contract: whatever fails asynchronously (a kernel fault, a bad
// token id found inside a kernel, an exception thrown by a host function) is reported as an
// so::Error at the next host synchronisation (synchronize or event_time), once.
//
// Every call makes the backend's device current on the calling thread first, so any host thread
// may use the backend.
#include <array>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "cuda_allocator.h"
#include "cuda_device_error.h"
#include "cuda_stream.h"
#include "so/backend/backend.h"

namespace so::cuda {

class CublasLtGemm;
class CudaOps;

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& opts);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }
  bool device_is_host() const override { return false; }
  int device() const { return device_; }

  // Zero-filled, like the CPU backend's: callers rely on it (e.g. Adam moments start at zero).
  DeviceBuffer alloc(size_t bytes, const char* tag) override;
  // Neither zeroed nor synchronised with the host: for workspaces every user writes before it
  // reads (cuDNN's, the ops' scratch), which can be gigabytes.
  DeviceBuffer alloc_uninitialized(size_t bytes, const char* tag);
  MemoryStats memory_stats() const override { return allocator_->stats(); }
  size_t allocation_granularity() const override { return CudaAllocator::kBlockAlign; }

  Stream& stream(StreamKind kind) override { return *streams_[static_cast<int>(kind)]; }
  std::unique_ptr<Event> create_event() override;
  void record(Event& e, Stream& s) override;
  void wait(Stream& s, Event& e) override;
  void synchronize(Event& e) override;
  void synchronize(Stream& s) override;
  double event_time(Event& e) override;
  // fn runs on a CUDA callback thread: it (and the destructors of what it captures) must make no
  // CUDA calls. If it throws, later host functions on the same stream are skipped (their captures
  // are still released) and the exception is rethrown at the next synchronize of any kind.
  void host_func(Stream& s, std::function<void()> fn) override;

  void copy_h2d(void* dst, const void* src, size_t bytes, Stream& s) override;
  void copy_d2h(void* dst, const void* src, size_t bytes, Stream& s) override;
  void copy_d2d(void* dst, const void* src, size_t bytes, Stream& s) override;
  void memset_zero(void* dst, size_t bytes, Stream& s) override;

  void pin_host_memory(void* ptr, size_t bytes) override;
  void unpin_host_memory(void* ptr) override;  // never throws: HostBuffer calls it while destroying

  Ops& ops() override;
  double peak_tflops(DType dt) override;
  double measured_gemm_tflops(DType dt) override;
  void profile_range(bool start) override;

 protected:
  void free(void* ptr, size_t bytes) override;  // no CUDA calls: may run in a host callback

 private:
  struct HostCall;
  // A device timestamp paired with the now_seconds() reading taken when it completed.
  struct ClockAnchor {
    std::unique_ptr<CudaEvent> event;
    double host_seconds;
  };
  struct FreeHostRecord {
    void operator()(DeviceError* p) const;
  };

  static void CUDART_CB host_call_trampoline(void* call);  // the cudaHostFn_t
  void run_host_call(HostCall& call) noexcept;
  void make_current() const;
  // After a host synchronisation: reports (throws) a kernel-recorded error, a host function's
  // exception, the synchronising call's own error, then any CUDA error left pending on this thread.
  void check_after_sync(cudaError_t sync_result, const std::string& what);
  void check_enqueued(cudaError_t result, const char* op, size_t bytes, const Stream& s) const;
  ClockAnchor take_anchor();  // under util_mu_

  int device_;
  int sm_count_ = 0, clock_khz_ = 0, cc_major_ = 0, cc_minor_ = 0;
  std::string device_name_;  // cudaDeviceProp::name, for the datasheet peak

  // Declared in reverse order of destruction: ops, then the allocator, then the streams.
  std::array<std::unique_ptr<CudaStream>, kNumStreamKinds> streams_;
  // A private stream for zeroing new allocations and taking clock anchors (always idle
  // otherwise), and its lock, which also guards anchors_.
  std::unique_ptr<CudaStream> util_stream_;
  std::mutex util_mu_;
  std::deque<ClockAnchor> anchors_;  // oldest (taken at construction, kept) first
  std::unique_ptr<CudaAllocator> allocator_;
  std::unique_ptr<DeviceError, FreeHostRecord> error_record_;  // host-mapped; kernels write it
  DeviceError* error_record_device_ = nullptr;                 // the same record, as kernels see it

  std::mutex host_error_mu_;  // guards the two below and the reading of error_record_
  std::exception_ptr host_error_;
  std::array<bool, kNumStreamKinds> poisoned_{};

  std::unique_ptr<CublasLtGemm> gemm_;
  double measured_gemm_tflops_[2] = {0.0, 0.0};  // fp32, bf16
  std::unique_ptr<CudaOps> ops_;
};

}  // namespace so::cuda
