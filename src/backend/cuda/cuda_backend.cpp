#include "cuda_backend.h"

#include <cuda_profiler_api.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "cuda_cast.h"
#include "cuda_check.h"
#include "cuda_gemm.h"
#include "cuda_ops.h"
#include "so/core/clock.h"
#include "so/core/log.h"

namespace so::cuda {

namespace {

// event_time measures events against the newest clock anchor that precedes them. Anchors are
// refreshed this often, so the float milliseconds of cudaEventElapsedTime stay small (precise)
// and drift between the GPU and host clocks cannot accumulate; the oldest is always kept.
constexpr double kAnchorIntervalSeconds = 10.0;
constexpr size_t kMaxAnchors = 64;

std::string cuda_error_text(cudaError_t err) {
  return str_cat(cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
}

// Dense FLOPs per clock per SM of the tensor cores for bf16 inputs with fp32 accumulation (an FMA
// counts as 2), from NVIDIA's architecture whitepapers: A100 312 TFLOP/s = 108 SMs x 1410 MHz x
// 2048; GA102 (RTX A6000) 512; Ada (L40S) 1024; H100 989.4 TFLOP/s = 132 SMs x 1830 MHz x 4096;
// Blackwell B200 twice Hopper per SM. GeForce parts of Ampere/Ada run fp32 accumulation at half
// this rate. Unknown architectures: an Ada-class 1024, an estimate the run config's peak_tflops
// should override.
double tensor_bf16_flops_per_clock(int major, int minor) {
  if (major == 8 && minor == 0) return 2048;
  if (major == 8 && minor == 6) return 512;
  if (major == 8 && minor == 9) return 1024;
  if (major == 9) return 4096;
  if (major == 10) return 8192;
  return 1024;
}

// Datasheet dense bf16 peaks (TFLOP/s), what the field's MFU figures divide by (Megatron-LM,
// torchtitan, llm-foundry): SM count x boost clock overstates them (an H100 SXM reports 1980 MHz:
// 1070.5 against the datasheet's 989.4 at 1830). Matched on the device name; 0 = not listed.
double datasheet_bf16_tflops(const std::string& name) {
  const auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  if (has("H200") && has("NVL")) return 835.5;    // H200 NVL (PCIe card, 600 W): 1671 sparse
  if (has("GH200") || has("H200")) return 989.4;  // H200 SXM, GH200: 1979 sparse
  if (has("H100") && has("PCIe")) return 756.5;
  if (has("H100") && has("NVL")) return 835.5;
  if (has("H100")) return 989.4;  // SXM5 (80GB HBM3)
  if (has("A100")) return 312.0;
  return 0.0;
}

// fp32 FLOPs per clock per SM on the CUDA cores (2 x the fp32 lanes): 64 lanes per SM on Volta
// and A100 (sm_70, sm_80), 128 from GA10x on (sm_86 and later), per the same whitepapers.
double fp32_flops_per_clock(int major, int minor) { return major < 8 || (major == 8 && minor == 0) ? 128 : 256; }

}  // namespace

struct CudaBackend::HostCall {
  CudaBackend* backend;
  StreamKind kind;
  std::function<void()> fn;
};

void CudaBackend::FreeHostRecord::operator()(DeviceError* p) const { SO_CUDA_WARN(cudaFreeHost(p)); }

CudaBackend::CudaBackend(const BackendOptions& opts) : device_(opts.device < 0 ? 0 : opts.device) {
  const int count = device_count();
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  SO_CHECK(count > 0, "CUDA backend: no usable CUDA device (CUDA_VISIBLE_DEVICES=", visible ? visible : "<unset>", ")");
  SO_CHECK(device_ < count, "CUDA backend: device ", device_, " requested, but ", count,
           " CUDA device(s) are visible (ordinals 0-", count - 1,
           "; CUDA_VISIBLE_DEVICES=", visible ? visible : "<unset>", ")");
  SO_CUDA_CHECK(cudaSetDevice(device_));
  SO_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device_));
  SO_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz_, cudaDevAttrClockRate, device_));
  SO_CUDA_CHECK(cudaDeviceGetAttribute(&cc_major_, cudaDevAttrComputeCapabilityMajor, device_));
  SO_CUDA_CHECK(cudaDeviceGetAttribute(&cc_minor_, cudaDevAttrComputeCapabilityMinor, device_));

  // Lower number = higher priority. Comm and H2D get the highest: their work gates compute (a
  // layer cannot start before its weights are up and gathered), and priority lets their kernels
  // (NCCL's, the casts after an upload) claim SMs as compute kernels drain instead of queueing
  // behind a whole GEMM. Compute, D2H (gradients leaving, off the critical path) and Snapshot
  // (checkpoint copies, which wait for nothing but the writer) get the lowest.
  int least = 0, greatest = 0;
  SO_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  for (int k = 0; k < kNumStreamKinds; ++k) {
    const auto kind = static_cast<StreamKind>(k);
    const bool urgent = kind == StreamKind::Comm || kind == StreamKind::H2D;
    streams_[k] = std::make_unique<CudaStream>(kind, urgent ? greatest : least);
  }
  // Highest too: zeroing and clock anchors must not wait behind queued kernels. Its kind is unused.
  util_stream_ = std::make_unique<CudaStream>(StreamKind::Compute, greatest);

  allocator_ = std::make_unique<CudaAllocator>(device_, opts.device_memory_limit);

  void* record = nullptr;
  SO_CUDA_CHECK(cudaHostAlloc(&record, sizeof(DeviceError), cudaHostAllocMapped));
  error_record_.reset(static_cast<DeviceError*>(record));
  std::memset(record, 0, sizeof(DeviceError));
  void* record_device = nullptr;
  SO_CUDA_CHECK(cudaHostGetDevicePointer(&record_device, record, 0));
  error_record_device_ = static_cast<DeviceError*>(record_device);

  {
    std::lock_guard<std::mutex> lock(util_mu_);
    anchors_.push_back(take_anchor());
  }
  gemm_ = std::make_unique<CublasLtGemm>();
  ops_ = std::make_unique<CudaOps>(*this, *gemm_, error_record_device_, opts.attention, opts.deterministic_attention);

  cudaDeviceProp prop{};
  SO_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  device_name_ = prop.name;
  log_info(str_cat("CUDA backend: device ", device_, " ", prop.name, " (sm_", cc_major_, cc_minor_, ", ", sm_count_,
                   " SMs, ", clock_khz_ / 1000, " MHz, ", prop.totalGlobalMem >> 20, " MiB; capacity ",
                   allocator_->stats().capacity >> 20, " MiB)"));
}

