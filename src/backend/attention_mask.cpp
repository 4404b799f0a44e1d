// AttentionMask's contract on documents and padding (ops.h), checked on the host where doc_start is made.
#include <string>

#include "so/backend/ops.h"
#include "so/core/error.h"

namespace so {

void check_attention_doc_start(const int32_t* doc_start, int64_t B, int64_t S) {
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* row = doc_start + b * S;
    for (int64_t i = 0; i < S; ++i) {
      const bool ok = i == 0 ? row[0] == 0 : (row[i] == row[i - 1] || row[i] == i);
      SO_CHECK(ok, "attention: doc_start of row ", b, " at token ", i, " is ", row[i],
               i == 0 ? std::string("; a row starts a document at 0")
                      : str_cat("; documents are contiguous, so it must be ", row[i - 1], " (same document) or ", i,
                                " (a new one)"));
    }
  }
}

void check_attention_key_end(const int32_t* key_end, int64_t B, int64_t S) {
  for (int64_t b = 0; b < B; ++b)
    SO_CHECK(key_end[b] >= 1 && key_end[b] <= S, "attention: key_end of row ", b, " is ", key_end[b],
             "; a row's padding starts after its first token and at most at its length ", S);
}

}  // namespace so
