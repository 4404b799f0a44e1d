// Scalar kernels: the shared body one lane wide. optim::adamw_reference is written out separately,
// as the definition every variant (this one included) is tested against bit for bit.
#include <cmath>
#include <limits>

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
  static F load(const T* p, M) {
    return to_f32(*p);
  }
  template <class T>
  static void store(T* p, F x, M) {
    *p = from_f32<T>(x);
  }
  static F splat(float x) { return x; }
  static F add(F a, F b) { return a + b; }
  static F sub(F a, F b) { return a - b; }
  static F mul(F a, F b) { return a * b; }
  static F div(F a, F b) { return a / b; }
  static F sqrt(F a) { return std::sqrt(a); }
  static F fma(F a, F b, F c) { return std::fma(a, b, c); }
  static F if_inf(F x, F a, F b) { return x == std::numeric_limits<float>::infinity() ? a : b; }
  static F max0(F x) { return x > 0.0f ? x : 0.0f; }
  static D dzero() { return 0.0; }
  static void add_squares(D& lo, D&, F x) { lo += static_cast<double>(x) * x; }
  static double reduce(D lo, D hi) { return lo + hi; }
};

}  // namespace

const AdamKernels& scalar_adam_kernels() {
  static const AdamKernels k = make_adam_kernels<Scalar>(SimdIsa::Scalar);
  return k;
}

}  // namespace so::optim