CudaBackend::~CudaBackend() {
  // Nothing may still run when ops, buffers and streams go: drain every stream (and its host
  // callbacks) first. Errors are logged: a destructor must not throw.
  SO_CUDA_WARN(cudaSetDevice(device_));
  for (const auto& s : streams_) SO_CUDA_WARN(cudaStreamSynchronize(s->get()));
  SO_CUDA_WARN(cudaStreamSynchronize(util_stream_->get()));
  if (host_error_) {
    try {
      std::rethrow_exception(host_error_);
    } catch (const std::exception& e) {
      log(LogLevel::Error, str_cat("CUDA backend destroyed with an unreported host function error: ", e.what()));
    } catch (...) {
      log(LogLevel::Error, "CUDA backend destroyed with an unreported host function error (not an std::exception)");
    }
  }
  ops_.reset();
  gemm_.reset();
  allocator_.reset();
  // The rest (the error record, clock anchors, streams) go in reverse declaration order.
}

void CudaBackend::make_current() const {
  int current = -1;
  SO_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device_) SO_CUDA_CHECK(cudaSetDevice(device_));
}

DeviceBuffer CudaBackend::alloc_uninitialized(size_t bytes, const char* tag) {
  if (bytes == 0) return DeviceBuffer(this, nullptr, 0);
  make_current();
  return DeviceBuffer(this, allocator_->allocate(bytes, tag), bytes);
}

DeviceBuffer CudaBackend::alloc(size_t bytes, const char* tag) {
  DeviceBuffer buf = alloc_uninitialized(bytes, tag);
  if (!buf) return buf;
  // Zeroed before returning, on the private stream: the memory is then ready for any stream.
  std::lock_guard<std::mutex> lock(util_mu_);
  const cudaError_t set = cudaMemsetAsync(buf.data(), 0, bytes, util_stream_->get());
  const cudaError_t done = set == cudaSuccess ? cudaStreamSynchronize(util_stream_->get()) : set;
  if (done != cudaSuccess) {
    (void)cudaGetLastError();
    SO_FAIL("zeroing ", bytes, " bytes of new device memory for '", tag, "' failed: ", cuda_error_text(done));
  }
  return buf;
}

void CudaBackend::free(void* ptr, size_t) { allocator_->free(ptr); }

