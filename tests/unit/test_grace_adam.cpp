// GraceAdam: every SIMD kernel of this CPU against the scalar reference, bit for bit; bf16
// rounding of special values; the rollback's and the redo's error bounds (docs/optimizer.md); the
// exact (snapshot) mode bitwise; the divide-free sqrt(v)/bc2 against IEEE division; thread-count
// independence; the thread pool; core splitting. Built natively and for aarch64 (run under qemu
// by tests/cross/run_aarch64_tests.sh with SO_SIMD and the SVE vector length chosen per run).
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "so/core/cpu_affinity.h"
#include "so/core/error.h"
#include "so/core/random.h"
#include "so/optim/adam_kernels.h"
#include "so/optim/adam_prefetch.h"
#include "so/optim/grace_adam.h"

#if defined(__aarch64__)
#include <sys/prctl.h>
#endif

namespace so {
namespace {

// Lengths around every vector width in use (4, 8, 16 lanes and SVE's up to 64), and beyond one
// GraceAdam block.
const int64_t kLengths[] = {1, 7, 15, 17, 31, 33, 1000, 4099, 65537 + 3};

// Rollback error bounds, in ulps of each quantity's natural scale (worst_error below), from
// docs/optimizer.md; the tests print the worst errors they see.
constexpr double kRollbackUlps = 4.0;  // step then rollback vs the state before the step
constexpr double kRedoUlps = 8.0;      // step then redo(scale') vs step(scale') from the start

// Every ISA this CPU runs, or only SO_SIMD's (the qemu runs pick one ISA per invocation).
std::vector<SimdIsa> isas_under_test() {
  const char* forced = std::getenv("SO_SIMD");
  if (forced && *forced) return {default_simd_isa()};
  return supported_simd_isas();
}

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// Non-zero values with a spread of exponents: scale * N(0,1) * 2^k, k uniform in [-span, 0].
std::vector<float> random_values(int64_t n, uint64_t stream, float scale, int span) {
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i) {
    const double e = -std::floor(random_uniform(7, stream + 1000, i) * (span + 1));
    double x = scale * random_normal(7, stream, i) * std::exp2(e);
    if (x == 0.0) x = scale;
    out[i] = static_cast<float>(x);
  }
  return out;
}

struct State {
  std::vector<float> p, m, v;
};

State random_state(int64_t n, uint64_t seed) {
  State s{random_values(n, seed, 1.0f, 8), random_values(n, seed + 1, 1e-3f, 12),
          random_values(n, seed + 2, 1e-3f, 12)};
  for (float& x : s.v) x = x * x;  // second moments are squares
  return s;
}

// Gradient in dtype dt (bf16 rounded from the fp32 draw); `values` gets what the kernels read.
std::vector<uint8_t> random_grad(int64_t n, DType dt, uint64_t seed, std::vector<float>* values = nullptr) {
  const std::vector<float> g = random_values(n, seed, 1e-2f, 12);
  std::vector<uint8_t> bytes(n * dtype_size(dt));
  if (values) values->resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const float x = dt == DType::F32 ? g[i] : bf16_to_f32(f32_to_bf16(g[i]));
    if (dt == DType::F32)
      std::memcpy(bytes.data() + 4 * i, &x, 4);
    else
      reinterpret_cast<bf16*>(bytes.data())[i] = f32_to_bf16(x);
    if (values) (*values)[i] = x;
  }
  return bytes;
}

void reference_step(State& s, const void* grad, DType grad_dt, void* out, DType out_dt, const AdamWParams& hp) {
  const auto n = static_cast<int64_t>(s.p.size());
  auto run = [&](auto* g, auto* o) { optim::adamw_reference(s.p.data(), s.m.data(), s.v.data(), g, o, n, hp); };
  const bool g32 = grad_dt == DType::F32;
  if (!out || out_dt == DType::F32) {
    auto* o = static_cast<float*>(out);
    g32 ? run(static_cast<const float*>(grad), o) : run(static_cast<const bf16*>(grad), o);
  } else {
    auto* o = static_cast<bf16*>(out);
    g32 ? run(static_cast<const float*>(grad), o) : run(static_cast<const bf16*>(grad), o);
  }
}

// The kernels' view of a State (and, for the exact mode, of a snapshot State of the same size).
AdamArrays arrays_of(State& s, const void* grad, DType grad_dt, void* out = nullptr, DType out_dt = DType::F32,
                     State* snapshot = nullptr) {
  AdamArrays a{s.p.data(), s.m.data(), s.v.data(), grad, grad_dt, out, out_dt};
  if (snapshot) a.snapshot_p = snapshot->p.data(), a.snapshot_m = snapshot->m.data(), a.snapshot_v = snapshot->v.data();
  return a;
}

void kernel_step(const AdamKernels& k, State& s, const void* grad, DType grad_dt, void* out, DType out_dt,
                 const AdamWParams& hp) {
  k.step(arrays_of(s, grad, grad_dt, out, out_dt), static_cast<int64_t>(s.p.size()), hp);
}

