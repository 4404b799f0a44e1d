// AttentionMask's contract on documents and padding (ops.h), checked on the host where doc_start
// is made, and the typed arguments of the attention ops (TensorShape, AttentionShape, the views).
#include <algorithm>
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

AttentionDocuments count_attention_documents(const int32_t* doc_start, int64_t B, int64_t S) {
  AttentionDocuments d;
  for (int64_t b = 0; b < B; ++b) {
    int64_t start = 0;
    for (int64_t i = 1; i <= S; ++i)
      if (i == S || doc_start[b * S + i] == i) {  // the document [start, i) ends
        ++d.documents;
        d.longest = std::max(d.longest, i - start);
        start = i;
      }
  }
  return d;
}

TensorShape::TensorShape(std::initializer_list<int64_t> d) {
  SO_CHECK(d.size() <= dims.size(), "TensorShape: ", d.size(), " dimensions; at most ", dims.size());
  for (int64_t x : d) dims[static_cast<size_t>(rank++)] = x;
}

int64_t TensorShape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= dims[static_cast<size_t>(i)];
  return n;
}

std::string TensorShape::text() const {
  std::string t = "[";
  for (int i = 0; i < rank; ++i) t += str_cat(i ? ", " : "", dims[static_cast<size_t>(i)]);
  return t + "]";
}

std::string AttentionShape::text() const { return str_cat("B=", B, " S=", S, " Hq=", Hq, " Hkv=", Hkv, " D=", D); }

namespace {

void check_view(const char* op, const char* name, const ConstTensorView& v, const TensorShape& shape, DType dt,
                const AttentionShape& a) {
  SO_CHECK(v.data != nullptr || shape.numel() == 0, op, ": ", name, " is null (", a.text(), ")");
  SO_CHECK(v.dtype == dt, op, ": ", name, " is ", dtype_name(v.dtype), ", q is ", dtype_name(dt), " (", a.text(), ")");
  SO_CHECK(v.shape == shape, op, ": ", name, " has shape ", v.shape.text(), "; ", a.text(), " needs ", shape.text());
}

}  // namespace

DType check_attention_tensors(const char* op, const AttentionShape& a, const AttentionInputs& in,
                              const ConstTensorView& out, const ConstTensorView& lse, const ConstTensorView& dout) {
  SO_CHECK(a.B >= 0 && a.S >= 0 && a.Hq > 0 && a.Hkv > 0 && a.D > 0 && a.Hq % a.Hkv == 0, op, ": bad shape ", a.text(),
           " (query heads must be a positive multiple of KV heads)");
  const DType dt = in.q.dtype;
  check_view(op, "q", in.q, a.queries(), dt, a);
  check_view(op, "k", in.k, a.keys(), dt, a);
  check_view(op, "v", in.v, a.keys(), dt, a);
  check_view(op, "out", out, a.queries(), dt, a);
  check_view(op, "lse", lse, a.lse(), DType::F32, a);
  if (dout.shape.rank > 0 || dout.data != nullptr) check_view(op, "dout", dout, a.queries(), dt, a);
  return dt;
}

void check_attention_grads(const char* op, const AttentionShape& a, const AttentionMask& mask, const AttentionGrads& g,
                           DType dt) {
  check_view(op, "dq", g.dq, a.queries(), dt, a);
  check_view(op, "dk", g.dk, a.keys(), dt, a);
  check_view(op, "dv", g.dv, a.keys(), dt, a);
  if (mask.sinks != nullptr) check_view(op, "dsinks_acc", g.dsinks_acc, TensorShape{a.Hq}, dt, a);
}

}  // namespace so
