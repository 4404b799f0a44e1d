#pragma once
// The CPU backend: "device" memory is host memory drawn from an accounted pool (with an optional
// capacity, to emulate an HBM budget); streams are worker threads; ops are the kernels in
// cpu_kernels.h run on those threads.
#include <array>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>

#include "cpu_stream.h"
#include "so/backend/backend.h"

namespace so::cpu {

class CpuOps;

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& opts);
  ~CpuBackend() override;

  std::string name() const override { return "cpu"; }
  bool device_is_host() const override { return true; }

  DeviceBuffer alloc(size_t bytes, const char* tag) override;
  MemoryStats memory_stats() const override;
  size_t allocation_granularity() const override;

  Stream& stream(StreamKind kind) override { return *streams_[static_cast<int>(kind)]; }
  std::unique_ptr<Event> create_event() override { return std::make_unique<CpuEvent>(); }
  void record(Event& e, Stream& s) override;
  void wait(Stream& s, Event& e) override;
  void synchronize(Event& e) override;
  double event_time(Event& e) override;
  void synchronize(Stream& s) override { as_cpu(s).synchronize(); }
  void host_func(Stream& s, std::function<void()> fn) override { as_cpu(s).enqueue(std::move(fn)); }

  void copy_h2d(void* dst, const void* src, size_t bytes, Stream& s) override { copy(dst, src, bytes, s); }
  void copy_h2d_sync(void* dst, const void* src, size_t bytes, Stream& s) override {
    synchronize(s);
    std::memcpy(dst, src, bytes);
  }
  void copy_d2h(void* dst, const void* src, size_t bytes, Stream& s) override { copy(dst, src, bytes, s); }
  void copy_d2d(void* dst, const void* src, size_t bytes, Stream& s) override { copy(dst, src, bytes, s); }
  void memset_zero(void* dst, size_t bytes, Stream& s) override;

  Ops& ops() override;
  double peak_tflops(DType dt) override;
  double measured_gemm_tflops(DType dt) override { return peak_tflops(dt); }

  static CpuStream& as_cpu(Stream& s) { return static_cast<CpuStream&>(s); }

 protected:
  void free(void* ptr, size_t bytes) override;

 private:
  void copy(void* dst, const void* src, size_t bytes, Stream& s);

  size_t capacity_;
  mutable std::mutex mem_mu_;
  size_t in_use_ = 0;
  size_t peak_ = 0;
  std::array<std::unique_ptr<CpuStream>, kNumStreamKinds> streams_;
  std::unique_ptr<CpuOps> ops_;
  double peak_tflops_ = 0.0;
};

}  // namespace so::cpu
