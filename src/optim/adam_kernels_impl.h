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
//   F fma(F a, F b, F c)                                 a*b + c with one rounding
//   F if_inf(F x, F a, F b)                              x == +inf ? a : b
//   F max0(F x)                                          x > 0 ? x : +0 (NaN -> +0)
//   D dzero(); void add_squares(D& lo, D& hi, F x)      lo/hi += squares of two halves of x, in double
//   double reduce(D lo, D hi)
// and, optionally, streaming stores for the non-temporal memory probe (HasStreamingStores):
//   void store_nt(float*, F)  a whole vector at a vector-aligned address; void store_fence()
//
// Bit-exactness with optim::adamw_reference: the same operations in the same order, FMAs exactly
// where the reference calls std::fma, and these files are compiled with -ffp-contract=off so no
// other mul+add pair is fused (GCC's vector intrinsics are plain C operators and would otherwise
// be contracted).
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "adam_constants.h"
#include "so/optim/adam_kernels.h"
#include "so/optim/adam_prefetch.h"

// Everything a loop body calls is forced inline: GCC otherwise keeps some of it out of line in the
// AVX2 and NEON builds (CountMasked's tail path makes the functions look big), and a call per
// vector, with its vectors passed through memory, halved the bf16 step's arithmetic ceiling.
#define SO_KERNEL_INLINE [[gnu::always_inline]] inline
#define SO_KERNEL_BODY __attribute__((always_inline))  // on a loop body's lambda, after its parameters

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

// fn(G{}, O{}) for the gradient's element type and the output's (NoOut when there is none).
template <typename Fn>
void with_types(const AdamArrays& a, Fn&& fn) {
  with_dtype(a.grad_dt, [&](auto g) {
    if (!a.out) return fn(g, NoOut{});
    with_dtype(a.out_dt, [&](auto o) { fn(g, o); });
  });
}

// Whole vectors, then one predicated vector for the tail: no scalar remainder loop, so tails go
// through exactly the same instructions as the body.
template <class V, class Body>
SO_KERNEL_INLINE void for_each_vector(int64_t n, Body&& body) {
  const int64_t lanes = V::lanes();
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) body(i, V::full());
  if (i < n) body(i, V::first(n - i));
}

// The AdamW arithmetic on one vector, forwards and backwards. SVE vectors are sizeless (they cannot
// be struct members), so the constants stay floats, splatted where used (compilers hoist the
// splats out of the loops), and states travel as (p, m, v) triples of arguments.
template <class V>
struct AdamMath {
  using F = typename V::F;
  AdamConstants c;

  // sqrt(v) / bc2_sqrt without a divide. Markstein's correction: with r = RN(1/c) and q0 = RN(x r),
  // the remainder x - q0 c is exact (one FMA) and RN(q0 + rem * r) is the correctly rounded x / c,
  // whenever x is normal and x / c neither underflows nor overflows. sqrt of a float v >= 0 is 0,
  // +inf or in [2^-75, 2^64], and c = sqrt(1 - b2^t) >= 2^-12, so that always holds; +inf (v
  // overflowed) would give inf - inf in the remainder and takes q0 = inf instead. Tested
  // exhaustively against IEEE division over every float (test_grace_adam, ctest -L slow).
  SO_KERNEL_INLINE F scaled_sqrt(F v) const {
    const F x = V::sqrt(v);
    const F r = V::splat(c.inv_bc2_sqrt);
    const F q0 = V::mul(x, r);
    return V::if_inf(x, q0, V::fma(V::fma(q0, V::splat(-c.bc2_sqrt), x), r, q0));
  }
  // The step's change of the decayed weight: (-step_size * m') / (sqrt(v')/bc2_sqrt + eps).
  SO_KERNEL_INLINE F update(F m1, F v1) const {
    return V::div(V::mul(V::splat(c.neg_step_size), m1), V::add(scaled_sqrt(v1), V::splat(c.eps)));
  }
  SO_KERNEL_INLINE F new_m(F g, F m) const { return V::fma(V::splat(c.one_minus_b1), V::sub(g, m), m); }
  SO_KERNEL_INLINE F new_v(F g, F v) const {
    return V::fma(V::mul(V::splat(c.one_minus_b2), g), g, V::mul(v, V::splat(c.beta2)));
  }