// The bf16 the kernels of `isa` must store for fp32 x: so::f32_to_bf16, except that
// vcvtneps2bf16 (avx512bf16) turns subnormal inputs into zeros of the same sign.
uint16_t expected_bf16(float x, SimdIsa isa) {
  if (isa == SimdIsa::Avx512Bf16 && std::fpclassify(x) == FP_SUBNORMAL) return (bits_of(x) >> 16) & 0x8000u;
  return f32_to_bf16(x).bits;
}

// First index where two float arrays differ in bits, or -1.
int64_t first_bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (bits_of(a[i]) != bits_of(b[i])) return static_cast<int64_t>(i);
  return a.size() == b.size() ? -1 : static_cast<int64_t>(std::min(a.size(), b.size()));
}

#define EXPECT_SAME_BITS(what, a, b)                                                                      \
  do {                                                                                                    \
    const int64_t at_ = first_bit_difference(a, b);                                                       \
    EXPECT_EQ(at_, -1) << what << " differs at " << at_ << ": " << (at_ >= 0 ? (a)[at_] : 0.0f) << " vs " \
                       << (at_ >= 0 ? (b)[at_] : 0.0f);                                                   \
  } while (0)
// The weights and both moments of two states equal bit for bit ("WHAT p", "WHAT m", "WHAT v").
#define EXPECT_SAME_STATE(what, a, b)                         \
  do {                                                        \
    EXPECT_SAME_BITS(std::string(what) + " p", (a).p, (b).p); \
    EXPECT_SAME_BITS(std::string(what) + " m", (a).m, (b).m); \
    EXPECT_SAME_BITS(std::string(what) + " v", (a).v, (b).v); \
  } while (0)

// `threads` cores of this process (repeating them on a smaller machine).
std::vector<int> pool_cores(int threads) {
  const std::vector<int> cores = process_cores();
  std::vector<int> out;
  for (int t = 0; t < threads; ++t) out.push_back(cores[t % cores.size()]);
  return out;
}

class KernelTest : public ::testing::TestWithParam<SimdIsa> {
 protected:
  const AdamKernels& k() const { return adam_kernels(GetParam()); }
};

std::string isa_param_name(const ::testing::TestParamInfo<SimdIsa>& info) { return simd_isa_name(info.param); }

INSTANTIATE_TEST_SUITE_P(Isas, KernelTest, ::testing::ValuesIn(isas_under_test()), isa_param_name);

enum class Out { None, F32, BF16 };

TEST_P(KernelTest, StepEqualsTheScalarReferenceBitForBit) {
  const SimdIsa isa = GetParam();
  ASSERT_EQ(k().isa, isa);
  uint64_t seed = 100;
  for (int64_t n : kLengths) {
    int combo = 0;
    for (DType grad_dt : {DType::F32, DType::BF16}) {
      for (Out out : {Out::None, Out::F32, Out::BF16}) {
        for (double wd : {0.0, 0.1}) {
          for (float scale : {1.0f, 0.37f}) {
            for (int64_t step : {int64_t{1}, int64_t{1000}}) {
              seed += 10;
              // Past one block only every 7th combination (each grad/out pair once, with wd, scale
              // and step varying): the same code paths, at a cost qemu's wide SVE can afford.
              if (combo++ % 7 != 0 && n > GraceAdam::kBlock) continue;
              SCOPED_TRACE(::testing::Message()
                           << "n=" << n << " grad=" << dtype_name(grad_dt) << " out=" << static_cast<int>(out)
                           << " wd=" << wd << " scale=" << scale << " step=" << step);
              const AdamWParams hp{.lr = 1e-3, .weight_decay = wd, .step = step, .grad_scale = scale};
              const std::vector<uint8_t> grad = random_grad(n, grad_dt, seed + 5);
              const DType out_dt = out == Out::BF16 ? DType::BF16 : DType::F32;
              std::vector<uint8_t> ref_out(n * 4), k_out(n * 4, 0xab);
              State ref = random_state(n, seed), got = ref;
              reference_step(ref, grad.data(), grad_dt, out == Out::None ? nullptr : ref_out.data(), out_dt, hp);
              kernel_step(k(), got, grad.data(), grad_dt, out == Out::None ? nullptr : k_out.data(), out_dt, hp);
              EXPECT_SAME_STATE("state", got, ref);
              if (out == Out::F32) {
                EXPECT_EQ(std::memcmp(k_out.data(), ref.p.data(), n * 4), 0) << "fp32 out != p";
              } else if (out == Out::BF16) {
                const auto* o = reinterpret_cast<const bf16*>(k_out.data());
                int64_t bad = -1;
                for (int64_t i = 0; i < n && bad < 0; ++i)
                  if (o[i].bits != expected_bf16(ref.p[i], isa)) bad = i;
                EXPECT_EQ(bad, -1) << "bf16 out wrong at " << bad;
                // Nothing written past n (the masked/predicated tail stays in bounds).
                EXPECT_EQ(k_out[2 * n], 0xab);
              } else {
                EXPECT_EQ(k_out[0], 0xab) << "out was written although null was passed";
              }
            }
          }
        }
      }
    }
  }
}

