#pragma once
// The backend: "device" memory, ordered asynchronous streams with events, copies, and the ops.
// The model and the engine talk only to this interface; the CPU backend implements streams as
// worker threads, the CUDA backend as CUDA streams.
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "so/backend/device_buffer.h"
#include "so/backend/ops.h"

namespace so {

// The engine's lanes. Compute runs the model; the copy lanes move gradients down (D2H) and
// weights up (H2D) while compute continues; Comm runs collectives; Snapshot copies checkpoint
// state to the host at the lowest priority, off the D2H lane, so that a save's copies never queue
// ahead of the next step's (ordered against the updates by events).
enum class StreamKind { Compute = 0, D2H = 1, H2D = 2, Comm = 3, Snapshot = 4 };
constexpr int kNumStreamKinds = 5;
const char* stream_kind_name(StreamKind k);

class Stream {
 public:
  virtual ~Stream() = default;
  virtual StreamKind kind() const = 0;
};

class Event {
 public:
  virtual ~Event() = default;
};

struct MemoryStats {
  size_t in_use = 0;
  size_t peak = 0;
  size_t capacity = 0;  // 0 = unlimited
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Whether device memory is directly addressable by the host (true for the CPU backend).
  virtual bool device_is_host() const = 0;

  // Device memory. Fails with an error naming `tag` and the sizes when over capacity.
  virtual DeviceBuffer alloc(size_t bytes, const char* tag) = 0;
  virtual MemoryStats memory_stats() const = 0;
  // Every allocation is rounded up to a multiple of this many bytes (the memory planner's unit).
  virtual size_t allocation_granularity() const = 0;

  virtual Stream& stream(StreamKind kind) = 0;
  virtual std::unique_ptr<Event> create_event() = 0;
  virtual void record(Event& e, Stream& s) = 0;  // e completes when s reaches this point
  virtual void wait(Stream& s, Event& e) = 0;    // s does not proceed until e completes
  virtual void synchronize(Event& e) = 0;        // host waits; rethrows stream errors
  virtual void synchronize(Stream& s) = 0;
  void synchronize_all();
  // When e completed, on the now_seconds() clock (waits for it; for spans and stall times).
  virtual double event_time(Event& e) = 0;
  // Runs fn on the host in stream order (cudaLaunchHostFunc semantics).
  virtual void host_func(Stream& s, std::function<void()> fn) = 0;

  virtual void copy_h2d(void* dst, const void* src, size_t bytes, Stream& s) = 0;
  // copy_h2d in stream order that returns when the copy is done (src may be reused at once). The
  // CPU backend copies on the calling thread once s is idle: no hand-off to the stream's thread
  // and back, which costs more than a few MiB of copy when ranks share cores (checkpoint loads).
  virtual void copy_h2d_sync(void* dst, const void* src, size_t bytes, Stream& s);
  virtual void copy_d2h(void* dst, const void* src, size_t bytes, Stream& s) = 0;
  virtual void copy_d2d(void* dst, const void* src, size_t bytes, Stream& s) = 0;
  virtual void memset_zero(void* dst, size_t bytes, Stream& s) = 0;
  // Frees buf once stream s reaches this point (work already enqueued may still use it).
  virtual void release_after(DeviceBuffer buf, Stream& s);

  // Host memory the copy engines read and write directly (cudaHostRegister on CUDA, so copies
  // run at full link speed); a no-op where device memory is host memory.
  virtual void pin_host_memory(void* ptr, size_t bytes) { (void)ptr, (void)bytes; }
  virtual void unpin_host_memory(void* ptr) { (void)ptr; }

  virtual Ops& ops() = 0;

  // Dense peak the backend can reach (for MFU), in TFLOP/s for the given dtype.
  virtual double peak_tflops(DType dt) = 0;
  // A large square GEMM timed on this device once (buffers outside the pool: the run's memory plan
  // is untouched), TFLOP/s: the rate MFU is also reported against. The CPU's peak is this already.
  virtual double measured_gemm_tflops(DType dt) = 0;
  // Brackets work for a profiler (CUDA: cudaProfilerStart/Stop, every stream drained first, for
  // nsys --capture-range=cudaProfilerApi). The CPU backend has nothing to bracket.
  virtual void profile_range(bool start) { (void)start; }

 protected:
  friend class DeviceBuffer;
  virtual void free(void* ptr, size_t bytes) = 0;
};

struct BackendOptions {
  std::string type = "auto";       // auto | cpu | cuda (auto: cuda when a CUDA device is visible)
  int device = -1;                 // CUDA backend: device ordinal (the launcher's GPU for this rank); -1 = 0
  size_t device_memory_limit = 0;  // bytes; 0 = unlimited (CPU backend: emulated HBM budget)
  int compute_threads = 0;         // CPU backend: BLAS/compute threads; 0 = all cores of the process
  std::vector<int> compute_cores;  // CPU backend: cores the compute stream is pinned to; empty = unpinned
  // CUDA backend: "auto" (cuDNN's fused SDPA where it takes the shape, else our flash kernels),
  // "cudnn" (required: an error where it does not) or "flash".
  std::string attention = "auto";
  // false (the default, as PyTorch, Megatron and DeepSpeed run it): cuDNN's fastest backward, whose
  // dQ sums in varying order. true: cuDNN's backward without atomics, so that runs and resumes
  // repeat bit for bit — from cuDNN 9.25 on Hopper its ordered-dQ path (workspace linear in S),
  // before that the dP path (about B*Hq*S^2*2 bytes); where the workspace would exceed
  // 1/kDeterministicAttentionShare of the device, "auto" uses the flash kernels (deterministic
  // too) and says so.
  bool deterministic_attention = false;
};
inline constexpr size_t kDeterministicAttentionShare = 16;

std::unique_ptr<Backend> create_backend(const BackendOptions& opts);

}  // namespace so
