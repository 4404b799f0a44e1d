#pragma once
// GPT-OSS's MXFP4 expert weights (OCP Microscaling FP4): each block of 32 values is 16 bytes of
// E2M1 pairs (low nibble first) and one E8M0 scale byte (2^(scale - 127)). so_train trains in
// bf16/fp32, so checkpoints in this form are dequantised once at load, as transformers'
// convert_moe_packed_tensors does (without its final transpose: the rows stay rows).
#include <cstdint>
#include <string>
#include <vector>

namespace so {

// blocks: [rows, groups, 16] bytes; scales: [rows, groups]; returns [rows, groups * 32] fp32
// values. `what` names the tensor in errors. A scale of 255 (E8M0's NaN) or one that overflows
// fp32 is refused, naming the tensor, row and group.
std::vector<float> dequantize_mxfp4(const std::vector<uint8_t>& blocks, const std::vector<uint8_t>& scales,
                                    int64_t rows, int64_t groups, const std::string& what);

// Fails, naming `what`, the row and block, on a scale of 255 (E8M0's NaN) or one that overflows
// fp32; scales: [rows, groups].
void check_mxfp4_scales(const std::vector<uint8_t>& scales, int64_t rows, int64_t groups, const std::string& what);

// Bytes of packed E2M1 per MXFP4 block (32 values).
constexpr int64_t kMxfp4BlockBytes = 16;

}  // namespace so