// {fp32 bits, bf16 bits by round-to-nearest-even with NaN kept quiet}.
struct RoundCase {
  uint32_t in;
  uint16_t out;
};
const RoundCase kRoundCases[] = {
    {0x00000000u, 0x0000}, {0x80000000u, 0x8000},  // signed zeros
    {0x3f800000u, 0x3f80},                         // 1
    {0x3f808000u, 0x3f80},                         // 1 + 2^-8: a tie, down to even
    {0x3f818000u, 0x3f82},                         // 1 + 3*2^-8: a tie, up to even
    {0x3f808001u, 0x3f81},                         // just above a tie
    {0x3f807fffu, 0x3f80},                         // just below a tie
    {0xbf818000u, 0xbf82},                         // negative tie, up to even
    {0x7f7fffffu, 0x7f80}, {0xff7fffffu, 0xff80},  // max finite overflows to +-Inf
    {0x7f7f7fffu, 0x7f7f},                         // largest value that stays finite
    {0x7f800000u, 0x7f80}, {0xff800000u, 0xff80},  // +-Inf
    {0x7fc00000u, 0x7fc0},                         // quiet NaN
    {0x7f800001u, 0x7fc0},                         // signalling NaN, payload in low bits: stays NaN
    {0x7fa12345u, 0x7fe1},                         // payload kept, quiet bit set
    {0xffb00001u, 0xfff0},                         // negative signalling NaN
    {0x7f810000u, 0x7fc1},                         // payload in the kept bits
    {0x00400000u, 0x0040},                         // subnormal, exact in bf16
    {0x007fffffu, 0x0080},                         // largest subnormal rounds up to the smallest normal
    {0x80000001u, 0x8000},                         // tiny negative subnormal rounds to -0
    {0x00008000u, 0x0000},                         // subnormal tie, down to even (0)
    {0x00018000u, 0x0002},                         // subnormal tie, up to even
    {0x00800000u, 0x0080},                         // smallest normal
};

TEST(Bf16Reference, MatchesTheRoundingTable) {
  for (const RoundCase& c : kRoundCases) EXPECT_EQ(f32_to_bf16(float_of(c.in)).bits, c.out) << std::hex << c.in;
}

// Every table value at every lane position of a vector body and of a tail.
std::vector<float> rounding_inputs() {
  std::vector<float> x;
  const int64_t n = 3 * 64 + 13;
  for (int64_t i = 0; i < n; ++i) x.push_back(float_of(kRoundCases[i % std::size(kRoundCases)].in));
  return x;
}

TEST_P(KernelTest, CastRoundsLikeTheReferenceIncludingNaNInfTiesAndOverflow) {
  const std::vector<float> x = rounding_inputs();
  const auto n = static_cast<int64_t>(x.size());
  std::vector<bf16> h(n + 1, bf16{0x1234});
  k().cast(h.data(), DType::BF16, x.data(), DType::F32, n);
  for (int64_t i = 0; i < n; ++i) {
    const RoundCase& c = kRoundCases[i % std::size(kRoundCases)];
    EXPECT_EQ(h[i].bits, expected_bf16(x[i], GetParam())) << "input " << std::hex << c.in;
    if (std::fpclassify(x[i]) != FP_SUBNORMAL) {
      EXPECT_EQ(h[i].bits, c.out) << "input " << std::hex << c.in;
    }
  }
  EXPECT_EQ(h[n].bits, 0x1234) << "wrote past the end";
  // Widening is exact, NaN payloads (signalling too) included; same-dtype casts are copies.
  std::vector<float> back(n);
  k().cast(back.data(), DType::F32, h.data(), DType::BF16, n);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(bits_of(back[i]), uint32_t{h[i].bits} << 16);
  const std::vector<bf16> snan(n, bf16{0x7f81});
  std::vector<bf16> copy(n);
  k().cast(copy.data(), DType::BF16, snan.data(), DType::BF16, n);
  EXPECT_EQ(std::memcmp(copy.data(), snan.data(), n * 2), 0);
}

TEST_P(KernelTest, StepWritesBf16WeightsWithTheSameRounding) {
  // lr = 0, m = v = g = 0: p' = p (signalling NaNs made quiet), so out is the rounding of p alone.
  State st;
  st.p = rounding_inputs();
  const auto n = static_cast<int64_t>(st.p.size());
  st.m.assign(n, 0.0f);
  st.v.assign(n, 0.0f);
  const std::vector<float> g(n, 0.0f);
  std::vector<bf16> out(n);
  k().step(arrays_of(st, g.data(), DType::F32, out.data(), DType::BF16), n, AdamWParams{.lr = 0.0});
  for (int64_t i = 0; i < n; ++i) {
    const RoundCase& c = kRoundCases[i % std::size(kRoundCases)];
    EXPECT_EQ(out[i].bits, expected_bf16(float_of(c.in), GetParam())) << "input " << std::hex << c.in;
  }
}

// Rollback errors are counted in ulps of each quantity's natural scale: a value is known only to
// the rounding of the largest term that made it. Element by element, over every state involved:
//   m: max(|m|, (1-b1)|g|)     v: max(v, (1-b2) g^2)
//   p: max(|p|, step_size * scale(m) / denom(v))   (the update with m at its scale)
double ulps(double err, double scale) {
  const auto s = static_cast<float>(scale);
  return err / (double(std::nextafter(s, INFINITY)) - s);
}

