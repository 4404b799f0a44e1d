#pragma once
// The instruction sets GraceAdam has kernels for, and which of them this CPU can run.
// SO_SIMD=<name> in the environment forces one (an error if this CPU cannot run it).
#include <string>
#include <vector>

namespace so {

enum class SimdIsa { Scalar, Avx2, Avx512, Avx512Bf16, Neon, Sve };

const char* simd_isa_name(SimdIsa isa);
SimdIsa parse_simd_isa(const std::string& name);  // error lists the valid names
bool simd_isa_supported(SimdIsa isa);             // compiled in and this CPU runs it
std::vector<SimdIsa> supported_simd_isas();       // Scalar first
SimdIsa default_simd_isa();                       // the best supported, or SO_SIMD

}  // namespace so
