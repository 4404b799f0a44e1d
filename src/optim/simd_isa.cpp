#include "so/optim/simd_isa.h"

#include <cstdlib>

#include "so/core/error.h"

#if defined(__x86_64__)
#include <cpuid.h>
#elif defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace so {

namespace {
constexpr SimdIsa kAll[] = {SimdIsa::Scalar,     SimdIsa::Avx2, SimdIsa::Avx512,
                            SimdIsa::Avx512Bf16, SimdIsa::Neon, SimdIsa::Sve};

#if defined(__x86_64__)
// avx512bf16 is CPUID leaf 7 sub-leaf 1, EAX bit 5; GCC 12's __builtin_cpu_supports does not
// know the name. The AVX-512 state itself is vetted by the builtin (it checks XCR0).
bool cpu_has_avx512bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (eax >> 5) & 1u;
}
#endif

bool cpu_runs(SimdIsa isa) {
  switch (isa) {
    case SimdIsa::Scalar: return true;
#if defined(__x86_64__)
    case SimdIsa::Avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case SimdIsa::Avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl");
    case SimdIsa::Avx512Bf16: return cpu_runs(SimdIsa::Avx512) && cpu_has_avx512bf16();
#elif defined(__aarch64__)
    case SimdIsa::Neon: return getauxval(AT_HWCAP) & HWCAP_ASIMD;
    case SimdIsa::Sve: return getauxval(AT_HWCAP) & HWCAP_SVE;
#endif
    default: return false;  // not compiled for this architecture
  }
}
}  // namespace

const char* simd_isa_name(SimdIsa isa) {
  switch (isa) {
    case SimdIsa::Scalar: return "scalar";
    case SimdIsa::Avx2: return "avx2";
    case SimdIsa::Avx512: return "avx512";
    case SimdIsa::Avx512Bf16: return "avx512bf16";
    case SimdIsa::Neon: return "neon";
    case SimdIsa::Sve: return "sve";
  }
  SO_FAIL("unknown SimdIsa ", static_cast<int>(isa));
}

SimdIsa parse_simd_isa(const std::string& name) {
  std::string valid;
  for (SimdIsa isa : kAll) {
    if (name == simd_isa_name(isa)) return isa;
    valid += valid.empty() ? "" : ", ";
    valid += simd_isa_name(isa);
  }
  SO_FAIL("unknown SIMD instruction set '", name, "' (valid: ", valid, ")");
}

bool simd_isa_supported(SimdIsa isa) {
  // Cached: cpuid and getauxval are cheap, but default_simd_isa runs once per kernel lookup.
  static const auto supported = [] {
    unsigned mask = 0;
    for (SimdIsa i : kAll)
      if (cpu_runs(i)) mask |= 1u << static_cast<int>(i);
    return mask;
  }();
  return (supported >> static_cast<int>(isa)) & 1u;
}

std::vector<SimdIsa> supported_simd_isas() {
  std::vector<SimdIsa> out;
  for (SimdIsa isa : kAll)
    if (simd_isa_supported(isa)) out.push_back(isa);
  return out;
}

SimdIsa default_simd_isa() {
  if (const char* forced = std::getenv("SO_SIMD"); forced && *forced) {
    const SimdIsa isa = parse_simd_isa(forced);
    SO_CHECK(simd_isa_supported(isa), "SO_SIMD=", forced, ": this CPU (or this build) cannot run it");
    return isa;
  }
  return supported_simd_isas().back();  // kAll is ordered worst to best within each architecture
}

}  // namespace so