struct Worst {
  double p = 0, m = 0, v = 0;
  void take(const Worst& o) { *this = {std::max(p, o.p), std::max(m, o.m), std::max(v, o.v)}; }
};

Worst worst_error(const State& got, const State& want, std::initializer_list<const State*> states,
                  const std::vector<float>& g, const AdamWParams& hp) {
  const double bc1 = 1.0 - std::pow(double(hp.beta1), double(hp.step));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(double(hp.beta2), double(hp.step)));
  const double step_size = hp.lr / bc1;
  Worst w;
  for (size_t i = 0; i < got.p.size(); ++i) {
    const double gi = double(g[i]) * hp.grad_scale;
    double sm = (1.0 - hp.beta1) * std::fabs(gi), sv = (1.0 - hp.beta2) * gi * gi, sp = 0;
    for (const State* s : states) {
      sm = std::max(sm, std::fabs(double(s->m[i])));
      sv = std::max(sv, double(s->v[i]));
    }
    for (const State* s : states) {
      const double term = step_size * sm / (std::sqrt(double(s->v[i])) / bc2_sqrt + hp.eps);
      sp = std::max({sp, std::fabs(double(s->p[i])), term});
    }
    w.take({ulps(std::fabs(double(got.p[i]) - want.p[i]), sp), ulps(std::fabs(double(got.m[i]) - want.m[i]), sm),
            ulps(std::fabs(double(got.v[i]) - want.v[i]), sv)});
  }
  return w;
}

// Prints the worst errors (docs/optimizer.md records them) and holds them to the bound.
void expect_within(const char* what, SimdIsa isa, const Worst& w, double bound) {
  std::printf("[ %s ] %s worst error in ulps: p %.3f, m %.3f, v %.3f (bound %.1f)\n", what, simd_isa_name(isa), w.p,
              w.m, w.v, bound);
  EXPECT_LE(w.p, bound) << what;
  EXPECT_LE(w.m, bound) << what;
  EXPECT_LE(w.v, bound) << what;
}

// Step 1 starts from zero moments, as training does.
State state_before(int64_t n, uint64_t seed, const AdamWParams& hp) {
  State s = random_state(n, seed);
  if (hp.step == 1) {
    std::fill(s.m.begin(), s.m.end(), 0.0f);
    std::fill(s.v.begin(), s.v.end(), 0.0f);
  }
  return s;
}

const AdamWParams kRollbackParams[] = {
    {.lr = 1e-3, .weight_decay = 0.1, .step = 1, .grad_scale = 1.0f},
    {.lr = 1e-3, .weight_decay = 0.0, .step = 1000, .grad_scale = 0.37f},
    {.lr = 3e-4, .weight_decay = 0.01, .step = 20, .grad_scale = 1.0f},
    {.lr = 1e-2, .beta1 = 0.8, .beta2 = 0.95, .weight_decay = 0.5, .step = 3, .grad_scale = 2.5f},
};

TEST_P(KernelTest, RollbackEqualsTheScalarRollbackAndIsWithinItsBound) {
  const int64_t n = 20011;
  const AdamKernels& scalar = adam_kernels(SimdIsa::Scalar);
  Worst worst;
  uint64_t seed = 900;
  for (const AdamWParams& hp : kRollbackParams) {
    for (DType grad_dt : {DType::F32, DType::BF16}) {
      seed += 10;
      SCOPED_TRACE(::testing::Message() << "lr=" << hp.lr << " step=" << hp.step << " grad=" << dtype_name(grad_dt));
      std::vector<float> gv;
      const std::vector<uint8_t> grad = random_grad(n, grad_dt, seed + 5, &gv);
      const State before = state_before(n, seed, hp);
      State s = before;
      kernel_step(k(), s, grad.data(), grad_dt, nullptr, DType::F32, hp);
      const State after = s;
      std::vector<bf16> out(n), ref_out(n);
      k().rollback(arrays_of(s, grad.data(), grad_dt, out.data(), DType::BF16), n, hp);
      State ref = after;
      scalar.rollback(arrays_of(ref, grad.data(), grad_dt, ref_out.data(), DType::BF16), n, hp);
      EXPECT_SAME_STATE("rolled-back", s, ref);
      for (int64_t i = 0; i < n; ++i)  // the device copy of the rolled-back weights, in the same pass
        ASSERT_EQ(out[i].bits, expected_bf16(s.p[i], GetParam())) << "rolled-back bf16 out at " << i;
      worst.take(worst_error(s, before, {&before, &after}, gv, hp));
      // A rollback that did nothing would be off by a whole update: make sure the check can fail.
      EXPECT_GT(worst_error(after, before, {&before, &after}, gv, hp).m, 100 * kRollbackUlps);
    }
  }
  expect_within("rollback", GetParam(), worst, kRollbackUlps);
}

