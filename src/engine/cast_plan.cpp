#include "so/engine/cast_plan.h"

#include <algorithm>
#include <vector>

#include "so/core/clock.h"
#include "so/core/error.h"

namespace so {

namespace {

constexpr int64_t kSample = int64_t{1} << 20;  // elements: large enough to reach steady state
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

}  // namespace

CastPlan plan_casts(Backend& be, GraceAdam& adam, DType dtype, CastSite grads, CastSite weights) {
  CastPlan plan;
  if (dtype == DType::F32) {
    plan.report = "casting: fp32 model, nothing to cast";
    return plan;
  }
  const int64_t n = kSample;
  DeviceBuffer dev16 = be.alloc(n * 2, "cast probe bf16"), dev32 = be.alloc(n * 4, "cast probe fp32");
  std::vector<float> p(n, 0.5f), m(n, 0.1f), v(n, 0.01f), g32(n, 1e-3f);
  std::vector<bf16> g16(n), out16(n);
  adam.cast(g16.data(), DType::BF16, g32.data(), DType::F32, n);
  Stream& d2h = be.stream(StreamKind::D2H);
  Stream& h2d = be.stream(StreamKind::H2D);
  Ops& ops = be.ops();

  const double t_d2h4 = time_on_stream(be, d2h, [&] { be.copy_d2h(g32.data(), dev32.data(), n * 4, d2h); });
  const double t_h2d4 = time_on_stream(be, h2d, [&] { be.copy_h2d(dev32.data(), p.data(), n * 4, h2d); });
  const double t_d2h2 = time_on_stream(be, d2h, [&] { be.copy_d2h(g16.data(), dev16.data(), n * 2, d2h); });
  const double t_h2d2 = time_on_stream(be, h2d, [&] { be.copy_h2d(dev16.data(), out16.data(), n * 2, h2d); });
  const double t_up = time_on_stream(be, d2h, [&] { ops.cast(d2h, dev32.data(), DType::F32, dev16.data(), DType::BF16, n); });
  const double t_down = time_on_stream(be, h2d, [&] { ops.cast(h2d, dev16.data(), DType::BF16, dev32.data(), DType::F32, n); });
  be.synchronize(d2h);
  be.synchronize(h2d);
  g32.assign(n, 1e-3f);  // the probe copies overwrote the gradients with zeros
  AdamWParams hp;
  hp.lr = 0.0f;  // the cost is the same; the state stays put between repetitions
  const double a_g32 = time_on_host([&] { adam.step(p.data(), m.data(), v.data(), g32.data(), DType::F32, nullptr, DType::F32, n, hp); });
  const double a_g16 = time_on_host([&] { adam.step(p.data(), m.data(), v.data(), g16.data(), DType::BF16, nullptr, DType::F32, n, hp); });
  const double a_o16 = time_on_host([&] { adam.step(p.data(), m.data(), v.data(), g16.data(), DType::BF16, out16.data(), DType::BF16, n, hp); });

  // Cost per bucket of each route (the stages of one bucket run one after the other).
  const double grads_device = t_up + t_d2h4 + a_g32, grads_host = t_d2h2 + a_g16;
  const double weights_device = a_g16 + t_h2d4 + t_down, weights_host = a_o16 + t_h2d2;
  plan.grads = pick(grads, grads_device, grads_host);
  plan.weights = pick(weights, weights_device, weights_host);

  auto gbs = [&](double bytes, double s) { return str_cat(bytes / s / 1e9, " GB/s"); };
  auto ms = [&](double s) { return str_cat(s * 1e3 / (n / 1e6), " ms/Mparam"); };
  auto why = [](CastSite configured) { return configured == CastSite::Auto ? "measured" : "configured"; };
  plan.report = str_cat("casting: link d2h ", gbs(4.0 * n, t_d2h4), ", h2d ", gbs(4.0 * n, t_h2d4),
                        "; device cast ", gbs(6.0 * n, t_up), " up, ", gbs(6.0 * n, t_down),
                        " down; GraceAdam ", ms(a_g32), " (fp32 grads), ", ms(a_g16), " (bf16 grads), ",
                        ms(a_o16), " (+bf16 out) -> gradients cast on the ", cast_site_name(plan.grads), " (",
                        why(grads), "; device route ", ms(grads_device), ", host route ", ms(grads_host),
                        "), weights cast on the ", cast_site_name(plan.weights), " (", why(weights),
                        "; device route ", ms(weights_device), ", host route ", ms(weights_host), ")");
  return plan;
}

}  // namespace so
