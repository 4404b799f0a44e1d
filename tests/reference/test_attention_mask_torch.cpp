// The attention op's masks against transformers (fixtures/attention_mask_torch.h5, made by
// make_attention_mask_fixture.py in float64 with masking_utils' mask functions and the eager
// attention of Llama / GPT-OSS): packed documents, a sliding window, sinks, right padding (rows
// that see no key included, where GPT-OSS's sink takes all the mass) and all together.
// Output, lse and every gradient (q, k, v, sinks) within 1e-5 relative (fp32). The CUDA kernels
// are held to this op by test_cuda_ops (the *_docs_*, *_window_*, *_sinks cases).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "so/backend/backend.h"
#include "so/io/hdf5_file.h"
#include "tests/test_util.h"

namespace so {
namespace {

const std::string kFixture = std::string(SO_FIXTURE_DIR) + "/attention_mask_torch.h5";

TEST(AttentionMaskVsTorch, OutputAndGradientsOfEveryCase) {
  const H5File f = H5File::open_read(kFixture);
  auto be = create_backend(test::cpu_backend_options());
  Stream& s = be->stream(StreamKind::Compute);
  const std::vector<std::string> cases = f.members("/");
  ASSERT_EQ(cases.size(), 7u);
  for (const std::string& name : cases) {
    const std::string g = "/" + name;
    const std::vector<int64_t> ds = f.shape(g + "/doc_start");
    const int64_t B = ds.at(0), S = ds.at(1);
    const int64_t Hq = f.shape(g + "/lse").at(1);
    const int64_t D = f.shape(g + "/q").at(1) / Hq, Hkv = f.shape(g + "/k").at(1) / D;
    const auto scale = static_cast<float>(f.read_double_attr(g, "scale"));
    const bool sinks = f.exists(g + "/sinks");
    const auto read = [&](const std::string& n) { return f.read_f32(g + "/" + n, f.shape(g + "/" + n)); };
    auto q = test::upload(*be, read("q"), DType::F32), k = test::upload(*be, read("k"), DType::F32),
         v = test::upload(*be, read("v"), DType::F32), dout = test::upload(*be, read("dout"), DType::F32);
    auto sk = test::upload(*be, sinks ? read("sinks") : std::vector<float>(Hq, 0.0f), DType::F32);
    auto dsk = test::upload(*be, std::vector<float>(Hq, 0.0f), DType::F32);
    const std::vector<int32_t> doc_start = f.read_i32(g + "/doc_start", ds);
    auto docs = be->alloc(doc_start.size() * 4, "doc_start");
    be->copy_h2d(docs.data(), doc_start.data(), doc_start.size() * 4, s);
    AttentionMask mask;
    mask.doc_start = docs.as<int32_t>();
    mask.window = f.read_int_attr(g, "window");
    if (sinks) mask.sinks = sk.data();
    std::vector<int32_t> key_end;
    DeviceBuffer key_end_buf;
    if (f.exists(g + "/key_end")) {
      key_end = f.read_i32(g + "/key_end", {B});
      key_end_buf = be->alloc(B * 4, "key_end");
      be->copy_h2d(key_end_buf.data(), key_end.data(), B * 4, s);
      mask.key_end = key_end_buf.as<int32_t>();
    }
    const int64_t nq = B * S * Hq * D, nkv = B * S * Hkv * D;
    auto out = be->alloc(nq * 4, "out"), lse = be->alloc(B * Hq * S * 4, "lse");
    auto dq = be->alloc(nq * 4, "dq"), dk = be->alloc(nkv * 4, "dk"), dv = be->alloc(nkv * 4, "dv");
    const AttentionShape a{B, S, Hq, Hkv, D, scale};
    const AttentionInputs in = a.inputs(DType::F32, q.data(), k.data(), v.data());
    be->ops().attention_forward(s, a, mask, in, a.query_view(out.data(), DType::F32), a.lse_view(lse.data()));
    be->ops().attention_backward(s, a, mask, in, a.query_view(out.data(), DType::F32), a.lse_view(lse.data()),
                                 a.query_view(dout.data(), DType::F32),
                                 a.grads(DType::F32, dq.data(), dk.data(), dv.data(), dsk.data()));
    std::vector<std::pair<std::string, double>> errors = {
        {"out", test::rel_error(test::download(*be, out.data(), nq, DType::F32), read("out"))},
        {"lse", test::rel_error(test::download(*be, lse.data(), B * Hq * S, DType::F32), read("lse"))},
        {"dq", test::rel_error(test::download(*be, dq.data(), nq, DType::F32), read("dq"))},
        {"dk", test::rel_error(test::download(*be, dk.data(), nkv, DType::F32), read("dk"))},
        {"dv", test::rel_error(test::download(*be, dv.data(), nkv, DType::F32), read("dv"))}};
    if (sinks)
      errors.push_back({"dsinks", test::rel_error(test::download(*be, dsk.data(), Hq, DType::F32), read("dsinks"))});
    std::string line;
    for (const auto& [what, err] : errors) {
      EXPECT_LE(err, 1e-5) << name << ": " << what;
      line += str_cat(" ", what, " ", err);
    }
    std::printf("[ %s ] window %lld, sinks %d; relative errors:%s\n", name.c_str(), static_cast<long long>(mask.window),
                sinks ? 1 : 0, line.c_str());
  }
}

// Broken document boundaries are refused by name (row and token) before any kernel runs.
TEST(AttentionMask, DocStartThatIsNotContiguousDocumentsIsRefused) {
  const std::vector<int32_t> ok = {0, 0, 2, 2, 2, 5};
  EXPECT_NO_THROW(check_attention_doc_start(ok.data(), 1, 6));
  const std::vector<int32_t> starts_late = {1, 1, 2, 2};
  const std::vector<int32_t> jumps_back = {0, 0, 2, 2, 0, 0};
  const std::vector<int32_t> points_ahead = {0, 0, 3, 3};
  for (const auto& [v, want] :
       {std::pair{starts_late, "row 0 at token 0 is 1; a row starts a document at 0"},
        std::pair{jumps_back, "row 0 at token 4 is 0; documents are contiguous, so it must be 2"},
        std::pair{points_ahead, "row 0 at token 2 is 3; documents are contiguous"}}) {
    try {
      check_attention_doc_start(v.data(), 1, static_cast<int64_t>(v.size()));
      ADD_FAILURE() << "accepted: " << want;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

// A padding start outside [1, S] is refused naming the row.
TEST(AttentionMask, KeyEndOutsideTheRowIsRefused) {
  const std::vector<int32_t> ok = {1, 6};
  EXPECT_NO_THROW(check_attention_key_end(ok.data(), 2, 6));
  for (const auto& [v, want] : {std::pair{std::vector<int32_t>{6, 0}, "key_end of row 1 is 0"},
                                std::pair{std::vector<int32_t>{7, 6}, "key_end of row 0 is 7"}}) {
    try {
      check_attention_key_end(v.data(), 2, 6);
      ADD_FAILURE() << "accepted: " << want;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

// The host-side counts cuDNN's ragged layout is sized by: documents across rows (a row's padding
// tail belongs to its last), the longest in tokens, one-token documents included.
TEST(AttentionMask, DocumentsAreCountedAcrossRows) {
  const std::vector<int32_t> doc_start = {0, 1, 2, 2, 2, 5,   // row 0: [0,1) [1,2) [2,5) [5,6)
                                          0, 0, 0, 0, 0, 0};  // row 1: one document of 6
  const AttentionDocuments d = count_attention_documents(doc_start.data(), 2, 6);
  EXPECT_EQ(d.documents, 5);
  EXPECT_EQ(d.longest, 6);
  const AttentionDocuments one = count_attention_documents(doc_start.data(), 1, 6);
  EXPECT_EQ(one.documents, 4);
  EXPECT_EQ(one.longest, 3);
}

// The attention ops' typed arguments: a tensor whose dtype or shape disagrees with the
// AttentionShape is refused naming it, on every backend, before any kernel runs.
TEST(AttentionTensors, WrongShapeOrDtypeIsRefusedByName) {
  std::unique_ptr<Backend> be = create_backend(test::cpu_backend_options());
  Stream& s = be->stream(StreamKind::Compute);
  const AttentionShape a{1, 8, 4, 2, 8, 0.35f};
  auto q = be->alloc(8 * 4 * 8 * 4, "q"), kv = be->alloc(8 * 2 * 8 * 4, "kv"), out = be->alloc(8 * 4 * 8 * 4, "out"),
       lse = be->alloc(4 * 8 * 4, "lse");
  const AttentionInputs good = a.inputs(DType::F32, q.data(), kv.data(), kv.data());
  EXPECT_NO_THROW(be->ops().attention_forward(s, a, AttentionMask{}, good, a.query_view(out.data(), DType::F32),
                                              a.lse_view(lse.data())));
  be->synchronize(s);
  AttentionInputs swapped = good;
  swapped.k = ConstTensorView{q.data(), DType::F32, a.queries()};  // q passed as k
  AttentionInputs wrong_dtype = good;
  wrong_dtype.v.dtype = DType::BF16;
  for (const auto& [in, want] : {std::pair{swapped, "k has shape [8, 32]; B=1 S=8 Hq=4 Hkv=2 D=8 needs [8, 16]"},
                                 std::pair{wrong_dtype, "v is bf16, q is fp32"}}) {
    try {
      be->ops().attention_forward(s, a, AttentionMask{}, in, a.query_view(out.data(), DType::F32),
                                  a.lse_view(lse.data()));
      ADD_FAILURE() << "accepted: " << want;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace so