TEST_P(KernelTest, RedoMatchesADirectStepWithTheFinalScale) {
  // Speculation: step with the unclipped gradient, learn the clip coefficient, redo in one pass.
  const int64_t n = 20011;
  const AdamKernels& scalar = adam_kernels(SimdIsa::Scalar);
  Worst worst;
  uint64_t seed = 1700;
  for (const AdamWParams& hp : kRollbackParams) {
    const float final_scale = hp.grad_scale * 0.61f;
    AdamWParams clipped = hp;
    clipped.grad_scale = final_scale;
    std::vector<float> gv;
    const std::vector<uint8_t> grad = random_grad(n, DType::BF16, seed += 10, &gv);
    const State before = state_before(n, seed, hp);
    State direct = before, redone = before, two_pass = before;
    kernel_step(k(), direct, grad.data(), DType::BF16, nullptr, DType::F32, clipped);
    kernel_step(k(), redone, grad.data(), DType::BF16, nullptr, DType::F32, hp);
    const State after = redone;
    std::vector<bf16> out(n);
    k().redo(arrays_of(redone, grad.data(), DType::BF16, out.data(), DType::BF16), n, hp, final_scale);
    State ref = after;
    scalar.redo(arrays_of(ref, grad.data(), DType::BF16), n, hp, final_scale);
    EXPECT_SAME_STATE("redone (vs scalar)", redone, ref);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i].bits, expected_bf16(redone.p[i], GetParam())) << i;
    // The moments are exactly those of rollback then step (two passes); p skips 1/decay.
    two_pass = after;
    k().rollback(arrays_of(two_pass, grad.data(), DType::BF16), n, hp);
    kernel_step(k(), two_pass, grad.data(), DType::BF16, nullptr, DType::F32, clipped);
    EXPECT_SAME_BITS("redone m (vs rollback + step)", redone.m, two_pass.m);
    EXPECT_SAME_BITS("redone v (vs rollback + step)", redone.v, two_pass.v);
    // Scales of every state on the way, with the larger (unclipped) gradient.
    worst.take(worst_error(redone, direct, {&before, &after, &direct}, gv, hp));
  }
  expect_within("redo    ", GetParam(), worst, kRedoUlps);
}

TEST_P(KernelTest, ExactModeSnapshotsInTheStepAndRestoresOrRedoesBitwise) {
  const int64_t n = 4099;
  uint64_t seed = 2500;
  for (const AdamWParams& hp : kRollbackParams) {
    for (DType grad_dt : {DType::F32, DType::BF16}) {
      const float final_scale = hp.grad_scale * 0.43f;
      AdamWParams clipped = hp;
      clipped.grad_scale = final_scale;
      const std::vector<uint8_t> grad = random_grad(n, grad_dt, seed += 10);
      const State before = state_before(n, seed, hp);
      State plain = before, spec = before, snap = random_state(n, seed + 3), direct = before;
      kernel_step(k(), plain, grad.data(), grad_dt, nullptr, DType::F32, hp);
      k().step(arrays_of(spec, grad.data(), grad_dt, nullptr, DType::F32, &snap), n, hp);
      EXPECT_SAME_BITS("step with snapshot: p", spec.p, plain.p);
      EXPECT_SAME_BITS("step with snapshot: m", spec.m, plain.m);
      EXPECT_SAME_STATE("snapshot", snap, before);
      // Clipped: from the snapshot with the final scale, bitwise a direct step.
      State redone = spec;
      std::vector<bf16> out(n);
      k().redo(arrays_of(redone, grad.data(), grad_dt, out.data(), DType::BF16, &snap), n, hp, final_scale);
      kernel_step(k(), direct, grad.data(), grad_dt, nullptr, DType::F32, clipped);
      EXPECT_SAME_STATE("exact redo", redone, direct);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i].bits, expected_bf16(direct.p[i], GetParam())) << i;
      // Skipped: back to the snapshot, bitwise, the device copy written from it.
      State restored = spec;
      k().rollback(arrays_of(restored, grad.data(), grad_dt, out.data(), DType::BF16, &snap), n, hp);
      EXPECT_SAME_STATE("exact rollback", restored, before);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i].bits, expected_bf16(before.p[i], GetParam())) << i;
    }
  }
}

// The division of sqrt(v') by sqrt(1 - b2^t) (two FMAs instead of a divide, AdamMath::scaled_sqrt)
// is IEEE division for every x >= 0 the step can meet. Sampled here (every exponent, all
// mantissa patterns at a stride); SO_TEST_EXHAUSTIVE=1 (ctest -L slow) takes every float.
TEST_P(KernelTest, ScaledSqrtIsIeeeDivisionForEveryFloat) {
  const bool exhaustive = std::getenv("SO_TEST_EXHAUSTIVE") != nullptr;
  const uint32_t stride = exhaustive ? 1 : 4093;  // prime: every low-bit pattern is visited
  const int64_t chunk = int64_t{1} << 22;
  std::vector<float> x(chunk), want(chunk);
  int64_t checked = 0;
  // beta2 up to the largest float below 1 (bc2 = 2^-12 at step 1), down to 0.5; steps 1 .. 10^5.
  const std::pair<double, int64_t> cases[] = {{0.999, 1},         {0.999, 1000},    {0.95, 3},
                                              {1.0 - 0x1p-24, 1}, {0.9999, 100000}, {0.5, 1}};
  for (auto [beta2, step] : cases) {
    const AdamWParams hp{.beta2 = beta2, .step = step};
    const float c = static_cast<float>(std::sqrt(1.0 - std::pow(beta2, static_cast<double>(step))));
    uint64_t bits = 0;
    while (bits <= 0x7f800000u) {  // +0 .. +inf; v' >= 0 always (NaN propagates either way)
      int64_t n = 0;
      for (; n < chunk && bits <= 0x7f800000u; ++n, bits += stride) x[n] = float_of(static_cast<uint32_t>(bits));
      if (bits > 0x7f800000u && x[n - 1] != INFINITY) x[n++] = INFINITY;
      for (int64_t i = 0; i < n; ++i) want[i] = std::sqrt(x[i]) / c;  // vectorised: no errno (CMakeLists)
      k().scaled_sqrt(x.data(), n, hp);
      if (std::memcmp(x.data(), want.data(), n * sizeof(float)) != 0)  // the bits of every element
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(bits_of(x[i]), bits_of(want[i])) << "beta2=" << beta2 << " step=" << step << " c=" << c;
      checked += n;
    }
  }
  std::printf("[ scaled_sqrt ] %s: %lld values (%s) equal to IEEE sqrt(x)/c\n", simd_isa_name(GetParam()),
              static_cast<long long>(checked), exhaustive ? "every float" : "sampled");
}

