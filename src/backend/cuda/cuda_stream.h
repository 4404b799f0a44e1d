#pragma once
// The CUDA backend's streams and events: thin RAII owners of cudaStream_t / cudaEvent_t that
// implement the backend's Stream and Event. raw() is how ops and the NCCL communicator reach the
// CUDA handle behind a backend stream.
#include <cuda_runtime.h>

#include "so/backend/backend.h"

namespace so::cuda {

class CudaStream final : public Stream {
 public:
  // priority: a CUDA stream priority (lower number = higher priority), see
  // cudaDeviceGetStreamPriorityRange.
  CudaStream(StreamKind kind, int priority);
  ~CudaStream() override;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  StreamKind kind() const override { return kind_; }
  cudaStream_t get() const { return stream_; }

 private:
  StreamKind kind_;
  cudaStream_t stream_ = nullptr;
};

class CudaEvent final : public Event {
 public:
  CudaEvent();  // timing enabled: event_time() needs cudaEventElapsedTime
  ~CudaEvent() override;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

inline cudaStream_t raw(Stream& s) { return static_cast<CudaStream&>(s).get(); }
inline cudaEvent_t raw(Event& e) { return static_cast<CudaEvent&>(e).get(); }

}  // namespace so::cuda
