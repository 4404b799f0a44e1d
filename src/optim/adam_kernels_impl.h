#pragma once
// The one body of every instruction set's AdamW kernels. An ISA file defines a traits struct V
// (below) and calls make_adam_kernels<V>(isa); the loops, the operation order and the dtype
// dispatch live only here, so the variants cannot drift apart.
//
// V provides, for F (a vector of floats), M (which lanes of the current vector are live) and
// D (a vector of double accumulators):
//   int64_t lanes(); M full(); M first(int64_t k)       k live lanes, 0 < k < lanes()
//   F load(const float*, M), F load(const bf16*, M)     dead lanes read as +0, no access past them
//   void store(float*, F, M), void store(bf16*, F, M)   bf16: so::f32_to_bf16 bit for bit (RNE, NaN
//                                                        kept and quiet), except where the traits say
//   F splat(float); add, sub, mul, div, sqrt            IEEE, one rounding each, operand order kept
//   F max0(F x)                                          x > 0 ? x : +0 (NaN -> +0)
//   D dzero(); void add_squares(D& lo, D& hi, F x)      lo/hi += squares of two halves of x, in double
//   double reduce(D lo, D hi)
//
// Bit-exactness with optim::adamw_reference: the same operations in the same order, and these
// files are compiled with -ffp-contract=off so no mul+add pair is fused into an FMA (GCC's
// vector intrinsics are plain C operators and would otherwise be contracted).
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "adam_constants.h"
#include "so/optim/adam_kernels.h"

