#include "so/model/mxfp4.h"

#include <cmath>

#include "so/core/error.h"

namespace so {
namespace {

// E2M1: sign, 2 exponent bits, 1 mantissa bit (the OCP MX table, as transformers' FP4_VALUES).
constexpr float kE2M1[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

}  // namespace

void check_mxfp4_scales(const std::vector<uint8_t>& scales, int64_t rows, int64_t groups, const std::string& what) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t s = scales[r * groups + g];
      // The largest E2M1 magnitude is 6 = 1.5 x 2^2: 2^(s - 127) x 6 must stay below FLT_MAX.
      SO_CHECK(s != 255 && static_cast<int>(s) - 127 <= 125, what, ": MXFP4 scale ", int(s), " at row ", r, ", block ",
               g, " is out of range (E8M0 255 is NaN; above 252 overflows fp32)");
    }
}

std::vector<float> dequantize_mxfp4(const std::vector<uint8_t>& blocks, const std::vector<uint8_t>& scales,
                                    int64_t rows, int64_t groups, const std::string& what) {
  SO_CHECK(static_cast<int64_t>(blocks.size()) == rows * groups * kMxfp4BlockBytes, what, ": MXFP4 blocks hold ",
           blocks.size(), " bytes, expected rows x groups x ", kMxfp4BlockBytes, " = ", rows, " x ", groups, " x ",
           kMxfp4BlockBytes);
  SO_CHECK(static_cast<int64_t>(scales.size()) == rows * groups, what, ": MXFP4 scales hold ", scales.size(),
           " bytes, expected one per block (", rows, " x ", groups, ")");
  check_mxfp4_scales(scales, rows, groups, what);
  std::vector<float> out(static_cast<size_t>(rows * groups * 2 * kMxfp4BlockBytes));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t s = scales[r * groups + g];
      const int exp = static_cast<int>(s) - 127;
      const uint8_t* b = &blocks[(r * groups + g) * kMxfp4BlockBytes];
      float* o = &out[(r * groups + g) * 2 * kMxfp4BlockBytes];
      for (int64_t i = 0; i < kMxfp4BlockBytes; ++i) {
        o[2 * i] = std::ldexp(kE2M1[b[i] & 0x0F], exp);
        o[2 * i + 1] = std::ldexp(kE2M1[b[i] >> 4], exp);
      }
    }
  return out;
}

}  // namespace so