std::unique_ptr<Event> CudaBackend::create_event() {
  make_current();  // an event belongs to the device current when it is created
  return std::make_unique<CudaEvent>();
}

void CudaBackend::record(Event& e, Stream& s) {
  make_current();
  const cudaError_t err = cudaEventRecord(raw(e), raw(s));
  if (err != cudaSuccess)
    SO_FAIL("recording an event on the ", stream_kind_name(s.kind()), " stream failed: ", cuda_error_text(err));
}

void CudaBackend::wait(Stream& s, Event& e) {
  make_current();
  const cudaError_t err = cudaStreamWaitEvent(raw(s), raw(e), 0);
  if (err != cudaSuccess)
    SO_FAIL("making the ", stream_kind_name(s.kind()), " stream wait for an event failed: ", cuda_error_text(err));
}

void CudaBackend::synchronize(Event& e) {
  make_current();
  check_after_sync(cudaEventSynchronize(raw(e)), "synchronizing with an event");
}

void CudaBackend::synchronize(Stream& s) {
  make_current();
  check_after_sync(cudaStreamSynchronize(raw(s)), str_cat("synchronizing the ", stream_kind_name(s.kind()), " stream"));
}

void CudaBackend::check_after_sync(cudaError_t sync_result, const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(host_error_mu_);
    // Kernels write the record from the device: read through volatile, and the fields only after
    // the code (acquire), since the code is set first.
    volatile DeviceError* rec = error_record_.get();
    const int code = rec->code;
    if (code != kDeviceErrorNone) {
      std::atomic_thread_fence(std::memory_order_acquire);
      const long long index = rec->index, value = rec->value, limit = rec->limit;
      rec->index = 0;
      rec->value = 0;
      rec->limit = 0;
      rec->code = kDeviceErrorNone;  // reported once; later kernels may record a new error
      if (code == kTokenOutOfRange)
        SO_FAIL("embedding: token id ", value, " at position ", index, " is outside the vocabulary [0, ", limit, ")");
      if (code == kTargetOutOfRange)
        SO_FAIL("cross_entropy: target id ", value, " at row ", index, " is outside the vocabulary [0, ", limit, ")");
      if (code == kAttentionDocuments)
        SO_FAIL("attention: the batch has ", value, " documents, more than the ", limit,
                " its mask's `documents` allowed for (its attention is wrong; the mask must count them)");
      if (code == kGroupedGemmOffsets)
        SO_FAIL("grouped_gemm: the offsets of group ", index, " end at ", value,
                ", before its start or past the call's max_rows ", limit);
      if (code == kAttentionLongestDocument)
        SO_FAIL("attention: the document at token ", index, " has ", value, " tokens, more than the ", limit,
                " its mask's `longest_document` allowed for (its attention is wrong)");
      SO_FAIL("a CUDA kernel reported error code ", code, " (index ", index, ", value ", value, ", limit ", limit,
              ") found while ", what);
    }
    if (host_error_) {
      std::exception_ptr err = std::exchange(host_error_, nullptr);
      poisoned_.fill(false);  // reported: the streams run host functions again
      std::rethrow_exception(err);
    }
  }
  if (sync_result != cudaSuccess) {
    (void)cudaGetLastError();  // reported here, not again at the next check
    SO_FAIL("CUDA error while ", what, ": ", cuda_error_text(sync_result),
            " (an earlier kernel, copy or collective on that stream failed)");
  }
  const cudaError_t pending = cudaGetLastError();
  if (pending != cudaSuccess)
    SO_FAIL("CUDA error pending after ", what, ": ", cuda_error_text(pending),
            " (an earlier CUDA call or kernel launch on this host thread failed unchecked)");
}

CudaBackend::ClockAnchor CudaBackend::take_anchor() {
  // The host reading is the midpoint of a record + synchronize on the idle private stream; the
  // tightest of a few tries bounds the error by half its duration (microseconds).
  ClockAnchor best{nullptr, 0.0};
  double best_span = 0.0;
  for (int attempt = 0; attempt < 5; ++attempt) {
    auto event = std::make_unique<CudaEvent>();
    const double t0 = now_seconds();
    SO_CUDA_CHECK(cudaEventRecord(event->get(), util_stream_->get()));
    SO_CUDA_CHECK(cudaEventSynchronize(event->get()));
    const double t1 = now_seconds();
    if (!best.event || t1 - t0 < best_span) {
      best = ClockAnchor{std::move(event), 0.5 * (t0 + t1)};
      best_span = t1 - t0;
    }
    if (best_span < 50e-6) break;
  }
  return best;
}