TEST_P(KernelTest, SumOfSquaresIsAccurateAndIndependentOfTheThreadCount) {
  for (int64_t n : {int64_t{1}, int64_t{31}, int64_t{4099}, 5 * kSumSquaresChunk + 123}) {
    for (DType dt : {DType::F32, DType::BF16}) {
      std::vector<float> x;
      const std::vector<uint8_t> bytes = random_grad(n, dt, 77 + n, &x);
      long double exact = 0;
      for (float xi : x) exact += static_cast<long double>(xi) * xi;
      const double got = sum_squares_chunked(k(), bytes.data(), dt, n);
      EXPECT_LE(std::fabs(got - static_cast<double>(exact)), n * 0x1p-52 * static_cast<double>(exact)) << n;
      for (int threads : {1, 2}) {
        GraceAdam ga(pool_cores(threads), GetParam());
        EXPECT_EQ(ga.sum_squares(bytes.data(), dt, n), got) << "threads=" << threads << " n=" << n;
      }
    }
  }
}

TEST_P(KernelTest, GraceAdamOnAPoolEqualsOneKernelCall) {
  // Unaligned start (3 floats past an allocation) so the aligned head block is exercised too.
  const int64_t n = 3 * GraceAdam::kBlock + 77;
  for (int threads : {1, 2}) {
    GraceAdam ga(pool_cores(threads), GetParam());
    EXPECT_EQ(ga.threads(), threads);
    EXPECT_EQ(ga.isa(), GetParam());
    const AdamWParams hp{.lr = 1e-3, .weight_decay = 0.1, .step = 7, .grad_scale = 0.5f};
    // The gradient starts 3 elements into its buffer and from(3) moves it 3 more: 6 in all.
    const std::vector<uint8_t> grad = random_grad(n + 6, DType::BF16, 55);
    State a = random_state(n + 3, 56), b = a;
    std::vector<bf16> out_a(n + 3), out_b(n + 3);
    const void* g = grad.data() + 3 * 2;
    const AdamArrays arr_a = arrays_of(a, g, DType::BF16, out_a.data(), DType::BF16).from(3);
    const AdamArrays arr_b = arrays_of(b, g, DType::BF16, out_b.data(), DType::BF16).from(3);
    k().step(arr_a, n, hp);
    ga.step(arr_b, n, hp);
    EXPECT_SAME_STATE("state", a, b);
    EXPECT_EQ(std::memcmp(out_a.data(), out_b.data(), out_a.size() * 2), 0);
    k().redo(arr_a, n, hp, 0.25f);
    ga.redo(arr_b, n, hp, 0.25f);
    EXPECT_SAME_BITS("redone p", a.p, b.p);
    k().rollback(arr_a, n, hp);
    ga.rollback(arr_b, n, hp);
    EXPECT_SAME_BITS("rolled-back p", a.p, b.p);
    EXPECT_SAME_BITS("rolled-back v", a.v, b.v);
    EXPECT_EQ(std::memcmp(out_a.data(), out_b.data(), out_a.size() * 2), 0);
    // The block split: `from` moved the grad by 3 bf16 elements from an already offset pointer.
    EXPECT_EQ(arr_a.grad, static_cast<const char*>(g) + 3 * 2);
    std::vector<bf16> cast_a(n), cast_b(n);
    k().cast(cast_a.data(), DType::BF16, a.p.data() + 1, DType::F32, n);
    ga.cast(cast_b.data(), DType::BF16, b.p.data() + 1, DType::F32, n);
    EXPECT_EQ(std::memcmp(cast_a.data(), cast_b.data(), n * 2), 0);
  }
}