namespace so::optim {
// Internal linkage: every ISA file compiles its own copy under its own -m flags, and none of it
// may be shared with (linked into) code that runs on a CPU without that ISA.
namespace {

struct NoOut {};  // `out` is null: the weights are not written to a device copy

template <typename F>
decltype(auto) with_dtype(DType dt, F&& f) {
  if (dt == DType::F32) return f(float{});
  return f(bf16{});
}

// Whole vectors, then one predicated vector for the tail: no scalar remainder loop, so tails go
// through exactly the same instructions as the body.
template <class V, class Body>
inline void for_each_vector(int64_t n, Body&& body) {
  const int64_t lanes = V::lanes();
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) body(i, V::full());
  if (i < n) body(i, V::first(n - i));
}

template <class V, class G, class O>
void step_typed(float* p, float* m, float* v, const G* grad, O* out, int64_t n, const AdamConstants& c) {
  using F = typename V::F;
  const F grad_scale = V::splat(c.grad_scale), decay = V::splat(c.decay), beta2 = V::splat(c.beta2);
  const F omb1 = V::splat(c.one_minus_b1), omb2 = V::splat(c.one_minus_b2), bc2_sqrt = V::splat(c.bc2_sqrt);
  const F eps = V::splat(c.eps), step_size = V::splat(c.step_size);
  for_each_vector<V>(n, [&](int64_t i, typename V::M mk) {
    // Same expressions, same operand order as optim::adamw_reference.
    const F g = V::mul(V::load(grad + i, mk), grad_scale);
    const F m0 = V::load(m + i, mk);
    const F mi = V::add(m0, V::mul(omb1, V::sub(g, m0)));
    const F vi = V::add(V::mul(beta2, V::load(v + i, mk)), V::mul(V::mul(omb2, g), g));
    const F denom = V::add(V::div(V::sqrt(vi), bc2_sqrt), eps);
    const F pi = V::sub(V::mul(V::load(p + i, mk), decay), V::mul(step_size, V::div(mi, denom)));
    V::store(p + i, pi, mk);
    V::store(m + i, mi, mk);
    V::store(v + i, vi, mk);
    if constexpr (!std::is_same_v<O, NoOut>) V::store(out + i, pi, mk);
  });
}

// The in-place inverse of step_typed for the same g and constants (docs/optimizer.md). The update
// term step_size * m'/denom(v') is recomputed from the post-step m', v' exactly as the step
// computed it, so p's error comes only from the last addition and the scaling by 1/decay.
template <class V, class G>
void rollback_typed(float* p, float* m, float* v, const G* grad, int64_t n, const AdamConstants& c) {
  using F = typename V::F;
  const F grad_scale = V::splat(c.grad_scale), inv_decay = V::splat(c.inv_decay);
  const F inv_beta1 = V::splat(c.inv_beta1), inv_beta2 = V::splat(c.inv_beta2);
  const F omb1 = V::splat(c.one_minus_b1), omb2 = V::splat(c.one_minus_b2);
  const F bc2_sqrt = V::splat(c.bc2_sqrt), eps = V::splat(c.eps), step_size = V::splat(c.step_size);
  for_each_vector<V>(n, [&](int64_t i, typename V::M mk) {
    const F g = V::mul(V::load(grad + i, mk), grad_scale);
    const F m1 = V::load(m + i, mk);
    const F v1 = V::load(v + i, mk);
    const F denom = V::add(V::div(V::sqrt(v1), bc2_sqrt), eps);
    const F p0 = V::mul(V::add(V::load(p + i, mk), V::mul(step_size, V::div(m1, denom))), inv_decay);
    const F m0 = V::mul(V::sub(m1, V::mul(omb1, g)), inv_beta1);
    const F v0 = V::max0(V::mul(V::sub(v1, V::mul(V::mul(omb2, g), g)), inv_beta2));
    V::store(p + i, p0, mk);
    V::store(m + i, m0, mk);
    V::store(v + i, v0, mk);
  });
}

template <class V, class T>
double sum_squares_typed(const T* x, int64_t n) {
  typename V::D lo = V::dzero(), hi = V::dzero();
  for_each_vector<V>(n, [&](int64_t i, typename V::M mk) { V::add_squares(lo, hi, V::load(x + i, mk)); });
  return V::reduce(lo, hi);
}

template <class V, class Dst, class Src>
void cast_typed(Dst* dst, const Src* src, int64_t n) {
  for_each_vector<V>(n, [&](int64_t i, typename V::M mk) { V::store(dst + i, V::load(src + i, mk), mk); });
}

// Type-erased entries: the AdamKernels function pointers.
template <class V>
void step_entry(float* p, float* m, float* v, const void* grad, DType grad_dt, void* out, DType out_dt, int64_t n,
                const AdamWParams& hp) {
  const AdamConstants c = adam_constants(hp);
  with_dtype(grad_dt, [&](auto g) {
    const auto* gp = static_cast<const decltype(g)*>(grad);
    if (!out) return step_typed<V>(p, m, v, gp, static_cast<NoOut*>(nullptr), n, c);
    with_dtype(out_dt, [&](auto o) { step_typed<V>(p, m, v, gp, static_cast<decltype(o)*>(out), n, c); });
  });
}

template <class V>
void rollback_entry(float* p, float* m, float* v, const void* grad, DType grad_dt, int64_t n, const AdamWParams& hp) {
  const AdamConstants c = adam_constants(hp);
  with_dtype(grad_dt, [&](auto g) { rollback_typed<V>(p, m, v, static_cast<const decltype(g)*>(grad), n, c); });
}

template <class V>
double sum_squares_entry(const void* x, DType dt, int64_t n) {
  return with_dtype(dt, [&](auto t) { return sum_squares_typed<V>(static_cast<const decltype(t)*>(x), n); });
}

template <class V>
void cast_entry(void* dst, DType dst_dt, const void* src, DType src_dt, int64_t n) {
  // Same dtype: a copy, so bf16 NaN payloads (even signalling ones) pass through untouched.
  // (Element size spelled out: dtype_size is an inline function this file must not instantiate.)
  if (dst_dt == src_dt) {
    if (n > 0) std::memcpy(dst, src, n * (dst_dt == DType::F32 ? 4 : 2));
    return;
  }
  with_dtype(dst_dt, [&](auto d) {
    with_dtype(src_dt, [&](auto s) {
      cast_typed<V>(static_cast<decltype(d)*>(dst), static_cast<const decltype(s)*>(src), n);
    });
  });
}

template <class V>
AdamKernels make_adam_kernels(SimdIsa isa) {
  return AdamKernels{isa, &step_entry<V>, &rollback_entry<V>, &sum_squares_entry<V>, &cast_entry<V>};
}

// so::f32_to_bf16 on every 32-bit lane of an integer vector: round to nearest even with integer
// arithmetic, NaN kept (its quiet bit set); the result sits in the low 16 bits of each lane. I
// gives the lane-wise u32 operations splat, srl16, and_, add, or_, nan_mask, select(mask, a, b).
template <class I, class U>
inline U bf16_round_bits(U u) {
  const U hi = I::srl16(u);
  const U rounded = I::srl16(I::add(u, I::add(I::and_(hi, I::splat(1u)), I::splat(0x7fffu))));
  return I::select(I::nan_mask(u), I::or_(hi, I::splat(0x0040u)), rounded);
}

// Masks for ISAs without masked loads and stores (AVX2, NEON): M counts the live lanes, and the
// one partial vector of a call goes through a zeroed stack buffer. B gives kLanes, F and
// unmasked loadu/storeu for float and bf16.
template <class B>
struct CountMasked : B {
  struct M {
    int64_t live;
  };
  static int64_t lanes() { return B::kLanes; }
  static M full() { return {B::kLanes}; }
  static M first(int64_t k) { return {k}; }
  template <class T>
  static typename B::F load(const T* p, M mk) {
    if (mk.live == B::kLanes) return B::loadu(p);
    T buf[B::kLanes] = {};
    std::memcpy(buf, p, mk.live * sizeof(T));
    return B::loadu(buf);
  }
  template <class T>
  static void store(T* p, typename B::F x, M mk) {
    if (mk.live == B::kLanes) return B::storeu(p, x);
    T buf[B::kLanes];
    B::storeu(buf, x);
    std::memcpy(p, buf, mk.live * sizeof(T));
  }
};

}  // namespace
}  // namespace so::optim