  // optim::adamw_reference on one vector; g is already scaled.
  SO_KERNEL_INLINE void step(F g, F p, F m, F v, F& p1, F& m1, F& v1) const {
    const F pd = V::mul(p, V::splat(c.decay));
    m1 = new_m(g, m);
    v1 = new_v(g, v);
    p1 = V::add(pd, update(m1, v1));
  }
  // The state before a step with (scaled) gradient g, from the state after it, the weight still
  // decayed (pd = p * decay). The update term is recomputed exactly as the step computed it (same
  // m', v', same operations), so pd = p' - update is exact up to the last rounding.
  SO_KERNEL_INLINE void undo_decayed(F g, F p1, F m1, F v1, F& pd, F& m, F& v) const {
    pd = V::sub(p1, update(m1, v1));
    m = V::mul(V::fma(V::splat(-c.one_minus_b1), g, m1), V::splat(c.inv_beta1));
    v = V::max0(V::mul(V::fma(V::mul(V::splat(-c.one_minus_b2), g), g, v1), V::splat(c.inv_beta2)));
  }
  SO_KERNEL_INLINE void undo(F g, F p1, F m1, F v1, F& p, F& m, F& v) const {
    F pd;
    undo_decayed(g, p1, m1, v1, pd, m, v);
    p = V::mul(pd, V::splat(c.inv_decay));
  }
  // undo with g_spec, then step with g_final, in registers. m and v are bitwise what rollback then
  // step give (the rolled-back moments are rounded to float here as they would be in memory); p
  // skips the round trip through 1/decay and back: p'' = (p' - update') + update''.
  SO_KERNEL_INLINE void redo(F g_spec, F g_final, F p1, F m1, F v1, F& p2, F& m2, F& v2) const {
    F pd, m, v;
    undo_decayed(g_spec, p1, m1, v1, pd, m, v);
    m2 = new_m(g_final, m);
    v2 = new_v(g_final, v);
    p2 = V::add(pd, update(m2, v2));
  }
};

// One call's arrays, copied out of the AdamArrays: held by value, they stay in registers (through a
// reference the compiler must reload them after every store, which might alias them).
template <class V, class G, class O>
struct Pointers {
  using F = typename V::F;
  using M = typename V::M;
  float *p, *m, *v, *sp, *sm, *sv;
  const G* g;
  O* out;
  // Software prefetch this many elements ahead on every stream a loop reads (0: none). The div/sqrt
  // chains of a vector are long enough that the out-of-order window fills before the next vectors'
  // loads issue; on the Intel dev VM the step ran at memory time + compute time without it instead
  // of the larger of the two. The distance is the CPU's (adam_prefetch_ahead: on AMD any costs
  // 7-24%). Prefetches past the end of an array are harmless.
  int64_t ahead;
  explicit Pointers(const AdamArrays& a, int64_t prefetch_ahead = adam_prefetch_ahead())
      : p(a.p),
        m(a.m),
        v(a.v),
        sp(a.snapshot_p),
        sm(a.snapshot_m),
        sv(a.snapshot_v),
        g(static_cast<const G*>(a.grad)),
        out(static_cast<O*>(a.out)),
        ahead(prefetch_ahead) {}

  // The loop body's streams, `ahead` elements on: the state in place or the snapshot, and the
  // gradient. (Write-only streams are not fetched: their lines are claimed by the stores.)
  // (Inlining matters here for more than speed: GCC deems a function that only prefetches `const`
  // and deletes its calls.)
  SO_KERNEL_INLINE void prefetch(int64_t i, bool from_snapshot) const {
    if (ahead == 0) return;
    const int64_t j = i + ahead;
    if (from_snapshot) {
      __builtin_prefetch(sp + j), __builtin_prefetch(sm + j), __builtin_prefetch(sv + j);
    } else {
      __builtin_prefetch(p + j, 1), __builtin_prefetch(m + j, 1), __builtin_prefetch(v + j, 1);
    }
    __builtin_prefetch(g + j);
  }
  SO_KERNEL_INLINE F grad(int64_t i, M mk) const { return V::load(g + i, mk); }
  SO_KERNEL_INLINE void store(int64_t i, F p1, F m1, F v1, M mk) const {
    V::store(p + i, p1, mk);
    V::store(m + i, m1, mk);
    V::store(v + i, v1, mk);
    if constexpr (!std::is_same_v<O, NoOut>) V::store(out + i, p1, mk);
  }
};