double CudaBackend::event_time(Event& e) {
  synchronize(e);
  std::lock_guard<std::mutex> lock(util_mu_);
  if (now_seconds() - anchors_.back().host_seconds > kAnchorIntervalSeconds) {
    anchors_.push_back(take_anchor());
    if (anchors_.size() > kMaxAnchors) anchors_.erase(anchors_.begin() + 1);
  }
  // Newest anchor first; an event that completed before an anchor was taken falls through to an
  // older one (this never relies on cudaEventElapsedTime returning negative times).
  for (auto it = anchors_.rbegin(); it != anchors_.rend(); ++it) {
    float ms = 0.0f;
    const cudaError_t err = cudaEventElapsedTime(&ms, it->event->get(), raw(e));
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      SO_FAIL("event_time: cudaEventElapsedTime failed: ", cuda_error_text(err),
              err == cudaErrorInvalidResourceHandle ? " (was the event ever recorded?)" : "");
    }
    if (ms > 0.0f || std::next(it) == anchors_.rend()) return it->host_seconds + ms / 1e3;
  }
  SO_FAIL("event_time: no clock anchor");  // unreachable: anchors_ always holds the first one
}

void CUDART_CB CudaBackend::host_call_trampoline(void* call) {
  // Owns the call from here: fn and its captures are destroyed when this returns, even if skipped.
  std::unique_ptr<HostCall> owned(static_cast<HostCall*>(call));
  owned->backend->run_host_call(*owned);
}

void CudaBackend::run_host_call(HostCall& call) noexcept {
  const int k = static_cast<int>(call.kind);
  {
    std::lock_guard<std::mutex> lock(host_error_mu_);
    if (poisoned_[k]) return;
  }
  try {
    call.fn();
  } catch (...) {
    std::lock_guard<std::mutex> lock(host_error_mu_);
    if (!host_error_) host_error_ = std::current_exception();
    poisoned_[k] = true;
  }
}

void CudaBackend::host_func(Stream& s, std::function<void()> fn) {
  make_current();
  auto call = std::make_unique<HostCall>(HostCall{this, s.kind(), std::move(fn)});
  const cudaError_t err = cudaLaunchHostFunc(raw(s), &CudaBackend::host_call_trampoline, call.get());
  if (err != cudaSuccess) {
    // Deliberately leaked: fn may hold buffers (release_after) that queued work still uses, and
    // handing those back to the allocator now could let a new allocation overlap them.
    (void)call.release();
    SO_FAIL("enqueueing a host function on the ", stream_kind_name(s.kind()), " stream failed: ", cuda_error_text(err));
  }
  (void)call.release();  // host_call_trampoline owns it now
}

void CudaBackend::check_enqueued(cudaError_t result, const char* op, size_t bytes, const Stream& s) const {
  if (result != cudaSuccess)
    SO_FAIL(op, " of ", bytes, " bytes on the ", stream_kind_name(s.kind()),
            " stream failed: ", cuda_error_text(result));
}

void CudaBackend::copy_h2d(void* dst, const void* src, size_t bytes, Stream& s) {
  if (bytes == 0) return;
  make_current();
  check_enqueued(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, raw(s)), "copy_h2d", bytes, s);
}

void CudaBackend::copy_d2h(void* dst, const void* src, size_t bytes, Stream& s) {
  if (bytes == 0) return;
  make_current();
  check_enqueued(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, raw(s)), "copy_d2h", bytes, s);
}

void CudaBackend::copy_d2d(void* dst, const void* src, size_t bytes, Stream& s) {
  if (bytes == 0) return;
  make_current();
  check_enqueued(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, raw(s)), "copy_d2d", bytes, s);
}

void CudaBackend::memset_zero(void* dst, size_t bytes, Stream& s) {
  if (bytes == 0) return;
  make_current();
  check_enqueued(cudaMemsetAsync(dst, 0, bytes, raw(s)), "memset_zero", bytes, s);
}

void CudaBackend::pin_host_memory(void* ptr, size_t bytes) {
  if (!ptr || bytes == 0) return;
  make_current();
  const cudaError_t err = cudaHostRegister(ptr, bytes, cudaHostRegisterDefault);
  if (err == cudaErrorHostMemoryAlreadyRegistered) {
    (void)cudaGetLastError();  // already pinned is what was asked for
    return;
  }
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    SO_FAIL("cannot pin ", bytes, " bytes of host memory at ", ptr, " (cudaHostRegister): ", cuda_error_text(err));
  }
}

