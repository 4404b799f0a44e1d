#include "cuda_stream.h"

#include "cuda_check.h"

namespace so::cuda {

// Non-blocking: the backend's streams must not serialise with the legacy default stream, which
// libraries (and stray synchronous calls) may use.
CudaStream::CudaStream(StreamKind kind, int priority) : kind_(kind) {
  cudaError_t err = cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority);
  if (err != cudaSuccess)
    SO_FAIL("cannot create the CUDA ", stream_kind_name(kind), " stream (priority ", priority,
            "): cudaStreamCreateWithPriority: ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
}

CudaStream::~CudaStream() {
  if (stream_) SO_CUDA_WARN(cudaStreamDestroy(stream_));
}

CudaEvent::CudaEvent() { SO_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDefault)); }

CudaEvent::~CudaEvent() {
  if (event_) SO_CUDA_WARN(cudaEventDestroy(event_));
}

}  // namespace so::cuda