template <class V, class G, class O, bool kSnapshot>
void step_typed(const AdamArrays& a, int64_t n, const AdamConstants& c) {
  const AdamMath<V> math{c};
  const Pointers<V, G, O> ptr(a);
  for_each_vector<V>(n, [&](int64_t i, typename V::M mk) SO_KERNEL_BODY {
    ptr.prefetch(i, false);
    const typename V::F p = V::load(ptr.p + i, mk), m = V::load(ptr.m + i, mk), v = V::load(ptr.v + i, mk);
    if constexpr (kSnapshot) {
      V::store(ptr.sp + i, p, mk);
      V::store(ptr.sm + i, m, mk);
      V::store(ptr.sv + i, v, mk);
    }
    typename V::F p1, m1, v1;
    math.step(V::mul(ptr.grad(i, mk), V::splat(c.grad_scale)), p, m, v, p1, m1, v1);
    ptr.store(i, p1, m1, v1, mk);
  });
}

template <class V, class G, class O, bool kSnapshot>
void rollback_typed(const AdamArrays& a, int64_t n, const AdamConstants& c) {
  const AdamMath<V> math{c};
  const Pointers<V, G, O> ptr(a);
  for_each_vector<V>(n, [&](int64_t i, typename V::M mk) SO_KERNEL_BODY {
    ptr.prefetch(i, kSnapshot);
    if constexpr (kSnapshot) {
      ptr.store(i, V::load(ptr.sp + i, mk), V::load(ptr.sm + i, mk), V::load(ptr.sv + i, mk), mk);
    } else {
      typename V::F p0, m0, v0;
      math.undo(V::mul(ptr.grad(i, mk), V::splat(c.grad_scale)), V::load(ptr.p + i, mk), V::load(ptr.m + i, mk),
                V::load(ptr.v + i, mk), p0, m0, v0);
      ptr.store(i, p0, m0, v0, mk);
    }
  });
}

template <class V, class G, class O, bool kSnapshot>
void redo_typed(const AdamArrays& a, int64_t n, const AdamConstants& c, float final_scale) {
  const AdamMath<V> math{c};
  const Pointers<V, G, O> ptr(a);
  for_each_vector<V>(n, [&](int64_t i, typename V::M mk) SO_KERNEL_BODY {
    ptr.prefetch(i, kSnapshot);
    const typename V::F g = ptr.grad(i, mk);
    typename V::F p2, m2, v2;
    if constexpr (kSnapshot)
      math.step(V::mul(g, V::splat(final_scale)), V::load(ptr.sp + i, mk), V::load(ptr.sm + i, mk),
                V::load(ptr.sv + i, mk), p2, m2, v2);
    else
      math.redo(V::mul(g, V::splat(c.grad_scale)), V::mul(g, V::splat(final_scale)), V::load(ptr.p + i, mk),
                V::load(ptr.m + i, mk), V::load(ptr.v + i, mk), p2, m2, v2);
    ptr.store(i, p2, m2, v2, mk);
  });
}

// Traits with streaming stores: void store_nt(float*, F) of a whole vector at a vector-aligned
// address, and void store_fence() to order them before the call returns.
template <class V>
concept HasStreamingStores = requires(float* p, typename V::F x) {
  V::store_nt(p, x);
  V::store_fence();
};

template <class V, class G, class O>
void probe_typed(const AdamArrays& a, int64_t n, StreamProbe kind) {
  const Pointers<V, G, O> ptr(a, kind == StreamProbe::Prefetch ? kProbePrefetchAhead : 0);
  if constexpr (HasStreamingStores<V>) {
    const auto vector_bytes = static_cast<uintptr_t>(V::lanes() * sizeof(float));
    const auto misaligned = [&](const float* x) { return reinterpret_cast<uintptr_t>(x) % vector_bytes != 0; };
    // Whole vectors of p, m, v streamed; the tail (and a call whose arrays are not vector-aligned:
    // GraceAdam's short head block) as in the plain probe.
    if (kind == StreamProbe::NonTemporal && !misaligned(ptr.p) && !misaligned(ptr.m) && !misaligned(ptr.v)) {
      const int64_t whole = n / V::lanes() * V::lanes();
      for_each_vector<V>(n, [&](int64_t i, typename V::M mk) SO_KERNEL_BODY {
        const typename V::F g = ptr.grad(i, mk);
        const typename V::F p1 = V::add(V::load(ptr.p + i, mk), g), m1 = V::add(V::load(ptr.m + i, mk), g),
                            v1 = V::add(V::load(ptr.v + i, mk), g);
        if (i < whole) {
          V::store_nt(ptr.p + i, p1), V::store_nt(ptr.m + i, m1), V::store_nt(ptr.v + i, v1);
          if constexpr (!std::is_same_v<O, NoOut>) V::store(ptr.out + i, p1, mk);
        } else {
          ptr.store(i, p1, m1, v1, mk);
        }
      });
      V::store_fence();
      return;
    }
  }
  for_each_vector<V>(n, [&](int64_t i, typename V::M mk) SO_KERNEL_BODY {
    ptr.prefetch(i, false);
    const typename V::F g = ptr.grad(i, mk);
    ptr.store(i, V::add(V::load(ptr.p + i, mk), g), V::add(V::load(ptr.m + i, mk), g),
              V::add(V::load(ptr.v + i, mk), g), mk);
  });
}

