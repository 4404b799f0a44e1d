// Every Ops method on the CUDA backend against the CPU backend (the reference), in the manner of
// ggml's test-backend-ops: one case = one op call on random inputs (fixed seeds, never zeros) at
// one shape and dtype, run on both backends through the Backend/Ops interfaces only; each output
// is compared under its class's bound from op_tolerances.h. Forward and backward ops, fp32 and
// bf16, awkward sizes. Cases come in two instantiations: Small (every op, quick: the sanitizer
// runs these) and Large (rows > 65535, V ~ 50k, multi-tile attention, long positions).
// Every test skips (reported as skipped) without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "so/backend/backend.h"
#include "so/core/error.h"
#include "so/model/rope.h"
#include "src/backend/cuda/cuda_cast.h"
#include "tests/gpu/op_tolerances.h"
#include "tests/test_util.h"

namespace so {
namespace {

using test::OpClass;

// ---- host inputs -------------------------------------------------------------------------------

std::vector<float> normal(int64_t n, uint32_t seed, float stddev = 1.0f, float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(mean, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<int32_t> uniform_ints(int64_t n, uint32_t seed, int32_t lo, int32_t hi) {  // [lo, hi)
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(lo, hi - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

// Values in storage dtype dt, as raw bytes (bf16 rounded as every backend rounds).
std::vector<uint8_t> stored(const std::vector<float>& v, DType dt) {
  std::vector<uint8_t> out(v.size() * dtype_size(dt));
  if (dt == DType::F32) {
    std::memcpy(out.data(), v.data(), out.size());
  } else {
    for (size_t i = 0; i < v.size(); ++i) {
      const bf16 b = f32_to_bf16(v[i]);
      std::memcpy(out.data() + 2 * i, &b.bits, 2);
    }
  }
  return out;
}

std::vector<float> widen(const std::vector<uint8_t>& bytes, DType dt) {
  std::vector<float> out(bytes.size() / dtype_size(dt));
  if (dt == DType::F32) {
    std::memcpy(out.data(), bytes.data(), bytes.size());
  } else {
    for (size_t i = 0; i < out.size(); ++i) {
      bf16 b;
      std::memcpy(&b.bits, bytes.data() + 2 * i, 2);
      out[i] = bf16_to_f32(b);
    }
  }
  return out;
}

// ---- one case on one backend -------------------------------------------------------------------

struct Output {
  std::string name;
  DType dt;
  OpClass cls;
  int64_t k;  // GEMM inner dimension (tolerance), else 1
  std::vector<uint8_t> bytes;
};

// A backend's side of one case: device copies of the inputs, poisoned outputs, and the outputs to
// read back once the op has been enqueued. Device memory is reached only through copies.
class OpRun {
 public:
  explicit OpRun(Backend& be) : be_(be), s_(be.stream(StreamKind::Compute)) {}
  Ops& ops() { return be_.ops(); }
  Stream& s() { return s_; }

  void* in(const std::vector<uint8_t>& bytes) {
    DeviceBuffer b = be_.alloc(std::max<size_t>(bytes.size(), 1), "test input");
    be_.copy_h2d(b.data(), bytes.data(), bytes.size(), s_);
    be_.synchronize(s_);  // the host vector may go away after this
    return keep(std::move(b));
  }
  void* in(const std::vector<float>& v, DType dt) { return in(stored(v, dt)); }
  int32_t* ints(const std::vector<int32_t>& v) {
    std::vector<uint8_t> bytes(v.size() * 4);
    std::memcpy(bytes.data(), v.data(), bytes.size());
    return static_cast<int32_t*>(in(bytes));
  }
  const double* doubles(const std::vector<double>& v) {
    std::vector<uint8_t> bytes(v.size() * sizeof(double));
    std::memcpy(bytes.data(), v.data(), bytes.size());
    return static_cast<const double*>(in(bytes));
  }
  // An overwritten output, filled with NaN first so that an element the op never writes fails.
  void* out(int64_t n, DType dt) {
    return in(stored(std::vector<float>(static_cast<size_t>(n), std::numeric_limits<float>::quiet_NaN()), dt));
  }
  void expect(const char* name, const void* dev, int64_t n, DType dt, OpClass cls, int64_t k = 1) {
    pending_.push_back({name, dev, static_cast<size_t>(n) * dtype_size(dt), dt, cls, k});
  }

  std::vector<Output> finish() {
    be_.synchronize(s_);  // op errors surface here
    std::vector<Output> outs;
    for (const Pending& p : pending_) {
      Output o{p.name, p.dt, p.cls, p.k, std::vector<uint8_t>(p.bytes)};
      be_.copy_d2h(o.bytes.data(), p.dev, p.bytes, s_);
      outs.push_back(std::move(o));
    }
    be_.synchronize(s_);
    return outs;
  }

 private:
  struct Pending {
    std::string name;
    const void* dev;
    size_t bytes;
    DType dt;
    OpClass cls;
    int64_t k;
  };
  void* keep(DeviceBuffer b) {
    bufs_.push_back(std::move(b));
    return bufs_.back().data();
  }
  Backend& be_;
  Stream& s_;
  std::vector<DeviceBuffer> bufs_;
  std::vector<Pending> pending_;
};

struct OpCase {
  std::string name;                 // gtest name: [A-Za-z0-9_]
  std::function<void(OpRun&)> run;  // uploads inputs, enqueues the op, declares its outputs
  // Why the case does not apply in this process ("" = it does): an attention shape the kernel
  // forced by SO_ATTENTION_KERNEL refuses by design.
  std::function<std::string()> not_applicable = [] { return std::string(); };
};

// SO_ATTENTION_KERNEL=2 forces the tensor-core variant, which takes bf16 with D 64 or 128 only.
std::string forced_kernel_refuses(int64_t D, DType dt) {
  const char* forced = std::getenv("SO_ATTENTION_KERNEL");
  if (!forced || std::string(forced) != "2" || (dt == DType::BF16 && (D == 64 || D == 128))) return "";
  return str_cat("SO_ATTENTION_KERNEL=2 (tensor cores) takes bf16 with D 64 or 128; this case is ", dtype_name(dt),
                 " with D ", D);
}

// SO_TEST_ATTENTION=cudnn makes the CUDA backend require cuDNN's fused attention
// (BackendOptions::attention), which takes bf16 with D a multiple of 8 up to 256 and S >= 2.
std::string forced_cudnn_refuses(int64_t S, int64_t D, DType dt) {
  const char* forced = std::getenv("SO_TEST_ATTENTION");
  if (!forced || std::string(forced) != "cudnn" || (dt == DType::BF16 && D % 8 == 0 && D <= 256 && S >= 2)) return "";
  return str_cat("backend.attention=cudnn takes bf16 with D a multiple of 8 up to 256 and S >= 2; this case is ",
                 dtype_name(dt), " with D ", D, ", S ", S);
}

void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }

// Joins the non-empty name parts with '_', keeping only characters gtest accepts.
template <typename... Parts>
std::string case_name(const Parts&... parts) {
  std::string s;
  for (const std::string& p : {str_cat(parts)...})
    if (!p.empty()) s += (s.empty() ? "" : "_") + p;
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

const char* dn(DType dt) { return dtype_name(dt); }

// ---- the cases, op by op -----------------------------------------------------------------------

struct GemmShape {
  int64_t M, N, K;
  bool ta, tb;
  float alpha = 1.0f, beta = 0.0f;  // beta != 0: C starts from random values (accumulation)
};

OpCase gemm_case(GemmShape g, DType ab, DType c) {
  return {case_name("gemm", dn(ab), "c", dn(c), g.ta ? "t" : "n", g.tb ? "t" : "n", "M", g.M, "N", g.N, "K", g.K,
                    g.beta != 0.0f ? "beta" : "", g.alpha != 1.0f ? "alpha" : ""),
          [=](OpRun& r) {
            void* A = r.in(normal(g.M * g.K, 1), ab);
            void* B = r.in(normal(g.K * g.N, 2), ab);
            void* C = g.beta != 0.0f ? r.in(normal(g.M * g.N, 3), c) : r.out(g.M * g.N, c);
            const Gemm gemm = Gemm::nn(g.M, g.N, g.K, A, B, C, ab, g.beta).transposed(g.ta, g.tb);
            r.ops().gemm(r.s(), gemm.out_as(c).scaled(g.alpha));
            r.expect("C", C, g.M * g.N, c, OpClass::Gemm, g.K);
          }};
}

OpCase embedding_forward_case(int64_t T, int64_t V, int64_t H, DType dt) {
  return {case_name("embedding_forward", dn(dt), "T", T, "V", V, "H", H), [=](OpRun& r) {
            void* table = r.in(normal(V * H, 4), dt);
            const int32_t* tok = r.ints(uniform_ints(T, 5, 0, static_cast<int32_t>(V)));
            void* out = r.out(T * H, dt);
            r.ops().embedding_forward(r.s(), {.T = T, .V = V, .H = H, .dtype = dt}, out, table, tok);
            r.expect("out", out, T * H, dt, OpClass::Exact);
          }};
}

// Tokens drawn from the first `distinct` ids, so rows receive many updates each; `pad`'s row none.
OpCase embedding_backward_case(int64_t T, int64_t V, int64_t H, int64_t distinct, int64_t pad, DType dt) {
  return {case_name("embedding_backward", dn(dt), "T", T, "V", V, "H", H, "distinct", distinct, "pad", pad),
          [=](OpRun& r) {
            void* dtable = r.in(normal(V * H, 6, 0.1f), dt);
            void* dout = r.in(normal(T * H, 7), dt);
            const int32_t* tok = r.ints(uniform_ints(T, 8, 0, static_cast<int32_t>(distinct)));
            r.ops().embedding_backward(r.s(), {.T = T, .V = V, .H = H, .dtype = dt}, dtable, dout, tok, pad);
            r.expect("dtable", dtable, V * H, dt, OpClass::Scatter);
          }};
}

std::vector<float> rmsnorm_weight(int64_t dim) {
  std::vector<float> w = normal(dim, 9, 0.1f);
  for (float& x : w) x += 1.0f;
  return w;
}

OpCase rmsnorm_forward_case(int64_t rows, int64_t dim, DType dt) {
  return {case_name("rmsnorm_forward", dn(dt), "rows", rows, "dim", dim), [=](OpRun& r) {
            void* x = r.in(normal(rows * dim, 10, 1.0f, 0.3f), dt);
            void* w = r.in(rmsnorm_weight(dim), dt);
            void* out = r.out(rows * dim, dt);
            auto* rstd = static_cast<float*>(r.out(rows, DType::F32));
            r.ops().rmsnorm_forward(r.s(), {.rows = rows, .dim = dim, .eps = 1e-5f, .dtype = dt}, out, rstd, x, w);
            r.expect("out", out, rows * dim, dt, OpClass::Reduction);
            r.expect("rstd", rstd, rows, DType::F32, OpClass::Reduction);
          }};
}

// rstd is computed here from the stored x, so both backends see the same saved statistic.
OpCase rmsnorm_backward_case(int64_t rows, int64_t dim, bool accumulate, DType dt) {
  return {case_name("rmsnorm_backward", dn(dt), "rows", rows, "dim", dim, accumulate ? "accumulate" : ""),
          [=](OpRun& r) {
            const std::vector<float> xs = widen(stored(normal(rows * dim, 10, 1.0f, 0.3f), dt), dt);
            std::vector<float> rstd(static_cast<size_t>(rows));
            for (int64_t i = 0; i < rows; ++i) {
              double ss = 0;
              for (int64_t j = 0; j < dim; ++j) ss += double(xs[i * dim + j]) * xs[i * dim + j];
              rstd[i] = static_cast<float>(1.0 / std::sqrt(ss / dim + 1e-5));
            }
            void* x = r.in(xs, dt);
            void* w = r.in(rmsnorm_weight(dim), dt);
            void* dout = r.in(normal(rows * dim, 11), dt);
            auto* rs = static_cast<float*>(r.in(rstd, DType::F32));
            void* dx = accumulate ? r.in(normal(rows * dim, 12), dt) : r.out(rows * dim, dt);
            void* dw = r.in(normal(dim, 13), dt);
            r.ops().rmsnorm_backward(r.s(), {.rows = rows, .dim = dim, .eps = 1e-5f, .dtype = dt},
                                     {.dx = dx, .dw_acc = dw, .accumulate = accumulate}, dout, x, w, rs);
            r.expect("dx", dx, rows * dim, dt, OpClass::Reduction);
            r.expect("dw", dw, dim, dt, OpClass::Scatter);
          }};
}

// Positions: 0, 1, then random up to max_pos (the long-context range). A yarn table (factor 4,
// original context 4096) when `yarn`: scaled frequencies and cos/sin times its attention factor.
OpCase rope_case(int64_t T, int64_t heads, int64_t D, float theta, int32_t max_pos, bool inverse, DType dt,
                 bool yarn = false) {
  RopeScaling s;
  if (yarn) s = {.type = "yarn", .factor = 4.0, .original_max_position_embeddings = 4096};
  const RopeFrequencies f = rope_frequencies(s, theta, D);
  return {case_name("rope", dn(dt), "T", T, "heads", heads, "D", D, "theta", static_cast<int64_t>(theta), "maxpos",
                    max_pos, inverse ? "inverse" : "", yarn ? "yarn" : ""),
          [=](OpRun& r) {
            std::vector<int32_t> pos = uniform_ints(T, 14, 0, max_pos + 1);
            pos[0] = 0;
            if (T > 1) pos[1] = 1;
            if (T > 2) pos[2] = max_pos;
            void* x = r.in(normal(T * heads * D, 15), dt);
            r.ops().rope(r.s(),
                         {.T = T,
                          .heads = heads,
                          .head_dim = D,
                          .positions = r.ints(pos),
                          .inv_freq = r.doubles(f.inv_freq),
                          .attention_scale = static_cast<float>(f.attention_factor),
                          .dtype = dt},
                         x, inverse);
            r.expect("x", x, T * heads * D, dt, OpClass::Rope);
          }};
}

struct AttnShape {
  int64_t B, S, Hq, Hkv, D;
  // The mask (AttentionMask): documents per row (0: whole rows), a sliding window, sinks,
  // attention dropout's probability (its mask bits are the CPU reference's exactly), right
  // padding (key_end drawn per row: padding queries see the row's tokens, or none when their
  // document or window lies in the padding).
  int docs = 0;
  int64_t window = 0;
  bool sinks = false;
  float dropout = 0.0f;
  bool padded = false;
  // edge: row 0 has documents of one token ([1, 2) and the last token) and, padded, key_end 1
  // (every document but its first lies wholly in the padding: its queries see no key); row 1 is
  // unpadded. unknown_counts: the mask does not say how many documents the batch has or how long
  // the longest is (cuDNN then lays out the most the shape allows).
  bool edge = false;
  bool unknown_counts = false;
};

std::string attn_name(const char* op, AttnShape a, DType dt) {
  return case_name(op, dn(dt), "B", a.B, "S", a.S, "Hq", a.Hq, "Hkv", a.Hkv, "D", a.D, a.docs ? "docs" : "",
                   a.docs ? std::to_string(a.docs) : "", a.window ? "window" : "",
                   a.window ? std::to_string(a.window) : "", a.sinks ? "sinks" : "", a.dropout > 0 ? "dropout" : "",
                   a.padded ? "padded" : "", a.edge ? "edge" : "", a.unknown_counts ? "unknowncounts" : "");
}

// Under SO_TEST_ATTENTION=cudnn, the reason cuDNN does not take this shape and mask on this
// machine (what backend.attention=auto prints: dropout always; sinks or documents where the loaded
// cuDNN is too old or its deterministic backward has no such engine), so the case skips naming
// it; "" where it does. The probe backend has the suite's deterministic setting (backend_of_type).
std::string cudnn_mask_refusal(AttnShape a, DType dt) {
  static std::unique_ptr<Backend> probe = [] {
    BackendOptions o;
    o.type = "cuda";
    const char* d = std::getenv("SO_TEST_DETERMINISTIC_ATTENTION");
    o.deterministic_attention = d == nullptr || std::string(d) != "0";
    return cuda::device_count() > 0 ? create_backend(o) : nullptr;
  }();
  if (!probe || (a.docs == 0 && !a.sinks && a.dropout == 0 && !a.padded)) return "";
  static const int32_t kPlaceholder = 0;
  AttentionMask kind;
  kind.window = a.window;
  if (a.docs > 0) kind.doc_start = &kPlaceholder;
  if (a.padded) kind.key_end = &kPlaceholder;
  if (a.sinks) kind.sinks = &kPlaceholder;
  kind.dropout.p = a.dropout;
  const std::string runs = probe->ops().attention_implementation(
      AttentionShape{a.B, a.S, a.Hq, a.Hkv, a.D, 1.0f / std::sqrt(static_cast<float>(a.D))}, kind, dt);
  return runs.rfind("cuDNN", 0) == 0 ? "" : "backend.attention=cudnn cannot take this mask here: " + runs;
}

std::string attention_refusal(AttnShape a, DType dt) {
  const std::string k = forced_kernel_refuses(a.D, dt);
  if (!k.empty()) return k;
  const std::string c = forced_cudnn_refuses(a.S, a.D, dt);
  if (!c.empty()) return c;
  const char* forced = std::getenv("SO_TEST_ATTENTION");
  return forced && std::string(forced) == "cudnn" ? cudnn_mask_refusal(a, dt) : "";
}

// doc_start of B rows with `docs` documents each, boundaries drawn at random (seeded), key_end,
// and the sinks; null where the shape has none.
AttentionMask attention_mask_inputs(OpRun& r, AttnShape a, DType dt) {
  AttentionMask m;
  m.window = a.window;
  if (a.docs > 0) {
    std::vector<int32_t> cuts = uniform_ints(a.B * (a.docs - 1), 24, 1, static_cast<int32_t>(a.S));
    if (a.edge) {  // row 0: documents [1, 2) and [S - 1, S) of one token
      cuts[0] = 1, cuts[1] = 2, cuts[2] = static_cast<int32_t>(a.S - 1);
    }
    std::vector<int32_t> doc_start(static_cast<size_t>(a.B * a.S));
    for (int64_t b = 0; b < a.B; ++b) {
      std::vector<int32_t> row_cuts(cuts.begin() + b * (a.docs - 1), cuts.begin() + (b + 1) * (a.docs - 1));
      int32_t start = 0;
      for (int64_t i = 0; i < a.S; ++i) {
        for (int32_t c : row_cuts)
          if (c == i) start = static_cast<int32_t>(i);
        doc_start[b * a.S + i] = start;
      }
    }
    m.doc_start = r.ints(doc_start);
    if (!a.unknown_counts) {
      const AttentionDocuments d = count_attention_documents(doc_start.data(), a.B, a.S);
      m.documents = d.documents;
      m.longest_document = d.longest;
    }
  }
  if (a.padded) {
    std::vector<int32_t> key_end = uniform_ints(a.B, 27, 1, static_cast<int32_t>(a.S) + 1);
    if (a.edge) {
      key_end[0] = 1;
      if (a.B > 1) key_end[1] = static_cast<int32_t>(a.S);
    }
    m.key_end = r.ints(key_end);
  }
  if (a.sinks) m.sinks = r.in(normal(a.Hq, 25, 2.0f), dt);
  m.dropout.p = a.dropout;
  m.dropout.key = dropout_key(26, 3, 2);
  m.dropout.first_sample = 2;
  m.first_head = 3;  // a Ulysses rank's block of heads
  return m;
}
// q is drawn wider than k so that softmax rows are far from uniform.
AttentionInputs attention_inputs(OpRun& r, const AttentionShape& sh, DType dt) {
  return sh.inputs(dt, r.in(normal(sh.B * sh.S * sh.Hq * sh.D, 16, 2.0f), dt),
                   r.in(normal(sh.B * sh.S * sh.Hkv * sh.D, 17), dt),
                   r.in(normal(sh.B * sh.S * sh.Hkv * sh.D, 18), dt));
}

AttentionShape op_shape(AttnShape a) { return {a.B, a.S, a.Hq, a.Hkv, a.D, 1.0f / std::sqrt(static_cast<float>(a.D))}; }

OpCase attention_forward_case(AttnShape a, DType dt) {
  return {attn_name("attention_forward", a, dt),
          [=](OpRun& r) {
            const AttentionShape sh = op_shape(a);
            const AttentionInputs in = attention_inputs(r, sh, dt);
            const AttentionMask mask = attention_mask_inputs(r, a, dt);
            void* out = r.out(a.B * a.S * a.Hq * a.D, dt);
            void* lse = r.out(a.B * a.Hq * a.S, DType::F32);
            r.ops().attention_forward(r.s(), sh, mask, in, sh.query_view(out, dt), sh.lse_view(lse));
            r.expect("out", out, a.B * a.S * a.Hq * a.D, dt, OpClass::AttentionFwd);
            r.expect("lse", lse, a.B * a.Hq * a.S, DType::F32, OpClass::AttentionFwd);
          },
          [=] { return attention_refusal(a, dt); }};
}

// out and lse come from the same backend's forward, as in training (dq/dk/dv start as NaN: a row an
// implementation leaves unwritten shows).
OpCase attention_backward_case(AttnShape a, DType dt) {
  return {attn_name("attention_backward", a, dt),
          [=](OpRun& r) {
            const AttentionShape sh = op_shape(a);
            const AttentionInputs in = attention_inputs(r, sh, dt);
            const AttentionMask mask = attention_mask_inputs(r, a, dt);
            const int64_t nq = a.B * a.S * a.Hq * a.D, nkv = a.B * a.S * a.Hkv * a.D;
            void* out = r.out(nq, dt);
            void* lse = r.out(a.B * a.Hq * a.S, DType::F32);
            r.ops().attention_forward(r.s(), sh, mask, in, sh.query_view(out, dt), sh.lse_view(lse));
            void* dout = r.in(normal(nq, 19), dt);
            void *dq = r.out(nq, dt), *dk = r.out(nkv, dt), *dv = r.out(nkv, dt);
            void* dsinks = a.sinks ? r.in(normal(a.Hq, 26), dt) : nullptr;  // accumulated into
            r.ops().attention_backward(r.s(), sh, mask, in, sh.query_view(out, dt), sh.lse_view(lse),
                                       sh.query_view(dout, dt), sh.grads(dt, dq, dk, dv, dsinks));
            r.expect("dq", dq, nq, dt, OpClass::AttentionBwd);
            r.expect("dk", dk, nkv, dt, OpClass::AttentionBwd);
            r.expect("dv", dv, nkv, dt, OpClass::AttentionBwd);
            if (a.sinks) r.expect("dsinks", dsinks, a.Hq, dt, OpClass::AttentionBwd);
          },
          [=] { return attention_refusal(a, dt); }};
}

// Grouped GEMM with the group offsets on the device (moe_sort_slots' layout), each kind: rows
// varying with nn.Linear weights (trans_b) or x @ W weights, per-group pointers or one strided
// tensor, beta 0 (C starts NaN: an unread C) or 1; rows as the reduction (weight gradients: empty
// groups leave beta * C). `rows` per group: experts with no tokens, tiles cut mid-group, all
// tokens on one expert.
struct GroupedShape {
  std::vector<int32_t> rows;
  bool vary_k, trans_b, per_group;
  int64_t M, N, K;  // the fixed dimensions (vary_m: N, K; vary_k: M, N)
  float beta;
};

OpCase grouped_gemm_case(GroupedShape g, DType ab, DType c) {
  std::string dist;  // the rows per group, or their count and sum for many groups
  for (int32_t n : g.rows) dist += str_cat(dist.empty() ? "" : "_", n);
  if (g.rows.size() > 8)
    dist = str_cat("groups_", g.rows.size(), "_total_", std::accumulate(g.rows.begin(), g.rows.end(), int64_t{0}));
  return {case_name("grouped_gemm", dn(ab), "c", dn(c), g.vary_k ? "vary_k" : "vary_m", g.trans_b ? "t" : "n",
                    g.per_group ? "per_group" : "strided", "M", g.M, "N", g.N, "K", g.K, g.beta != 0 ? "beta" : "",
                    "rows", dist),
          [=](OpRun& r) {
            const int64_t G = static_cast<int64_t>(g.rows.size());
            std::vector<int32_t> offsets(1, 0);
            for (int32_t n : g.rows) offsets.push_back(offsets.back() + n);
            const int64_t R = offsets.back();
            GroupedGemm gg;
            gg.trans_a = g.vary_k, gg.trans_b = g.trans_b, gg.offsets = r.ints(offsets), gg.max_rows = R + 5;
            gg.groups = G, gg.M = g.M, gg.N = g.N, gg.K = g.K, gg.beta = g.beta, gg.alpha = 0.75f;
            gg.ab = ab, gg.c = c;
            const int64_t per_matrix = g.vary_k ? g.M * g.N : g.N * g.K;
            void* matrices = nullptr;
            int64_t c_elems = 0;
            if (g.vary_k) {
              gg.A = r.in(normal(std::max<int64_t>(R, 1) * g.M, 31), ab);
              gg.B = r.in(normal(std::max<int64_t>(R, 1) * g.N, 32), ab);
              c_elems = G * per_matrix;
              matrices = g.beta != 0 ? r.in(normal(c_elems, 33), c) : r.out(c_elems, c);
              gg.C = matrices;
            } else {
              gg.A = r.in(normal(std::max<int64_t>(R, 1) * g.K, 31), ab);
              matrices = r.in(normal(G * per_matrix, 32), ab);
              gg.B = matrices;
              c_elems = std::max<int64_t>(R, 1) * g.N;
              gg.C = g.beta != 0 ? r.in(normal(c_elems, 33), c) : r.out(R * g.N, c);
            }
            std::vector<void*> per_group;
            if (g.per_group) {  // in reverse order: group g's matrix is not at base + g
              for (int64_t i = 0; i < G; ++i)
                per_group.push_back(static_cast<char*>(matrices) +
                                    (G - 1 - i) * per_matrix * dtype_size(g.vary_k ? c : ab));
              gg.per_group = per_group.data();
            }
            r.ops().grouped_gemm(r.s(), gg);
            if (g.vary_k)
              r.expect("C", gg.C, c_elems, c, OpClass::Gemm, std::max<int64_t>(R, 1));
            else
              r.expect("C", gg.C, R * g.N, c, OpClass::Gemm, g.K);
          }};
}

// The load-balancing loss on the device: two layers' selections and router probabilities summed,
// then the loss added to an accumulator and its gradient per probability (moe_expert_stats,
// moe_aux_loss), and the per-expert token counts (int64, compared as bytes).
OpCase moe_aux_case(int64_t T, std::vector<int32_t> rows) {
  return {case_name("moe_aux_loss", "T", T, "E", rows.size()), [=](OpRun& r) {
            const int64_t E = static_cast<int64_t>(rows.size());
            std::vector<int32_t> offsets(1, 0);
            for (int32_t n : rows) offsets.push_back(offsets.back() + n);
            const int32_t* off = r.ints(offsets);
            auto* counts =
                static_cast<int64_t*>(r.in(std::vector<float>(static_cast<size_t>(2 * E), 0.0f), DType::F32));
            auto* sums = static_cast<double*>(r.in(std::vector<float>(static_cast<size_t>(4 * E), 0.0f), DType::F32));
            auto* loss = static_cast<float*>(r.in(std::vector<float>{1.5f}, DType::F32));
            auto* dprob = static_cast<float*>(r.out(E, DType::F32));
            for (uint32_t layer = 0; layer < 2; ++layer) {
              const auto* logits = static_cast<const float*>(r.in(normal(T * E, 34 + layer, 3.0f), DType::F32));
              r.ops().moe_expert_stats(r.s(), counts, sums, sums + E, logits, off, T, E);
            }
            MoeAuxLoss a;
            a.experts = E, a.weight = 0.37, a.rows = 2.0 * static_cast<double>(T);
            r.ops().moe_aux_loss(r.s(), a, loss, dprob, sums, sums + E);
            r.expect("loss", loss, 1, DType::F32, OpClass::Reduction);
            r.expect("dprob", dprob, E, DType::F32, OpClass::Exact);
            r.expect("counts", counts, 2 * E, DType::F32, OpClass::Exact);
            r.expect("sums zeroed", sums, 4 * E, DType::F32, OpClass::Exact);
          }};
}

// Residual dropout: the same keep bits (the shared hash) and the same fused multiply-add, so bit for
// bit; a Ulysses-like placement (second half of sequences of 2 x rows / B tokens, sample 7, a block
// from row 3) exercises the token numbering.
OpCase dropout_case(int64_t rows, int64_t cols, bool backward, DType dt) {
  return {case_name(backward ? "dropout_backward" : "dropout_add", dn(dt), "rows", rows, "cols", cols), [=](OpRun& r) {
            DropoutMask m;
            m.p = 0.3f;
            m.key = dropout_key(99, 5, 1);
            m.first_sample = 7;
            m.seq_local = rows, m.seq_global = 2 * rows, m.seq_offset = rows, m.row0 = 3;
            const int64_t n = rows * cols;
            void* y = r.in(normal(n, 23), dt);
            void* x = r.in(normal(n, 24), dt);
            if (backward) {
              void* dy = r.out(n, dt);
              r.ops().dropout_backward(r.s(), dy, y, rows, cols, m, dt);
              r.expect("dy", dy, n, dt, OpClass::Exact);
              return;
            }
            r.ops().dropout_add(r.s(), x, y, rows, cols, m, dt);
            r.expect("x", x, n, dt, OpClass::Exact);
          }};
}

OpCase swiglu_case(int64_t n, bool backward, DType dt) {
  return {case_name(backward ? "swiglu_backward" : "swiglu_forward", dn(dt), "n", n), [=](OpRun& r) {
            void* gate = r.in(normal(n, 20, 3.0f), dt);  // wide: both tails of the sigmoid
            void* up = r.in(normal(n, 21), dt);
            if (!backward) {
              void* out = r.out(n, dt);
              r.ops().swiglu_forward(r.s(), out, gate, up, n, dt);
              r.expect("out", out, n, dt, OpClass::Elementwise);
              return;
            }
            void* dout = r.in(normal(n, 22), dt);
            void *dgate = r.out(n, dt), *dup = r.out(n, dt);
            r.ops().swiglu_backward(r.s(), dgate, dup, dout, gate, up, n, dt);
            r.expect("dgate", dgate, n, dt, OpClass::Elementwise);
            r.expect("dup", dup, n, dt, OpClass::Elementwise);
          }};
}

// The [W_gate; W_up] GEMM's output form: rows of [gate | up]; cols of 64 take the vector path,
// odd cols the scalar one.
OpCase swiglu_rows_case(int64_t rows, int64_t cols, bool backward, DType dt) {
  return {case_name(backward ? "swiglu_rows_backward" : "swiglu_rows_forward", dn(dt), "rows", rows, "cols", cols),
          [=](OpRun& r) {
            const int64_t n = rows * cols;
            void* gate_up = r.in(normal(2 * n, 27, 3.0f), dt);
            if (!backward) {
              void* out = r.out(n, dt);
              r.ops().swiglu_rows_forward(r.s(), out, gate_up, rows, cols, dt);
              r.expect("out", out, n, dt, OpClass::Elementwise);
              return;
            }
            void* dout = r.in(normal(n, 28), dt);
            void* dgate_up = r.out(2 * n, dt);
            r.ops().swiglu_rows_backward(r.s(), dgate_up, dout, gate_up, rows, cols, dt);
            r.expect("dgate_up", dgate_up, 2 * n, dt, OpClass::Elementwise);
          }};
}

// Every 7th target is -1 (ignored); the loss accumulator starts from a non-zero value. z_loss:
// OLMo's z-loss coefficient (0 = off).
OpCase cross_entropy_case(int64_t rows, int64_t V, bool with_grad, DType dt, float z_loss = 0.0f) {
  return {case_name("cross_entropy", dn(dt), "rows", rows, "V", V, with_grad ? "grad" : "lossonly",
                    z_loss != 0.0f ? str_cat("z", z_loss) : ""),
          [=](OpRun& r) {
            std::vector<int32_t> targets = uniform_ints(rows, 23, 0, static_cast<int32_t>(V));
            for (size_t i = 3; i < targets.size(); i += 7) targets[i] = -1;
            const float* logits = static_cast<const float*>(r.in(normal(rows * V, 24, 3.0f), DType::F32));
            auto* loss = static_cast<float*>(r.in(std::vector<float>{0.37f}, DType::F32));
            void* dlogits = with_grad ? r.out(rows * V, dt) : nullptr;
            r.ops().cross_entropy(r.s(), {.rows = rows, .V = V, .scale = 1.0f / rows, .z_loss = z_loss, .dtype = dt},
                                  loss, dlogits, logits, r.ints(targets));
            r.expect("loss", loss, 1, DType::F32, OpClass::Reduction);
            if (with_grad) r.expect("dlogits", dlogits, rows * V, dt, OpClass::Reduction);
          }};
}

// Bitwise: the engine adds per-bucket sums from this op (device buckets) and from GraceAdam
// (offloaded buckets) to form the clipping norm, so the placement modes agree bit for bit only if
// they agree (ops.h: fixed chunks accumulated in double, as adam_kernels.h's sum_squares_chunked).
// `poison`: one element NaN or Inf, which must make the sum non-finite.
OpCase sum_squares_case(int64_t n, float poison, DType dt) {
  return {case_name("sum_squares", dn(dt), "n", n,
                    std::isnan(poison)   ? "nan"
                    : std::isinf(poison) ? "inf"
                                         : ""),
          [=](OpRun& r) {
            std::vector<float> x = normal(n, 25);
            if (poison != 0.0f) x[x.size() / 2] = poison;
            auto* acc = static_cast<float*>(r.in(std::vector<float>{0.0f}, DType::F32));
            r.ops().sum_squares(r.s(), acc, r.in(x, dt), n, dt);
            r.expect("sum", acc, 1, DType::F32, OpClass::Exact);
          }};
}

// Bitwise: a step validated on the device must be decided as the host decides it (clip_decision.h):
// this rank's bucket sums added in order, then the ranks' sums (the others given) in rank order;
// clipped, unclipped and unclipping (max_norm 0), and a NaN or infinite bucket sum (skipped).
OpCase clip_decision_case(int ranks, float max_norm, float poison) {
  return {case_name("clip_decision", "ranks", ranks, "max", max_norm,
                    std::isnan(poison)   ? "nan"
                    : std::isinf(poison) ? "inf"
                                         : ""),
          [=](OpRun& r) {
            constexpr int64_t kBuckets = 37;
            std::vector<float> sums = normal(kBuckets, 40);
            for (float& x : sums) x = 3.0f * x * x;
            if (poison != 0.0f) sums[11] = poison;
            std::vector<double> rank_sums(static_cast<size_t>(ranks), std::numeric_limits<double>::quiet_NaN());
            for (int k = 1; k < ranks; ++k) rank_sums[k] = 17.25 * k + 1.0 / 3.0;
            auto* all = const_cast<double*>(r.doubles(rank_sums));
            r.ops().sum_in_order(r.s(), all, static_cast<const float*>(r.in(sums, DType::F32)), kBuckets);
            auto* d = static_cast<ClipDecision*>(r.out(sizeof(ClipDecision) / 4, DType::F32));
            r.ops().clip_decision(r.s(), d, all, ranks, max_norm);
            r.expect("rank sums", all, 2 * ranks, DType::F32, OpClass::Exact);  // doubles as fp32 word pairs
            r.expect("decision", d, sizeof(ClipDecision) / 4, DType::F32, OpClass::Exact);
          }};
}

// Values spanning the range plus the special cases of rounding: NaN, infinities, signed zero,
// subnormals, exact ties between two bf16 values.
std::vector<float> cast_values(int64_t n) {
  std::vector<float> v = normal(n, 26, 100.0f);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            INFINITY,
                            -INFINITY,
                            -0.0f,
                            1e-40f,
                            -3e-39f,
                            1.00390625f,
                            1.01171875f,
                            3.4e38f,
                            -1.5f};
  for (size_t i = 0; i < std::size(specials) && i < v.size(); ++i) v[i * 7 % v.size()] = specials[i];
  return v;
}

OpCase cast_case(int64_t n, DType src_dt, DType dst_dt) {
  return {case_name("cast", dn(src_dt), "to", dn(dst_dt), "n", n), [=](OpRun& r) {
            void* src = r.in(cast_values(n), src_dt);
            void* dst = r.out(n, dst_dt);
            r.ops().cast(r.s(), dst, dst_dt, src, src_dt, n);
            r.expect("dst", dst, n, dst_dt, OpClass::Exact);
          }};
}

OpCase transpose_blocks_case(int64_t d0, int64_t d1, int64_t inner, DType dt) {
  return {case_name("transpose_blocks", dn(dt), "d0", d0, "d1", d1, "inner", inner), [=](OpRun& r) {
            const int64_t n = d0 * d1 * inner;
            void* src = r.in(normal(n, 27), dt);
            void* dst = r.out(n, dt);
            r.ops().transpose_blocks(r.s(), dst, src, d0, d1, inner, dt);
            r.expect("dst", dst, n, dt, OpClass::Exact);
          }};
}

// A column block of wider rows to rows of its own and back (the q|k|v split and gather); the
// destination starts filled, so columns outside the block must stay as they were. Odd widths take
// the 2-byte path, aligned ones the wide one.
OpCase copy_columns_case(int64_t rows, int64_t wide, int64_t col0, int64_t cols, bool to_wide, DType dt) {
  return {case_name("copy_columns", dn(dt), "rows", rows, "wide", wide, "col0", col0, "cols", cols,
                    to_wide ? "to_wide" : "to_narrow"),
          [=](OpRun& r) {
            const size_t e = dtype_size(dt);
            void* w = r.in(normal(rows * wide, 29), dt);
            void* n = r.in(normal(rows * cols, 30), dt);
            char* block = static_cast<char*>(w) + col0 * e;
            if (to_wide)
              r.ops().copy_columns(r.s(), block, wide, n, cols, rows, cols, dt);
            else
              r.ops().copy_columns(r.s(), n, cols, block, wide, rows, cols, dt);
            r.expect(to_wide ? "wide" : "narrow", to_wide ? w : n, to_wide ? rows * wide : rows * cols, dt,
                     OpClass::Exact);
          }};
}

OpCase replicate_heads_case(int64_t rows, int64_t heads, int64_t copies, int64_t D, bool reverse, DType dt) {
  return {case_name("replicate_heads", dn(dt), "rows", rows, "heads", heads, "copies", copies, "D", D,
                    reverse ? "reverse" : ""),
          [=](OpRun& r) {
            const int64_t narrow = rows * heads * D, wide = narrow * copies;
            void* in = r.in(normal(reverse ? wide : narrow, 28), dt);
            void* out = r.out(reverse ? narrow : wide, dt);
            r.ops().replicate_heads(r.s(), {.rows = rows, .heads = heads, .copies = copies, .head_dim = D, .dtype = dt},
                                    out, in, reverse);
            r.expect("out", out, reverse ? narrow : wide, dt, reverse ? OpClass::Elementwise : OpClass::Exact);
          }};
}

// Bitwise against the CPU's AdamW calls, which equal the scalar reference (adamw.h) and the host
// kernels bit for bit; the offload modes' equivalence and the device buckets' speculation on the
// GPU rest on this. Clipping scale and weight decay active; with a snapshot (the exact rollback),
// and with a non-finite guard (the call must leave everything untouched). With a device decision
// (Ops::clip_decision's), its coefficient replaces hp.grad_scale, and a skipped one leaves everything.
OpCase adam_case(AdamCall call, bool snapshot, bool finite_guard, int64_t n, DType grad_dt, DType out_dt,
                 std::optional<ClipDecision> decision = std::nullopt) {
  const char* names[] = {"step", "rollback", "redo"};
  return {case_name(str_cat("adam_", names[static_cast<int>(call)], snapshot ? "_snapshot" : "",
                            finite_guard ? "" : "_nonfinite_guard",
                            !decision           ? ""
                            : decision->skipped ? "_decided_skip"
                                                : "_decided"),
                    "grad", dn(grad_dt), "out", dn(out_dt), "n", n),
          [=](OpRun& r) {
            std::vector<float> v = normal(n, 31, 0.01f);
            for (float& x : v) x *= x;
            AdamArrays a;
            a.p = static_cast<float*>(r.in(normal(n, 29, 0.1f), DType::F32));
            a.m = static_cast<float*>(r.in(normal(n, 30, 0.01f), DType::F32));
            a.v = static_cast<float*>(r.in(v, DType::F32));
            a.grad = r.in(normal(n, 32, 0.05f), grad_dt), a.grad_dt = grad_dt;
            a.out = r.out(n, out_dt), a.out_dt = out_dt;
            if (snapshot) {
              a.snapshot_p = static_cast<float*>(r.in(normal(n, 33, 0.1f), DType::F32));
              a.snapshot_m = static_cast<float*>(r.in(normal(n, 34, 0.01f), DType::F32));
              a.snapshot_v = static_cast<float*>(r.in(v, DType::F32));
            }
            const auto* guard =
                static_cast<const float*>(r.in(std::vector<float>{finite_guard ? 3.5f : NAN}, DType::F32));
            AdamWParams hp;
            hp.lr = 3e-3;
            hp.beta1 = 0.9;
            hp.beta2 = 0.95;
            hp.eps = 1e-8;
            hp.weight_decay = 0.1;
            hp.step = 7;
            hp.grad_scale = 0.37f;
            const ClipDecision* d = nullptr;
            if (decision) {
              std::vector<uint8_t> bytes(sizeof(ClipDecision));
              std::memcpy(bytes.data(), &*decision, bytes.size());
              d = static_cast<const ClipDecision*>(r.in(bytes));
            }
            r.ops().adam(r.s(), call, a, n, hp, 0.61f, guard, d);
            r.expect("p", a.p, n, DType::F32, OpClass::Exact);
            r.expect("m", a.m, n, DType::F32, OpClass::Exact);
            r.expect("v", a.v, n, DType::F32, OpClass::Exact);
            if (finite_guard && !(decision && decision->skipped)) r.expect("out", a.out, n, out_dt, OpClass::Exact);
            if (snapshot) r.expect("snapshot p", a.snapshot_p, n, DType::F32, OpClass::Exact);
          }};
}

constexpr DType kDTypes[] = {DType::F32, DType::BF16};

// Quick cases touching every op and every code path (edge shapes: one row, one token, odd sizes).
std::vector<OpCase> small_cases() {
  std::vector<OpCase> c;
  for (DType dt : kDTypes) {
    for (bool ta : {false, true})
      for (bool tb : {false, true}) c.push_back(gemm_case({67, 45, 129, ta, tb}, dt, dt));
    c.push_back(gemm_case({1, 257, 64, false, false}, dt, dt));
    c.push_back(gemm_case({33, 65, 100, true, false, 0.5f, 1.0f}, dt, DType::F32));  // dW += dY^T X in fp32
    c.push_back(embedding_forward_case(37, 1000, 77, dt));
    c.push_back(embedding_backward_case(37, 1000, 77, 5, -1, dt));
    c.push_back(embedding_backward_case(37, 1000, 77, 5, 3, dt));
    c.push_back(rmsnorm_forward_case(1, 77, dt));
    c.push_back(rmsnorm_forward_case(333, 40, dt));
    for (bool acc : {false, true}) c.push_back(rmsnorm_backward_case(333, 40, acc, dt));
    // Rows wider than four column groups per thread: the partial dW goes through the workspace.
    c.push_back(rmsnorm_backward_case(37, 9000, true, dt));
    for (bool inv : {false, true}) {
      c.push_back(rope_case(37, 3, 80, 10000.0f, 4096, inv, dt));
      c.push_back(rope_case(5, 2, 64, 500000.0f, 4096, inv, dt));
      c.push_back(rope_case(37, 3, 128, 1000000.0f, 131071, inv, dt, true));
    }
    // Masks: documents (tile-skipping across 32- and 64-key tiles), windows shorter and longer than
    // a tile, sinks, padding, and their combinations; bf16 ones run through cuDNN where it takes
    // them (packed rows as ragged sequences, padding as sequence lengths), so each kind is here with
    // and without a window; edge cases (documents of one token, key_end 1, documents and windows
    // wholly in the padding) and documents whose counts the mask does not give.
    for (AttnShape a :
         {AttnShape{1, 1, 4, 1, 64}, AttnShape{2, 70, 4, 4, 80}, AttnShape{1, 130, 8, 2, 128},
          AttnShape{2, 200, 4, 2, 64, 4}, AttnShape{2, 200, 4, 2, 80, 0, 7}, AttnShape{1, 260, 4, 2, 128, 0, 100},
          AttnShape{2, 150, 4, 1, 64, 0, 0, true}, AttnShape{2, 300, 8, 2, 128, 5, 40, true},
          AttnShape{1, 97, 4, 4, 80, 3, 33, true}, AttnShape{2, 200, 4, 2, 64, 0, 0, false, 0.2f},
          AttnShape{1, 130, 8, 2, 80, 0, 0, false, 0.3f}, AttnShape{2, 300, 8, 2, 128, 5, 40, true, 0.1f},
          AttnShape{3, 200, 4, 2, 64, 0, 0, false, 0, true}, AttnShape{2, 130, 8, 2, 80, 0, 7, false, 0, true},
          AttnShape{3, 300, 8, 2, 128, 5, 40, true, 0.1f, true},
          // packed + padded, with and without a window and sinks
          AttnShape{3, 256, 8, 2, 128, 6, 0, false, 0, true}, AttnShape{3, 256, 8, 2, 64, 6, 48, false, 0, true},
          AttnShape{3, 300, 8, 2, 128, 5, 40, true, 0, true}, AttnShape{2, 130, 8, 2, 80, 0, 7, true, 0, true},
          AttnShape{2, 192, 4, 4, 64, 3, 0, false, 0, false, false, true},
          AttnShape{2, 192, 4, 2, 128, 4, 0, false, 0, true, false, true},
          // edges: one-token documents, key_end 1, documents wholly in the padding
          AttnShape{2, 160, 4, 2, 64, 5, 0, false, 0, true, true},
          AttnShape{2, 160, 4, 2, 64, 5, 16, true, 0, true, true},
          AttnShape{2, 160, 4, 2, 128, 5, 0, false, 0, false, true},
          AttnShape{3, 96, 4, 1, 64, 0, 24, false, 0, true, true}}) {
      c.push_back(attention_forward_case(a, dt));
      c.push_back(attention_backward_case(a, dt));
    }
    for (const std::vector<int32_t>& rows :
         {std::vector<int32_t>{3, 0, 70, 1, 0, 130}, std::vector<int32_t>{0, 0, 200, 0}, std::vector<int32_t>{0, 0}}) {
      for (bool per_group : {false, true}) {
        c.push_back(grouped_gemm_case({rows, false, true, per_group, 0, 72, 40, 0.0f}, dt, dt));
        c.push_back(grouped_gemm_case({rows, false, false, per_group, 0, 72, 40, 1.0f}, dt, dt));
        c.push_back(grouped_gemm_case({rows, true, false, per_group, 40, 72, 0, 1.0f}, dt, dt));
        c.push_back(grouped_gemm_case({rows, true, false, per_group, 40, 72, 0, 0.0f}, dt, dt));
      }
      c.push_back(grouped_gemm_case({rows, false, false, true, 0, 72, 1, 1.0f}, dt, dt));  // bias: ones @ b_e
      c.push_back(grouped_gemm_case({rows, true, false, true, 1, 72, 0, 1.0f}, dt, dt));   // bias gradient
    }
    for (bool bwd : {false, true}) {
      c.push_back(swiglu_case(1, bwd, dt));
      c.push_back(swiglu_case(1001, bwd, dt));
      c.push_back(swiglu_rows_case(37, 64, bwd, dt));
      c.push_back(swiglu_rows_case(5, 33, bwd, dt));
      c.push_back(dropout_case(37, 129, bwd, dt));
    }
    for (bool grad : {false, true}) c.push_back(cross_entropy_case(3, 11, grad, dt));
    c.push_back(cross_entropy_case(5, 1003, true, dt));
    for (bool grad : {false, true}) c.push_back(cross_entropy_case(5, 1003, grad, dt, 1e-2f));
    c.push_back(sum_squares_case(1, 0.0f, dt));
    c.push_back(sum_squares_case(16385, 0.0f, dt));  // one element past a chunk
    c.push_back(sum_squares_case(1000, std::numeric_limits<float>::quiet_NaN(), dt));
    c.push_back(sum_squares_case(1000, INFINITY, dt));
    for (DType to : kDTypes) c.push_back(cast_case(1000, dt, to));
    c.push_back(transpose_blocks_case(3, 5, 7, dt));
    for (bool to_wide : {false, true}) {
      c.push_back(copy_columns_case(37, 192, 128, 32, to_wide, dt));  // the k block of q 128 | k 32 | v 32
      c.push_back(copy_columns_case(5, 21, 3, 7, to_wide, dt));
    }
    for (bool rev : {false, true}) c.push_back(replicate_heads_case(5, 2, 4, 80, rev, dt));
    for (DType out : kDTypes)
      for (AdamCall call : {AdamCall::Step, AdamCall::Rollback, AdamCall::Redo})
        for (bool snapshot : {false, true}) c.push_back(adam_case(call, snapshot, true, 1001, dt, out));
    c.push_back(adam_case(AdamCall::Step, false, false, 1001, dt, dt));
    c.push_back(adam_case(AdamCall::Redo, true, false, 1001, dt, dt));
    c.push_back(adam_case(AdamCall::Step, false, true, 1001, dt, dt, ClipDecision{2.5, 0.43f, 0}));
    c.push_back(adam_case(AdamCall::Step, false, true, 1001, dt, dt, ClipDecision{INFINITY, 1.0f, 1}));
  }
  for (int ranks : {1, 3})
    for (float max_norm : {1.0f, 1e4f, 0.0f}) c.push_back(clip_decision_case(ranks, max_norm, 0.0f));
  for (float poison : {std::numeric_limits<float>::quiet_NaN(), INFINITY})
    c.push_back(clip_decision_case(3, 1.0f, poison));
  c.push_back(gemm_case({33, 65, 100, false, true}, DType::BF16, DType::F32));  // bf16 inputs, fp32 C
  c.push_back(grouped_gemm_case({{5, 0, 64, 66}, false, true, true, 0, 40, 72, 0.0f}, DType::BF16, DType::F32));
  c.push_back(moe_aux_case(37, {3, 0, 40, 1, 30}));
  c.push_back(moe_aux_case(300, {0, 0, 600, 0}));
  return c;
}

// Sizes the kernels' grids and tiles must get right: rows > 65535 (a grid's y/z limit), V ~ 50k,
// attention over many tiles with S off the tile size and GQA ratios 4 and 1, long positions.
std::vector<OpCase> large_cases() {
  std::vector<OpCase> c;
  for (DType dt : kDTypes) {
    c.push_back(gemm_case({509, 1000, 4096, false, true}, dt, dt));
    c.push_back(gemm_case({1, 2048, 2048, false, true}, dt, dt));
    c.push_back(gemm_case({2048, 512, 3000, true, false, 1.0f, 1.0f}, dt, dt));
    c.push_back(embedding_forward_case(4099, 32003, 1024, dt));
    c.push_back(embedding_forward_case(70001, 1000, 40, dt));
    c.push_back(embedding_backward_case(4099, 32003, 1024, 300, -1, dt));
    c.push_back(rmsnorm_forward_case(70001, 40, dt));
    c.push_back(rmsnorm_forward_case(4097, 2048, dt));
    c.push_back(rmsnorm_backward_case(70001, 40, false, dt));
    c.push_back(rmsnorm_backward_case(4097, 2048, true, dt));
    c.push_back(rope_case(4099, 32, 64, 500000.0f, 131071, false, dt));
    c.push_back(rope_case(70001, 1, 128, 10000.0f, 131071, true, dt));
    c.push_back(rope_case(1025, 4, 128, 500000.0f, (1 << 22) + 12345, false, dt));  // million-token positions
    for (AttnShape a :
         {AttnShape{2, 300, 8, 2, 64}, AttnShape{1, 1024, 8, 8, 128}, AttnShape{2, 333, 4, 1, 80},
          AttnShape{1, 1024, 8, 2, 128, 0, 0, false, 0.1f}, AttnShape{4, 1024, 8, 2, 128, 12, 0, false, 0, true},
          AttnShape{2, 2048, 8, 1, 64, 9, 256, true, 0, true}}) {
      c.push_back(attention_forward_case(a, dt));
      c.push_back(attention_backward_case(a, dt));
    }
    for (bool bwd : {false, true}) c.push_back(swiglu_case((1 << 22) + 3, bwd, dt));
    c.push_back(cross_entropy_case(257, 50257, true, dt));
    c.push_back(cross_entropy_case(70001, 11, true, dt));
    c.push_back(cross_entropy_case(64, 32000, false, dt));
    c.push_back(sum_squares_case(5000011, 0.0f, dt));
    for (DType to : kDTypes) c.push_back(cast_case((1 << 22) + 5, dt, to));
    c.push_back(transpose_blocks_case(8, 4, 4104, dt));
    for (bool rev : {false, true}) c.push_back(replicate_heads_case(4099, 8, 2, 128, rev, dt));
    for (DType out : kDTypes) c.push_back(adam_case(AdamCall::Step, false, true, (1 << 22) + 3, dt, out));
    c.push_back(adam_case(AdamCall::Redo, false, true, (1 << 22) + 3, dt, dt));
    // An MoE layer's expert GEMMs at Qwen3-MoE-like sizes (E 128, 8 of them per token, 1024 tokens),
    // experts unevenly loaded and some idle.
    std::vector<int32_t> rows(128);
    for (size_t e = 0; e < rows.size(); ++e) rows[e] = e % 7 == 3 ? 0 : static_cast<int32_t>((e * 37) % 129);
    c.push_back(grouped_gemm_case({rows, false, true, true, 0, 768, 2048, 0.0f}, dt, dt));
    c.push_back(grouped_gemm_case({rows, true, false, true, 256, 512, 0, 1.0f}, dt, dt));
  }
  return c;
}

// ---- the tests ---------------------------------------------------------------------------------

// The CUDA backend's attention as the ctest entry asks (tests/gpu/cuda_tests.cmake): auto by
// default, SO_TEST_ATTENTION=cudnn|flash; deterministic (RunToRunBitwise needs it) unless
// SO_TEST_DETERMINISTIC_ATTENTION=0 asks for cuDNN's atomics.
std::unique_ptr<Backend> backend_of_type(const char* type) {
  BackendOptions o;
  o.type = type;
  if (const char* a = std::getenv("SO_TEST_ATTENTION")) o.attention = a;
  const char* d = std::getenv("SO_TEST_DETERMINISTIC_ATTENTION");
  o.deterministic_attention = d == nullptr || std::string(d) != "0";
  return create_backend(o);
}

// Both backends live for the whole suite (one CUDA context per process).
class CudaOps : public testing::TestWithParam<OpCase> {
 protected:
  static void SetUpTestSuite() {
    if (cuda::device_count() == 0) return;
    cpu_ = backend_of_type("cpu").release();
    cuda_ = backend_of_type("cuda").release();
  }
  static void TearDownTestSuite() {
    delete cuda_;
    delete cpu_;
    cuda_ = cpu_ = nullptr;
  }
  void SetUp() override {
    if (!cuda_) GTEST_SKIP() << "no CUDA device (so::cuda::device_count() == 0)";
    if (const std::string why = GetParam().not_applicable(); !why.empty()) GTEST_SKIP() << why;
  }
  std::vector<Output> run_on(Backend& be) const {
    OpRun r(be);
    GetParam().run(r);
    return r.finish();
  }
  static Backend* cpu_;
  static Backend* cuda_;
};
Backend* CudaOps::cpu_ = nullptr;
Backend* CudaOps::cuda_ = nullptr;

// Elements that differ bit for bit (NaN matches any NaN); -1 when none.
int64_t first_bit_mismatch(const Output& a, const Output& b) {
  const size_t es = dtype_size(a.dt);
  const std::vector<float> fa = widen(a.bytes, a.dt), fb = widen(b.bytes, b.dt);
  for (size_t i = 0; i < fa.size(); ++i)
    if (std::memcmp(a.bytes.data() + i * es, b.bytes.data() + i * es, es) && !(std::isnan(fa[i]) && std::isnan(fb[i])))
      return static_cast<int64_t>(i);
  return -1;
}

int64_t count_bit_mismatches(const Output& a, const Output& b) {
  const size_t es = dtype_size(a.dt);
  const std::vector<float> fa = widen(a.bytes, a.dt), fb = widen(b.bytes, b.dt);
  int64_t n = 0;
  for (size_t i = 0; i < fa.size(); ++i)
    n += std::memcmp(a.bytes.data() + i * es, b.bytes.data() + i * es, es) && !(std::isnan(fa[i]) && std::isnan(fb[i]));
  return n;
}

TEST_P(CudaOps, MatchesCpu) {
  const std::vector<Output> ref = run_on(*cpu_), got = run_on(*cuda_);
  ASSERT_EQ(ref.size(), got.size());
  for (size_t o = 0; o < ref.size(); ++o) {
    const Output &g = got[o], &r = ref[o];
    ASSERT_EQ(g.bytes.size(), r.bytes.size());
    const double bound = test::op_tolerance(r.cls, r.dt, r.k);
    std::vector<float> gf = widen(g.bytes, g.dt), rf = widen(r.bytes, r.dt);
    if (r.cls == OpClass::Exact) {
      const int64_t first = first_bit_mismatch(g, r);
      std::printf("  %-8s %-5s exact: %lld of %zu elements differ\n", r.name.c_str(), dtype_name(r.dt),
                  static_cast<long long>(count_bit_mismatches(g, r)), rf.size());
      EXPECT_EQ(first, -1) << r.name << " must equal the CPU bit for bit; first difference at element " << first
                           << ": cuda " << (first >= 0 ? gf[first] : 0.0f) << " vs cpu "
                           << (first >= 0 ? rf[first] : 0.0f);
      continue;
    }
    int64_t bad = 0, first_bad = -1;
    for (size_t i = 0; i < rf.size(); ++i)
      if (std::isfinite(rf[i]) != std::isfinite(gf[i])) {
        if (first_bad < 0) first_bad = static_cast<int64_t>(i);
        ++bad;
      }
    EXPECT_EQ(bad, 0) << r.name << ": " << bad << " elements finite on one backend only (NaN: never written?); first "
                      << first_bad << ": cuda " << (first_bad >= 0 ? gf[first_bad] : 0.0f) << " vs cpu "
                      << (first_bad >= 0 ? rf[first_bad] : 0.0f);
    // The same infinity on both (lse -inf of a row that sees no key) is agreement, not error.
    for (size_t i = 0; i < rf.size(); ++i)
      if (std::isinf(rf[i]) && gf[i] == rf[i]) gf[i] = rf[i] = 0.0f;
    const double err = test::rel_error(gf, rf);
    std::printf("  %-8s %-5s %-18s rel error %.3e (bound %.1e)\n", r.name.c_str(), dtype_name(r.dt),
                test::op_class_name(r.cls), err, bound);
    EXPECT_LE(err, bound) << r.name << " (" << dtype_name(r.dt) << ", " << test::op_class_name(r.cls)
                          << "): ||cuda - cpu|| / ||cpu|| over " << rf.size() << " elements"
                          << (r.cls == OpClass::Rope ? "; the CPU forms rope angles in double, see op_tolerances.h"
                                                     : "");
  }
}

// The same inputs twice on the GPU give the same bits: no atomics whose order varies between runs.
// The bitwise mode equivalences of test_cuda_training need this of every op the model uses.
TEST_P(CudaOps, RunToRunBitwise) {
  const std::vector<Output> a = run_on(*cuda_), b = run_on(*cuda_);
  ASSERT_EQ(a.size(), b.size());
  for (size_t o = 0; o < a.size(); ++o) {
    const int64_t n = count_bit_mismatches(a[o], b[o]);
    EXPECT_EQ(n, 0) << a[o].name << ": " << n << " elements differ between two identical CUDA runs (order-dependent "
                    << "atomics?); first at " << first_bit_mismatch(a[o], b[o]);
  }
}

// Which attention runs is decided per shape, reported, and a requirement that cannot be met is an
// error naming the shape: fp32 never goes to cuDNN; "flash" never does; "cudnn" refuses fp32.
TEST(AttentionChoice, ReportedPerShapeAndForcedModesHold) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const auto with = [](const char* mode) {
    BackendOptions o;
    o.type = "cuda";
    o.attention = mode;
    return create_backend(o);
  };
  const AttentionShape small{1, 128, 4, 2, 64, 0.125f};
  const std::string fp32 = with("auto")->ops().attention_implementation(small, AttentionMask{}, DType::F32);
  EXPECT_NE(fp32.find("flash kernels"), std::string::npos) << fp32;
  EXPECT_NE(fp32.find("takes bf16"), std::string::npos) << fp32;
  const std::string auto_bf16 = with("auto")->ops().attention_implementation(small, AttentionMask{}, DType::BF16);
  std::printf("  auto, bf16 B 1 S 128 Hq 4 Hkv 2 D 64: %s\n", auto_bf16.c_str());
  EXPECT_TRUE(auto_bf16.rfind("cuDNN", 0) == 0 || auto_bf16.find("not cuDNN: ") != std::string::npos) << auto_bf16;
  const std::string flash = with("flash")->ops().attention_implementation(small, AttentionMask{}, DType::BF16);
  EXPECT_NE(flash.find("backend.attention is flash"), std::string::npos) << flash;
  try {
    with("cudnn")->ops().attention_implementation(small, AttentionMask{}, DType::F32);
    ADD_FAILURE() << "backend.attention=cudnn accepted fp32";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("backend.attention is cudnn"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("S=128"), std::string::npos) << e.what();
  }
}

// cuDNN's deterministic backward needs a large workspace; the host enqueues backward after backward
// far faster than the GPU runs them. One workspace per stream, kept: after many back-to-back calls
// the pool's peak is the tensors plus one workspace (two for a moment while it grows from the
// forward's size to the backward's), and one stays allocated. A workspace allocated per call, freed
// in stream order, would leave one alive per queued call.
TEST(AttentionWorkspace, OneKeptHoweverFarTheHostRunsAhead) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  BackendOptions o;
  o.type = "cuda";
  o.attention = "cudnn";
  o.deterministic_attention = true;
  std::unique_ptr<Backend> be = create_backend(o);
  const int64_t B = 1, S = 4096, Hq = 16, Hkv = 4, D = 128;
  const AttentionShape a{B, S, Hq, Hkv, D, 1.0f / std::sqrt(static_cast<float>(D))};
  Ops& ops = be->ops();
  try {
    std::printf("  %s\n", ops.attention_implementation(a, AttentionMask{}, DType::BF16).c_str());
  } catch (const Error& e) {
    GTEST_SKIP() << e.what();  // no cuDNN on this machine
  }
  const size_t ws = ops.attention_workspace_bytes(a, AttentionMask{}, DType::BF16);
  ASSERT_GE(ws, size_t{16} << 20) << "the shape was chosen for a large workspace; got " << ws << " bytes";
  const size_t qb = static_cast<size_t>(B * S * Hq * D) * 2, kb = static_cast<size_t>(B * S * Hkv * D) * 2;
  std::vector<DeviceBuffer> t;
  for (size_t bytes : {qb, kb, kb, qb, qb, qb, kb, kb, static_cast<size_t>(B * Hq * S) * 4})
    t.push_back(be->alloc(bytes, "attention tensor"));  // q k v out dout dq dk dv lse, zeros
  Stream& s = be->stream(StreamKind::Compute);
  be->synchronize(s);
  const size_t tensors = be->memory_stats().in_use;
  const DType bf = DType::BF16;
  const AttentionInputs in = a.inputs(bf, t[0].data(), t[1].data(), t[2].data());
  ops.attention_forward(s, a, AttentionMask{}, in, a.query_view(t[3].data(), bf), a.lse_view(t[8].data()));
  constexpr int kCalls = 40;
  for (int i = 0; i < kCalls; ++i)
    ops.attention_backward(s, a, AttentionMask{}, in, a.query_view(t[3].data(), bf), a.lse_view(t[8].data()),
                           a.query_view(t[4].data(), bf), a.grads(bf, t[5].data(), t[6].data(), t[7].data(), nullptr));
  be->synchronize(s);
  const MemoryStats m = be->memory_stats();
  const size_t kept =
      (ws + be->allocation_granularity() - 1) / be->allocation_granularity() * be->allocation_granularity();
  std::printf("  tensors %zu MiB, workspace %zu MiB, peak %zu MiB after %d backward calls\n", tensors >> 20, ws >> 20,
              m.peak >> 20, kCalls);
  EXPECT_EQ(m.in_use, tensors + kept) << "one workspace stays allocated for the stream";
  EXPECT_LE(m.peak, tensors + 2 * kept) << "more than one attention workspace was alive at once";
}

// Long context through cuDNN, at Ulysses' shapes (the whole sequence, a rank's share of heads):
// one forward and backward at S = 2^20 with q, out, dout and dq above 2^31 elements (every index
// 64-bit), cuDNN against our flash kernels on the same inputs. Minutes of GPU time, ~40 GB.
TEST(AttentionLongContext, CudnnMatchesFlashAtAMillionTokens) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const int64_t B = 1, S = int64_t{1} << 20, Hq = 17, Hkv = 1, D = 128;
  const AttentionShape a{B, S, Hq, Hkv, D, 1.0f / std::sqrt(static_cast<float>(D))};
  const size_t nq = static_cast<size_t>(B * S * Hq * D), nk = static_cast<size_t>(B * S * Hkv * D),
               nl = static_cast<size_t>(B * Hq * S);
  ASSERT_GT(nq, size_t{1} << 31);
  const auto backend = [](const char* attention) {
    BackendOptions o;
    o.type = "cuda";
    o.attention = attention;
    return create_backend(o);
  };
  std::unique_ptr<Backend> cudnn = backend("cudnn"), flash = backend("flash");
  try {
    std::printf("  %s\n", cudnn->ops().attention_implementation(a, AttentionMask{}, DType::BF16).c_str());
  } catch (const Error& e) {
    GTEST_SKIP() << e.what();  // no cuDNN on this machine
  }
  // q k v out dout dq dk dv (bf16) and lse (fp32) on each backend; inputs filled in chunks.
  const size_t sizes[] = {nq * 2, nk * 2, nk * 2, nq * 2, nq * 2, nq * 2, nk * 2, nk * 2, nl * 4};
  std::vector<DeviceBuffer> t[2];
  Backend* be[2] = {cudnn.get(), flash.get()};
  for (int i = 0; i < 2; ++i)
    for (size_t bytes : sizes) t[i].push_back(be[i]->alloc(bytes, "long-context attention tensor"));
  constexpr size_t kChunk = size_t{1} << 26;  // elements per host round trip
  std::vector<uint16_t> host(kChunk);
  for (int input : {0, 1, 2, 4}) {  // q k v dout: uniform in [-1, 1) from a fixed LCG
    uint64_t state = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(input + 1);
    const size_t n = sizes[input] / 2;
    for (size_t at = 0; at < n; at += kChunk) {
      const size_t m = std::min(kChunk, n - at);
      for (size_t j = 0; j < m; ++j) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        host[j] = f32_to_bf16(static_cast<float>(static_cast<int64_t>(state >> 40) - (1 << 23)) / (1 << 23)).bits;
      }
      for (int i = 0; i < 2; ++i) {
        Stream& s = be[i]->stream(StreamKind::Compute);
        be[i]->copy_h2d(static_cast<uint16_t*>(t[i][input].data()) + at, host.data(), m * 2, s);
        be[i]->synchronize(s);
      }
    }
  }
  const DType bf = DType::BF16;
  for (int i = 0; i < 2; ++i) {
    Stream& s = be[i]->stream(StreamKind::Compute);
    std::vector<DeviceBuffer>& x = t[i];
    const AttentionInputs in = a.inputs(bf, x[0].data(), x[1].data(), x[2].data());
    be[i]->ops().attention_forward(s, a, AttentionMask{}, in, a.query_view(x[3].data(), bf), a.lse_view(x[8].data()));
    be[i]->ops().attention_backward(s, a, AttentionMask{}, in, a.query_view(x[3].data(), bf), a.lse_view(x[8].data()),
                                    a.query_view(x[4].data(), bf),
                                    a.grads(bf, x[5].data(), x[6].data(), x[7].data(), nullptr));
    be[i]->synchronize(s);
  }
  // ||cudnn - flash|| / ||flash|| per output, read back in chunks; bf16 outputs of two fp32-accumulating
  // implementations (the op_tolerances.h attention bounds, at a length no CPU reference reaches).
  const struct {
    const char* name;
    int index;
    double bound;
  } outputs[] = {{"out", 3, 1e-2}, {"lse", 8, 1e-5}, {"dq", 5, 3e-2}, {"dk", 6, 3e-2}, {"dv", 7, 3e-2}};
  for (const auto& o : outputs) {
    const bool f32 = o.index == 8;
    const size_t n = sizes[o.index] / (f32 ? 4 : 2), es = f32 ? 4 : 2;
    std::vector<char> a(kChunk * es), b(kChunk * es);
    double diff = 0, ref = 0;
    size_t nonfinite = 0;
    for (size_t at = 0; at < n; at += kChunk) {
      const size_t m = std::min(kChunk, n - at);
      for (int i = 0; i < 2; ++i) {
        Stream& s = be[i]->stream(StreamKind::D2H);
        be[i]->copy_d2h((i == 0 ? a : b).data(), static_cast<const char*>(t[i][o.index].data()) + at * es, m * es, s);
        be[i]->synchronize(s);
      }
      for (size_t j = 0; j < m; ++j) {
        float x, y;
        if (f32) {
          std::memcpy(&x, a.data() + 4 * j, 4), std::memcpy(&y, b.data() + 4 * j, 4);
        } else {
          bf16 hx, hy;
          std::memcpy(&hx.bits, a.data() + 2 * j, 2), std::memcpy(&hy.bits, b.data() + 2 * j, 2);
          x = bf16_to_f32(hx), y = bf16_to_f32(hy);
        }
        if (!std::isfinite(x) || !std::isfinite(y)) ++nonfinite;
        diff += (static_cast<double>(x) - y) * (static_cast<double>(x) - y), ref += static_cast<double>(y) * y;
      }
    }
    const double err = std::sqrt(diff / ref);
    std::printf("  %-4s %zu elements: rel error %.3e (bound %.0e), %zu not finite\n", o.name, n, err, o.bound,
                nonfinite);
    EXPECT_EQ(nonfinite, 0u) << o.name;
    EXPECT_LE(err, o.bound) << o.name << ": ||cudnn - flash|| / ||flash|| at S = 2^20";
  }
}

INSTANTIATE_TEST_SUITE_P(Small, CudaOps, testing::ValuesIn(small_cases()),
                         [](const testing::TestParamInfo<OpCase>& i) { return i.param.name; });
INSTANTIATE_TEST_SUITE_P(Large, CudaOps, testing::ValuesIn(large_cases()),
                         [](const testing::TestParamInfo<OpCase>& i) { return i.param.name; });

// Invalid ids are caught inside the kernel and reported as an so::Error at the next host
// synchronisation, naming the op and the value; the stream stays usable.
struct BadIdCase {
  std::string name;
  std::string op_word;  // what the message must name
  std::function<void(Ops&, Stream&, Backend&, std::vector<DeviceBuffer>&)> enqueue;
};
void PrintTo(const BadIdCase& c, std::ostream* os) { *os << c.name; }

constexpr int32_t kBadId = 12345;  // vocabulary 1000

std::vector<BadIdCase> bad_id_cases() {
  auto upload_ids = [](Backend& be, Stream& s, std::vector<DeviceBuffer>& keep) {
    std::vector<int32_t> ids(300, 7);
    ids[257] = kBadId;
    keep.push_back(be.alloc(ids.size() * 4, "ids"));
    be.copy_h2d(keep.back().data(), ids.data(), ids.size() * 4, s);
    be.synchronize(s);
    return keep.back().as<int32_t>();
  };
  auto zeros = [](Backend& be, Stream& s, std::vector<DeviceBuffer>& keep, size_t bytes) {
    keep.push_back(be.alloc(bytes, "buffer"));
    be.memset_zero(keep.back().data(), bytes, s);
    return keep.back().data();
  };
  return {{"embedding_forward", "embedding",
           [=](Ops& ops, Stream& s, Backend& be, std::vector<DeviceBuffer>& k) {
             const int32_t* ids = upload_ids(be, s, k);
             ops.embedding_forward(s, {.T = 300, .V = 1000, .H = 8, .dtype = DType::F32}, zeros(be, s, k, 300 * 8 * 4),
                                   zeros(be, s, k, 1000 * 8 * 4), ids);
           }},
          {"embedding_backward", "embedding",
           [=](Ops& ops, Stream& s, Backend& be, std::vector<DeviceBuffer>& k) {
             const int32_t* ids = upload_ids(be, s, k);
             ops.embedding_backward(s, {.T = 300, .V = 1000, .H = 8, .dtype = DType::BF16},
                                    zeros(be, s, k, 1000 * 8 * 2), zeros(be, s, k, 300 * 8 * 2), ids, -1);
           }},
          {"cross_entropy", "cross", [=](Ops& ops, Stream& s, Backend& be, std::vector<DeviceBuffer>& k) {
             const int32_t* ids = upload_ids(be, s, k);
             ops.cross_entropy(s, {.rows = 300, .V = 1000, .scale = 1.0f, .z_loss = 0.0f, .dtype = DType::BF16},
                               static_cast<float*>(zeros(be, s, k, 4)), zeros(be, s, k, 300 * 1000 * 2),
                               static_cast<const float*>(zeros(be, s, k, 300 * 1000 * 4)), ids);
           }}};
}

class CudaBadIds : public testing::TestWithParam<BadIdCase> {};

TEST_P(CudaBadIds, ThrowAtSynchronizeNamingOpAndValue) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device (so::cuda::device_count() == 0)";
  auto be = backend_of_type("cuda");
  Stream& s = be->stream(StreamKind::Compute);
  std::vector<DeviceBuffer> keep;
  GetParam().enqueue(be->ops(), s, *be, keep);
  const std::string msg = test::error_message([&] { be->synchronize(s); });
  ASSERT_FALSE(msg.empty()) << "id " << kBadId << " outside [0, 1000) was not reported";
  std::string lower = msg;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char ch) { return std::tolower(ch); });
  EXPECT_NE(lower.find(GetParam().op_word), std::string::npos) << "the error does not name the op: " << msg;
  EXPECT_NE(msg.find(std::to_string(kBadId)), std::string::npos) << "the error does not name the value: " << msg;
  std::printf("  reported: %s\n", msg.c_str());
  EXPECT_EQ(test::error_message([&] { be->synchronize(s); }), "") << "reported twice, or the stream stays broken";
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaBadIds, testing::ValuesIn(bad_id_cases()),
                         [](const testing::TestParamInfo<BadIdCase>& i) { return i.param.name; });

}  // namespace
}  // namespace so