TEST_P(KernelTest, StreamProbesAddTheGradientToEveryStreamWhateverTheKind) {
  // 64-byte aligned arrays, so the non-temporal probe takes its streaming path (from(0), through
  // GraceAdam's blocks) as well as its fallback (from(3): misaligned for every vector width).
  const int64_t n = 2 * GraceAdam::kBlock + 37;
  auto aligned_floats = [](int64_t count) {
    return std::unique_ptr<float[], decltype(&std::free)>(
        static_cast<float*>(std::aligned_alloc(64, (count * sizeof(float) + 63) / 64 * 64)), &std::free);
  };
  auto p = aligned_floats(n), m = aligned_floats(n), v = aligned_floats(n), g = aligned_floats(n);
  std::vector<bf16> out(n);
  GraceAdam ga(pool_cores(2), GetParam());
  for (StreamProbe kind : {StreamProbe::Plain, StreamProbe::Prefetch, StreamProbe::NonTemporal})
    for (int64_t first : {0, 3})
      for (bool with_out : {false, true}) {
        for (int64_t i = 0; i < n; ++i)
          p[i] = static_cast<float>(i % 97), m[i] = -static_cast<float>(i % 89),
          v[i] = 0.5f * static_cast<float>(i % 7), g[i] = 0.25f * static_cast<float>(i % 5), out[i] = bf16{};
        const AdamArrays a =
            AdamArrays{p.get(), m.get(), v.get(), g.get(), DType::F32, with_out ? out.data() : nullptr, DType::BF16}
                .from(first);
        ga.stream_probe(a, n - first, kind);
        int64_t bad = -1;
        for (int64_t i = first; i < n && bad < 0; ++i) {
          const float gi = 0.25f * static_cast<float>(i % 5), pi = static_cast<float>(i % 97) + gi;
          if (p[i] != pi || m[i] != -static_cast<float>(i % 89) + gi || v[i] != 0.5f * static_cast<float>(i % 7) + gi ||
              (with_out && out[i].bits != f32_to_bf16(pi).bits))
            bad = i;
        }
        EXPECT_EQ(bad, -1) << stream_probe_name(kind) << " probe from " << first << (with_out ? " with" : " without")
                           << " out: wrong at " << bad;
        if (first > 0) {
          EXPECT_EQ(p[first - 1], static_cast<float>((first - 1) % 97)) << "before the arrays' start";
        }
      }
}

TEST(AdamPrefetch, NoneOnAmdAndTheTunedDistanceElsewhere) {
  EXPECT_EQ(default_adam_prefetch_ahead("amd"), 0);
  EXPECT_EQ(default_adam_prefetch_ahead("intel"), 512);
  EXPECT_EQ(default_adam_prefetch_ahead(""), 512);  // Arm and the rest: unchanged until measured
  EXPECT_GE(adam_prefetch_ahead(), 0);
}

TEST(GraceAdam, RollbackRefusesAStepThatZeroedTheWeights) {
  GraceAdam ga({}, SimdIsa::Scalar);
  State s{std::vector<float>(4, 1.0f), std::vector<float>(4), std::vector<float>(4)}, snap = s;
  const std::vector<float> g(4);
  const AdamWParams zeroing{.lr = 0.5, .weight_decay = 2.0};
  EXPECT_THROW(ga.rollback(arrays_of(s, g.data(), DType::F32), 4, zeroing), Error);
  // From a snapshot nothing is inverted, and the redo never divides by the decay.
  EXPECT_NO_THROW(ga.rollback(arrays_of(s, g.data(), DType::F32, nullptr, DType::F32, &snap), 4, zeroing));
  EXPECT_NO_THROW(ga.redo(arrays_of(s, g.data(), DType::F32), 4, zeroing, 0.5f));
}

TEST(SimdIsa, NamesParseAndUnknownNamesAreListed) {
  for (SimdIsa isa :
       {SimdIsa::Scalar, SimdIsa::Avx2, SimdIsa::Avx512, SimdIsa::Avx512Bf16, SimdIsa::Neon, SimdIsa::Sve})
    EXPECT_EQ(parse_simd_isa(simd_isa_name(isa)), isa);
  try {
    parse_simd_isa("avx1024");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("valid: scalar, avx2, avx512, avx512bf16, neon, sve"), std::string::npos)
        << e.what();
  }
  const std::vector<SimdIsa> s = supported_simd_isas();
  ASSERT_FALSE(s.empty());
  EXPECT_EQ(s.front(), SimdIsa::Scalar);
  EXPECT_TRUE(simd_isa_supported(default_simd_isa()));
#if defined(__x86_64__)
  EXPECT_FALSE(simd_isa_supported(SimdIsa::Neon));
  EXPECT_THROW(adam_kernels(SimdIsa::Sve), Error);
#elif defined(__aarch64__)
  EXPECT_TRUE(simd_isa_supported(SimdIsa::Neon));
  EXPECT_THROW(adam_kernels(SimdIsa::Avx2), Error);
#endif
}

#if defined(__aarch64__)
// The qemu runs ask for an SVE vector length; this proves it is the one the kernels ran with.
TEST(SimdIsa, SveVectorLengthIsTheRequestedOne) {
  if (!simd_isa_supported(SimdIsa::Sve)) GTEST_SKIP() << "no SVE";
  const int vl = prctl(PR_SVE_GET_VL);
  ASSERT_GE(vl, 0) << "PR_SVE_GET_VL failed";
  const int bits = 8 * (vl & PR_SVE_VL_LEN_MASK);
  std::printf("SVE vector length: %d bits\n", bits);
  if (const char* want = std::getenv("SO_TEST_SVE_BITS")) {
    EXPECT_EQ(bits, std::atoi(want));
  }
}
#endif