void CudaBackend::unpin_host_memory(void* ptr) {
  if (!ptr) return;
  SO_CUDA_WARN(cudaSetDevice(device_));
  const cudaError_t err = cudaHostUnregister(ptr);
  if (err == cudaSuccess) return;
  (void)cudaGetLastError();
  if (err != cudaErrorHostMemoryNotRegistered)  // not pinned (any more): nothing to undo
    log(LogLevel::Error,
        str_cat("cannot unpin host memory at ", ptr, " (cudaHostUnregister): ", cuda_error_text(err), "; ignored"));
}

Ops& CudaBackend::ops() {
  make_current();  // callers enqueue kernels right after, from this thread
  return *ops_;
}

void CudaBackend::profile_range(bool start) {
  make_current();
  synchronize_all();  // the range holds exactly the work enqueued inside it
  if (start)
    SO_CUDA_CHECK(cudaProfilerStart());
  else
    SO_CUDA_CHECK(cudaProfilerStop());
}

double CudaBackend::measured_gemm_tflops(DType dt) {
  double& cached = measured_gemm_tflops_[dt == DType::BF16 ? 1 : 0];
  if (cached > 0) return cached;
  make_current();
  // 8192^3 (1.1 TFLOP per call) reaches cuBLASLt's plateau on H100-class GPUs (docs/perf.md).
  const int64_t n = 8192;
  const size_t bytes = static_cast<size_t>(n * n) * dtype_size(dt);
  void* buf[3] = {};
  for (void*& b : buf) SO_CUDA_CHECK(cudaMalloc(&b, bytes));
  // Random operands in [-1, 1): constant-filled ones toggle fewer bits and run measurably faster
  // than training's data, which would inflate the rate MFU is reported against. A 4M-element
  // random block, cast to dt and repeated, is random at every tile the GEMM works on.
  cudaStream_t s = raw(stream(StreamKind::Compute));
  {
    std::vector<float> host(size_t{1} << 22);
    std::mt19937 rng(1234);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (float& x : host) x = uniform(rng);
    void* staging = nullptr;
    SO_CUDA_CHECK(cudaMalloc(&staging, host.size() * 4));
    SO_CUDA_CHECK(cudaMemcpy(staging, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    const int64_t chunk = static_cast<int64_t>(host.size());
    for (void* b : {buf[0], buf[1]})
      for (int64_t at = 0; at < n * n; at += chunk)
        ops_->cast(stream(StreamKind::Compute), static_cast<char*>(b) + at * dtype_size(dt), dt, staging, DType::F32,
                   std::min(chunk, n * n - at));
    SO_CUDA_CHECK(cudaMemsetAsync(buf[2], 0, bytes, s));
    SO_CUDA_CHECK(cudaStreamSynchronize(s));
    SO_CUDA_WARN(cudaFree(staging));
  }
  cudaEvent_t ev[2];
  for (cudaEvent_t& e : ev) SO_CUDA_CHECK(cudaEventCreate(&e));
  const auto run = [&] { gemm_->gemm(s, false, true, n, n, n, 1.0f, buf[0], buf[1], dt, 0.0f, buf[2], dt); };
  for (int i = 0; i < 3; ++i) run();  // heuristics, clocks up
  constexpr int kReps = 10;
  SO_CUDA_CHECK(cudaEventRecord(ev[0], s));
  for (int i = 0; i < kReps; ++i) run();
  SO_CUDA_CHECK(cudaEventRecord(ev[1], s));
  SO_CUDA_CHECK(cudaEventSynchronize(ev[1]));
  float ms = 0.0f;
  SO_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
  for (cudaEvent_t e : ev) SO_CUDA_WARN(cudaEventDestroy(e));
  for (void* b : buf) SO_CUDA_WARN(cudaFree(b));
  cached = kReps * 2.0 * static_cast<double>(n) * n * n / (ms * 1e-3) / 1e12;
  return cached;
}

double CudaBackend::peak_tflops(DType dt) {
  if (dt == DType::BF16 && datasheet_bf16_tflops(device_name_) > 0) return datasheet_bf16_tflops(device_name_);
  const double per_clock = dt == DType::BF16 ? tensor_bf16_flops_per_clock(cc_major_, cc_minor_)
                                             : fp32_flops_per_clock(cc_major_, cc_minor_);
  return sm_count_ * (clock_khz_ * 1e3) * per_clock / 1e12;
}

}  // namespace so::cuda
