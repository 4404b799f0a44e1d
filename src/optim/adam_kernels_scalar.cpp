// Scalar kernels: the step is optim::adamw_reference itself; rollback, sums of squares and casts
// run the shared body one lane wide, which makes them the definition the SIMD variants match.
#include <cmath>

#include "adam_kernels_impl.h"
#include "adam_kernels_isa.h"

namespace so::optim {
namespace {

struct Scalar {
  using F = float;
  using M = bool;  // the only vector is always whole
  using D = double;
  static int64_t lanes() { return 1; }
  static M full() { return true; }
  static M first(int64_t) { return true; }
  template <class T>
  static F load(const T* p, M) { return to_f32(*p); }
  template <class T>
  static void store(T* p, F x, M) { *p = from_f32<T>(x); }
  static F splat(float x) { return x; }
  static F add(F a, F b) { return a + b; }
  static F sub(F a, F b) { return a - b; }
  static F mul(F a, F b) { return a * b; }
  static F div(F a, F b) { return a / b; }
  static F sqrt(F a) { return std::sqrt(a); }
  static F max0(F x) { return x > 0.0f ? x : 0.0f; }
  static D dzero() { return 0.0; }
  static void add_squares(D& lo, D&, F x) { lo += static_cast<double>(x) * x; }
  static double reduce(D lo, D hi) { return lo + hi; }
};

void reference_step(float* p, float* m, float* v, const void* grad, DType grad_dt, void* out, DType out_dt, int64_t n,
                    const AdamWParams& hp) {
  with_dtype(grad_dt, [&](auto g) {
    const auto* gp = static_cast<const decltype(g)*>(grad);
    with_dtype(out_dt, [&](auto o) { adamw_reference(p, m, v, gp, static_cast<decltype(o)*>(out), n, hp); });
  });
}

}  // namespace

const AdamKernels& scalar_adam_kernels() {
  static const AdamKernels k = [] {
    AdamKernels s = make_adam_kernels<Scalar>(SimdIsa::Scalar);
    s.step = &reference_step;
    return s;
  }();
  return k;
}

}  // namespace so::optim