template <class V, class T>
double sum_squares_typed(const T* x, int64_t n) {
  typename V::D lo = V::dzero(), hi = V::dzero();
  for_each_vector<V>(n,
                     [&](int64_t i, typename V::M mk) SO_KERNEL_BODY { V::add_squares(lo, hi, V::load(x + i, mk)); });
  return V::reduce(lo, hi);
}

template <class V, class Dst, class Src>
void cast_typed(Dst* dst, const Src* src, int64_t n) {
  for_each_vector<V>(n,
                     [&](int64_t i, typename V::M mk) SO_KERNEL_BODY { V::store(dst + i, V::load(src + i, mk), mk); });
}

// Type-erased entries: the AdamKernels function pointers.
template <class V>
void step_entry(const AdamArrays& a, int64_t n, const AdamWParams& hp) {
  const AdamConstants c = adam_constants(hp);
  with_types(a, [&](auto g, auto o) {
    using G = decltype(g);
    using O = decltype(o);
    a.has_snapshot() ? step_typed<V, G, O, true>(a, n, c) : step_typed<V, G, O, false>(a, n, c);
  });
}

template <class V>
void rollback_entry(const AdamArrays& a, int64_t n, const AdamWParams& hp) {
  const AdamConstants c = adam_constants(hp);
  with_types(a, [&](auto g, auto o) {
    using G = decltype(g);
    using O = decltype(o);
    a.has_snapshot() ? rollback_typed<V, G, O, true>(a, n, c) : rollback_typed<V, G, O, false>(a, n, c);
  });
}

template <class V>
void redo_entry(const AdamArrays& a, int64_t n, const AdamWParams& hp, float final_scale) {
  const AdamConstants c = adam_constants(hp);
  with_types(a, [&](auto g, auto o) {
    using G = decltype(g);
    using O = decltype(o);
    a.has_snapshot() ? redo_typed<V, G, O, true>(a, n, c, final_scale)
                     : redo_typed<V, G, O, false>(a, n, c, final_scale);
  });
}

template <class V>
void scaled_sqrt_entry(float* x, int64_t n, const AdamWParams& hp) {
  const AdamMath<V> math{adam_constants(hp)};
  for_each_vector<V>(n, [&](int64_t i, typename V::M mk)
                            SO_KERNEL_BODY { V::store(x + i, math.scaled_sqrt(V::load(x + i, mk)), mk); });
}

template <class V>
void probe_entry(const AdamArrays& a, int64_t n, StreamProbe kind) {
  with_types(a, [&](auto g, auto o) { probe_typed<V, decltype(g), decltype(o)>(a, n, kind); });
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
    with_dtype(src_dt,
               [&](auto s) { cast_typed<V>(static_cast<decltype(d)*>(dst), static_cast<const decltype(s)*>(src), n); });
  });
}

template <class V>
AdamKernels make_adam_kernels(SimdIsa isa) {
  return AdamKernels{isa,
                     &step_entry<V>,
                     &rollback_entry<V>,
                     &redo_entry<V>,
                     &sum_squares_entry<V>,
                     &cast_entry<V>,
                     &scaled_sqrt_entry<V>,
                     &probe_entry<V>};
}

// so::f32_to_bf16 on every 32-bit lane of an integer vector: round to nearest even with integer
// arithmetic, NaN kept (its quiet bit set); the result sits in the low 16 bits of each lane. I
// gives the lane-wise u32 operations splat, srl16, and_, add, or_, nan_mask, select(mask, a, b).
template <class I, class U>
SO_KERNEL_INLINE U bf16_round_bits(U u) {
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
  SO_KERNEL_INLINE static typename B::F load(const T* p, M mk) {
    if (mk.live == B::kLanes) return B::loadu(p);
    T buf[B::kLanes] = {};
    std::memcpy(buf, p, mk.live * sizeof(T));
    return B::loadu(buf);
  }
  template <class T>
  SO_KERNEL_INLINE static void store(T* p, typename B::F x, M mk) {
    if (mk.live == B::kLanes) return B::storeu(p, x);
    T buf[B::kLanes];
    B::storeu(buf, x);
    std::memcpy(p, buf, mk.live * sizeof(T));
  }
};

}  // namespace
}  // namespace so::optim