TEST(ThreadPool, RunsEveryIndexOnceOnItsPinnedCores) {
  const std::vector<int> cores = pool_cores(2);
  ThreadPool pool(cores);
  EXPECT_EQ(pool.size(), 2);
  EXPECT_TRUE(pool.pinned());
  std::vector<std::atomic<int>> hits(10007);
  std::atomic<int> off_core{0};
  const std::set<int> allowed(cores.begin(), cores.end());
  for (int round = 0; round < 3; ++round) {
    pool.parallel_for(static_cast<int64_t>(hits.size()), [&](int64_t i) {
      hits[i]++;
      if (!allowed.count(sched_getcpu())) off_core++;
    });
  }
  for (auto& h : hits) ASSERT_EQ(h.load(), 3);
  EXPECT_EQ(off_core.load(), 0);
  pool.parallel_for(0, [](int64_t) { FAIL() << "ran an empty loop"; });
}

// Each worker starts on its own contiguous share; one held up (here: the task at index 0 waits for
// all the others) must not hold the loop up: the other worker takes the rest of its share. The wait
// is bounded, so a pool that does not steal fails instead of hanging.
TEST(ThreadPool, AnotherWorkerTakesTheRestOfAHeldUpShare) {
  ThreadPool pool(pool_cores(2));
  ASSERT_EQ(pool.size(), 2);
  const int64_t n = 200;
  std::atomic<int64_t> done{0};
  std::atomic<bool> saw_all{false};
  std::vector<std::atomic<int>> hits(n);
  pool.parallel_for(n, [&](int64_t i) {
    if (i == 0) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (done.load() < n - 1 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
      saw_all = done.load() == n - 1;
    }
    hits[i]++;
    done++;
  });
  EXPECT_TRUE(saw_all.load()) << "the task at index 0 waited and the rest of its share was not taken";
  for (auto& h : hits) ASSERT_EQ(h.load(), 1);
}

TEST(ThreadPool, AnUnpinnedPoolHasOneWorker) {
  ThreadPool pool({});
  EXPECT_EQ(pool.size(), 1);
  EXPECT_FALSE(pool.pinned());
  int64_t sum = 0;
  pool.parallel_for(100, [&](int64_t i) { sum += i; });
  EXPECT_EQ(sum, 4950);
}

TEST(ThreadPool, ExceptionsReachTheCallerAndThePoolStaysUsable) {
  ThreadPool pool(pool_cores(2));
  try {
    pool.parallel_for(1000, [](int64_t i) {
      if (i == 37) SO_FAIL("task ", i, " failed");
    });
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("task 37 failed"), std::string::npos) << e.what();
  }
  std::atomic<int64_t> count{0};
  pool.parallel_for(500, [&](int64_t) { count++; });
  EXPECT_EQ(count.load(), 500);
}

TEST(CpuAffinity, FormatsCoreLists) {
  EXPECT_EQ(format_core_list({}), "");
  EXPECT_EQ(format_core_list({3}), "3");
  EXPECT_EQ(format_core_list({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(format_core_list({11, 10, 0, 1, 1}), "0-1,10-11");
  EXPECT_EQ(format_core_list({0, 2, 4}), "0,2,4");
  EXPECT_FALSE(process_cores().empty());
}

TEST(CpuAffinity, SplitsCoresBetweenComputeAndOptimizer) {
  const std::vector<int> four = {0, 1, 2, 3};
  CoreSplit s = split_cores(four, 0.5);
  EXPECT_EQ(s.compute, (std::vector<int>{0, 1}));
  EXPECT_EQ(s.optimizer, (std::vector<int>{2, 3}));
  s = split_cores(four, 0.25);
  EXPECT_EQ(s.compute, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(s.optimizer, (std::vector<int>{3}));
  s = split_cores(four, 0.05);  // rounds to 0: at least one optimizer core
  EXPECT_EQ(s.optimizer, (std::vector<int>{3}));
  s = split_cores({4, 5, 6, 7, 12, 13, 14, 15}, 0.3);  // round(2.4) = 2, the last ones
  EXPECT_EQ(s.optimizer, (std::vector<int>{14, 15}));
  EXPECT_EQ(s.compute, (std::vector<int>{4, 5, 6, 7, 12, 13}));
  s = split_cores({5}, 0.5);  // one core: shared
  EXPECT_EQ(s.compute, (std::vector<int>{5}));
  EXPECT_EQ(s.optimizer, (std::vector<int>{5}));
  s = split_cores({0, 1}, 1.0);  // never all: the compute stream keeps one core
  EXPECT_EQ(s.optimizer, (std::vector<int>{1}));
  EXPECT_EQ(s.compute, (std::vector<int>{0}));
  s = split_cores(four, 0.9);  // DeepSpeed's example value: round(3.6) = 4, capped at 3
  EXPECT_EQ(s.optimizer, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(s.compute, (std::vector<int>{0}));
  EXPECT_THROW(split_cores(four, 0.0), Error);
  EXPECT_THROW(split_cores(four, 1.5), Error);
  EXPECT_THROW(split_cores({}, 0.5), Error);
}

}  // namespace
}  // namespace so
