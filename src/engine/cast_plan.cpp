#include "so/engine/cast_plan.h"

#include <algorithm>
#include <functional>

#include <numa.h>

#include "so/backend/host_buffer.h"
#include "so/core/clock.h"
#include "so/core/error.h"

namespace so {

namespace {

// Copies of one bucket, within these bounds: below, per-copy overheads dominate; above, the probe
// costs start-up time and memory, and copies of 32 MiB already run at the link's full speed
// (so_bench link prints the curve).
constexpr int64_t kMinSample = int64_t{1} << 16;  // elements
constexpr int64_t kMaxSample = int64_t{1} << 23;
constexpr int kReps = 3;

// Best-of-kReps seconds of work enqueued on stream s, timed by events.
double time_on_stream(Backend& be, Stream& s, const std::function<void()>& enqueue) {
  double best = 1e30;
  for (int r = 0; r < kReps; ++r) {
    std::unique_ptr<Event> a = be.create_event(), b = be.create_event();
    be.record(*a, s);
    enqueue();
    be.record(*b, s);
    best = std::min(best, be.event_time(*b) - be.event_time(*a));
  }
  return std::max(best, 1e-9);
}

double time_on_host(const std::function<void()>& fn) {
  double best = 1e30;
  for (int r = 0; r < kReps; ++r) {
    const double t0 = now_seconds();
    fn();
    best = std::min(best, now_seconds() - t0);
  }
  return std::max(best, 1e-9);
}

CastSite pick(CastSite configured, double device_cost, double host_cost) {
  if (configured != CastSite::Auto) return configured;
  return device_cost < host_cost ? CastSite::Device : CastSite::Host;
}

std::string gbs(double bytes, double s) { return str_cat(bytes / s / 1e9, " GB/s"); }

}  // namespace

int64_t cast_probe_elements(int64_t bucket_elements) { return std::clamp(bucket_elements, kMinSample, kMaxSample); }

CastPlan plan_casts(Backend& be, GraceAdam& adam, const CastPlanRequest& r) {
  CastPlan plan;
  const int64_t n = cast_probe_elements(r.bucket_elements);
  Backend* pin = r.pin_memory ? &be : nullptr;
  int stream = 0;
  auto host = [&](size_t bytes, const char* tag) {
    return HostBuffer(bytes, r.numa_node, pin, tag, stream_skew(stream++));
  };
  HostBuffer h32 = host(n * 4, "link probe fp32"), h16 = host(n * 2, "link probe bf16");
  DeviceBuffer dev16 = be.alloc(n * 2, "cast probe bf16"), dev32 = be.alloc(n * 4, "cast probe fp32");
  Stream& d2h = be.stream(StreamKind::D2H);
  Stream& h2d = be.stream(StreamKind::H2D);
  const double t_d2h4 = time_on_stream(be, d2h, [&] { be.copy_d2h(h32.data(), dev32.data(), n * 4, d2h); });
  const double t_h2d4 = time_on_stream(be, h2d, [&] { be.copy_h2d(dev32.data(), h32.data(), n * 4, h2d); });
  plan.d2h_gbs = 4.0 * n / t_d2h4 / 1e9;
  plan.h2d_gbs = 4.0 * n / t_h2d4 / 1e9;
  const std::string link =
      str_cat("link measured with ", r.pin_memory ? "pinned" : "pageable", " ", 4.0 * n / (1 << 20), " MiB copies (", n,
              " elements, one bucket", n < r.bucket_elements ? ", capped" : "", "): d2h ", gbs(4.0 * n, t_d2h4),
              ", h2d ", gbs(4.0 * n, t_h2d4));
  if (r.model_dtype == DType::F32) {
    plan.report = str_cat("casting: ", link, "; fp32 model, nothing to cast");
    return plan;
  }
  const double t_d2h2 = time_on_stream(be, d2h, [&] { be.copy_d2h(h16.data(), dev16.data(), n * 2, d2h); });
  const double t_h2d2 = time_on_stream(be, h2d, [&] { be.copy_h2d(dev16.data(), h16.data(), n * 2, h2d); });
  Ops& ops = be.ops();
  const double t_up =
      time_on_stream(be, d2h, [&] { ops.cast(d2h, dev32.data(), DType::F32, dev16.data(), DType::BF16, n); });
  const double t_down =
      time_on_stream(be, h2d, [&] { ops.cast(h2d, dev16.data(), DType::BF16, dev32.data(), DType::F32, n); });
  be.synchronize(d2h);
  be.synchronize(h2d);

  // GraceAdam with each operand type, on arrays laid out like the offloaded state.
  HostBuffer p = host(n * 4, "cast probe p"), m = host(n * 4, "cast probe m"), v = host(n * 4, "cast probe v");
  std::fill_n(h32.as<float>(), n, 1e-3f);
  adam.cast(h16.data(), DType::BF16, h32.data(), DType::F32, n);
  HostBuffer out16 = host(n * 2, "cast probe bf16 out");
  AdamWParams hp;
  hp.lr = 0.0;  // the cost is the same; the state stays put between repetitions
  const AdamArrays state{p.as<float>(), m.as<float>(), v.as<float>(), h32.data(), DType::F32};
  AdamArrays bf16_grads = state;
  bf16_grads.grad = h16.data(), bf16_grads.grad_dt = DType::BF16;
  AdamArrays bf16_out = bf16_grads;
  bf16_out.out = out16.data(), bf16_out.out_dt = DType::BF16;
  const double a_g32 = time_on_host([&] { adam.step(state, n, hp); });
  const double a_g16 = time_on_host([&] { adam.step(bf16_grads, n, hp); });
  const double a_o16 = time_on_host([&] { adam.step(bf16_out, n, hp); });

  // Cost per bucket of each route (the stages of one bucket run one after the other).
  const double grads_device = t_up + t_d2h4 + a_g32, grads_host = t_d2h2 + a_g16;
  const double weights_device = a_g16 + t_h2d4 + t_down, weights_host = a_o16 + t_h2d2;
  plan.grads = pick(r.grads, grads_device, grads_host);
  plan.weights = pick(r.weights, weights_device, weights_host);

  auto ms = [&](double s) { return str_cat(s * 1e3 / (n / 1e6), " ms/Mparam"); };
  auto why = [](CastSite configured) { return configured == CastSite::Auto ? "measured" : "configured"; };
  plan.report =
      str_cat("casting: ", link, " (bf16: d2h ", gbs(2.0 * n, t_d2h2), ", h2d ", gbs(2.0 * n, t_h2d2),
              "); device cast ", gbs(6.0 * n, t_up), " up, ", gbs(6.0 * n, t_down), " down; GraceAdam ", ms(a_g32),
              " (fp32 grads), ", ms(a_g16), " (bf16 grads), ", ms(a_o16), " (+bf16 out)\n  -> gradients cast on the ",
              cast_site_name(plan.grads), " (", why(r.grads), "; device route ", ms(grads_device), ", host route ",
              ms(grads_host), "); weights cast on the ", cast_site_name(plan.weights), " (", why(r.weights),
              "; device route ", ms(weights_device), ", host route ", ms(weights_host), ")");
  return plan;
}

int offload_numa_node(const std::vector<int>& cores) {
  if (cores.empty() || numa_available() < 0) return -1;
  return numa_node_of_cpu(cores.front());
}

CastPlan measure_casts(Backend& backend, const OffloadConfig& offload, DType model_dtype, int64_t largest_bucket,
                       const std::vector<int>& optimizer_cores) {
  GraceAdam adam(optimizer_cores, offload.simd == "auto" ? default_simd_isa() : parse_simd_isa(offload.simd));
  CastPlanRequest r;
  r.model_dtype = model_dtype;
  r.grads = offload.cast_grads, r.weights = offload.cast_weights;
  r.bucket_elements = largest_bucket;
  r.numa_node = offload_numa_node(optimizer_cores);
  r.pin_memory = offload.pin_memory;
  return plan_casts(backend, adam, r);
}

}  // namespace so
