#pragma once
// Errors found inside kernels (a token id outside the vocabulary, a target >= V). A kernel cannot
// throw, so it records the first such error in host-mapped memory owned by the backend; the
// backend checks the record after every host synchronisation (synchronize, event_time) and throws
// an so::Error naming the op, the row and the value. The first error wins (atomicCAS on code).
#include <cstdint>

namespace so::cuda {

enum DeviceErrorCode : int {
  kDeviceErrorNone = 0,
  kTokenOutOfRange = 1,   // embedding_forward/backward: tokens[index] = value not in [0, limit)
  kTargetOutOfRange = 2,  // cross_entropy: targets[index] = value >= limit (negatives are ignored)
  // cuDNN attention over packed rows: the batch has `value` documents, more than the `limit` its
  // AttentionMask::documents promised (index 0) / one at token `index` of `value` tokens, longer
  // than AttentionMask::longest_document's bucket `limit`.
  kAttentionDocuments = 3,
  kAttentionLongestDocument = 4,
  kGroupedGemmOffsets = 5,  // grouped_gemm: offsets[index + 1] = value decreases or passes max_rows = limit
};

struct DeviceError {
  int code;  // DeviceErrorCode; 0 = no error recorded
  int pad;
  long long index;
  long long value;
  long long limit;
};

}  // namespace so::cuda
