#pragma once
// What the device benchmarks share: median timing of work on the compute stream through the
// backend's events (CUDA events on a GPU, the host clock on the CPU backend), and random device
// tensors that live as long as the benchmark.
#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "so/backend/backend.h"

namespace so::bench {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// Median milliseconds of fn on the compute stream: `warmup` untimed runs, then `iters` runs each
// between two events, all enqueued before the first is read so no host gap enters the timing.
template <typename Fn>
inline double time_ms(Backend& be, int warmup, int iters, Fn&& fn) {
  Stream& s = be.stream(StreamKind::Compute);
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<std::unique_ptr<Event>> ev;
  for (int i = 0; i < iters; ++i) {
    ev.push_back(be.create_event());
    be.record(*ev.back(), s);
    fn();
    ev.push_back(be.create_event());
    be.record(*ev.back(), s);
  }
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) ms.push_back(1e3 * (be.event_time(*ev[2 * i + 1]) - be.event_time(*ev[2 * i])));
  be.synchronize(s);  // rethrows any op error
  return median(ms);
}

// Device buffers filled with random values (a 16M-element random block, repeated: the patterns
// do not matter to the timings, zeros and constants would).
class Tensors {
 public:
  explicit Tensors(Backend& be) : be_(be) {}
  void* random(int64_t n, DType dt, uint32_t seed, float scale = 1.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(-scale, scale);
    return filled(n, dt, [&] { return d(rng); });
  }
  // Every element `value`: what a measurement on constant data (faster than random) looks like.
  void* constant(int64_t n, DType dt, float value) {
    return filled(n, dt, [&] { return value; });
  }
  int32_t* ints(const std::vector<int32_t>& v) {
    void* p = alloc(v.size() * 4);
    Stream& s = be_.stream(StreamKind::Compute);
    be_.copy_h2d(p, v.data(), v.size() * 4, s);
    be_.synchronize(s);
    return static_cast<int32_t*>(p);
  }
  const double* doubles(const std::vector<double>& v) {
    void* p = alloc(v.size() * sizeof(double));
    Stream& s = be_.stream(StreamKind::Compute);
    be_.copy_h2d(p, v.data(), v.size() * sizeof(double), s);
    be_.synchronize(s);
    return static_cast<const double*>(p);
  }
  void* alloc(size_t bytes) {
    bufs_.push_back(be_.alloc(bytes, "bench tensor"));
    return bufs_.back().data();
  }
  size_t bytes() const {
    size_t b = 0;
    for (const DeviceBuffer& d : bufs_) b += d.bytes();
    return b;
  }

 private:
  template <typename Gen>
  void* filled(int64_t n, DType dt, Gen&& next) {
    void* p = alloc(static_cast<size_t>(n) * dtype_size(dt));
    const int64_t chunk = std::min<int64_t>(n, int64_t{1} << 24);
    std::vector<float> host(static_cast<size_t>(chunk));
    for (float& x : host) x = next();
    DeviceBuffer staging = be_.alloc(host.size() * 4, "bench staging");
    Stream& s = be_.stream(StreamKind::Compute);
    be_.copy_h2d(staging.data(), host.data(), host.size() * 4, s);
    for (int64_t at = 0; at < n; at += chunk)
      be_.ops().cast(s, static_cast<char*>(p) + at * dtype_size(dt), dt, staging.data(), DType::F32,
                     std::min(chunk, n - at));
    be_.synchronize(s);
    return p;
  }

  Backend& be_;
  std::vector<DeviceBuffer> bufs_;
};

}  // namespace so::bench
