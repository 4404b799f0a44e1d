// so_bench attention: causal GQA attention forward and backward TFLOP/s through each of the
// backend's implementations (our flash kernels, cuDNN's fused SDPA), unpacked rows and rows packed
// with several documents, one JSON line per row for jobs/local/gpu_measure.py to set beside
// PyTorch's (bench/peers/sdpa_attention.py, the same shapes and FLOP count). The CPU backend runs
// it too (tiny shapes: the measuring script's dry run).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench/attention_timing.h"
#include "bench/bench_commands.h"
#include "bench/device_timing.h"
#include "so/core/error.h"

namespace so::bench {

namespace po = boost::program_options;

namespace {

// Per token, the index within its row of its document's first token (AttentionMask::doc_start).
std::vector<int32_t> packed_doc_starts(const AttentionCase& a) {
  const int64_t len = a.S / a.docs;
  std::vector<int32_t> starts(static_cast<size_t>(a.B * a.S));
  for (int64_t b = 0; b < a.B; ++b)
    for (int64_t i = 0; i < a.S; ++i)
      starts[static_cast<size_t>(b * a.S + i)] = static_cast<int32_t>(std::min(i / len, a.docs - 1) * len);
  return starts;
}

std::vector<std::string> split_names(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace

double attention_forward_flop(const AttentionCase& a) {
  const int64_t len = a.S / a.docs, last = a.S - (a.docs - 1) * len;
  const double pairs = (a.docs - 1) * static_cast<double>(len) * len + static_cast<double>(last) * last;
  return 4.0 * a.B * a.Hq * a.D * pairs / 2;
}

AttentionTiming time_attention(Backend& be, const AttentionCase& a, int warmup, int iters) {
  SO_CHECK(a.docs >= 1 && a.docs <= a.S, "attention: ", a.docs, " documents per row of ", a.S, " tokens");
  Ops& ops = be.ops();
  Stream& s = be.stream(StreamKind::Compute);
  Tensors t(be);
  AttentionMask mask;
  if (a.docs > 1) {  // with the host's counts, as the model gives them (cuDNN's ragged launch is sized by them)
    const std::vector<int32_t> starts = packed_doc_starts(a);
    mask.doc_start = t.ints(starts);
    const AttentionDocuments d = count_attention_documents(starts.data(), a.B, a.S);
    mask.documents = d.documents, mask.longest_document = d.longest;
  }
  const AttentionShape shape{a.B, a.S, a.Hq, a.Hkv, a.D, 1.0f / std::sqrt(static_cast<float>(a.D))};
  AttentionTiming r;
  try {
    r.implementation = ops.attention_implementation(shape, mask, a.dt);
  } catch (const Error& e) {
    r.refused = e.what();
    return r;
  }
  const int64_t nq = a.B * a.S * a.Hq * a.D, nkv = a.B * a.S * a.Hkv * a.D;
  const size_t es = dtype_size(a.dt);
  void *q = t.random(nq, a.dt, 41), *k = t.random(nkv, a.dt, 42), *v = t.random(nkv, a.dt, 43);
  void *out = t.alloc(nq * es), *dout = t.random(nq, a.dt, 44);
  void *dq = t.alloc(nq * es), *dk = t.alloc(nkv * es), *dv = t.alloc(nkv * es);
  void* lse = t.alloc(static_cast<size_t>(a.B * a.Hq * a.S) * 4);
  const AttentionInputs in = shape.inputs(a.dt, q, k, v);
  r.forward_ms = time_ms(be, warmup, iters, [&] {
    ops.attention_forward(s, shape, mask, in, shape.query_view(out, a.dt), shape.lse_view(lse));
  });
  r.backward_ms = time_ms(be, warmup, iters, [&] {
    ops.attention_backward(s, shape, mask, in, shape.query_view(out, a.dt), shape.lse_view(lse),
                           shape.query_view(dout, a.dt), shape.grads(a.dt, dq, dk, dv, nullptr));
  });
  r.forward_flop = attention_forward_flop(a);
  r.memory_peak = be.memory_stats().peak;
  r.tensor_bytes = t.bytes();
  return r;
}

int attention_bench(int argc, char** argv, Communicator&) {
  po::options_description desc("so_bench attention options");
  std::string backend = "cuda", head_dims = "64,128", docs = "1,4", impls = "flash,cudnn", dtype = "bf16", json_path;
  int64_t batch = 4, seq = 4096, hidden = 2048, gqa = 4;
  int warmup = 2, iters = 5;
  desc.add_options()("help,h", "show this help")("backend", po::value<std::string>(&backend)->default_value(backend),
                                                 "cuda, or cpu (tiny shapes: a dry run)")(
      "batch", po::value<int64_t>(&batch)->default_value(batch), "rows (B)")(
      "seq", po::value<int64_t>(&seq)->default_value(seq), "tokens per row (S)")(
      "hidden", po::value<int64_t>(&hidden)->default_value(hidden), "query heads x head dim (Hq = hidden / D)")(
      "gqa", po::value<int64_t>(&gqa)->default_value(gqa), "query heads per key/value head (Hkv = Hq / gqa)")(
      "head-dims", po::value<std::string>(&head_dims)->default_value(head_dims), "head dimensions D")(
      "docs", po::value<std::string>(&docs)->default_value(docs),
      "documents per row (1: unpacked; n: n equal documents, the causal mask within each)")(
      "impls", po::value<std::string>(&impls)->default_value(impls),
      "backend.attention values: flash (our kernels), cudnn (cuDNN's fused SDPA, atomic backward), auto")(
      "dtype", po::value<std::string>(&dtype)->default_value(dtype), "bf16 or fp32")(
      "warmup", po::value<int>(&warmup)->default_value(warmup), "untimed runs first")(
      "iters", po::value<int>(&iters)->default_value(iters), "timed runs (median reported)")(
      "json", po::value<std::string>(&json_path), "also append one JSON object per row to this file");
  po::variables_map vm;
  if (!parse_command_line(desc, argc, argv, vm)) return 0;
  SO_CHECK(backend == "cuda" || backend == "cpu", "--backend is '", backend, "'; choose cuda or cpu");
  SO_CHECK(batch > 0 && seq > 0 && hidden > 0 && gqa > 0 && warmup >= 0 && iters > 0,
           "--batch, --seq, --hidden, --gqa and --iters must be positive, --warmup not negative");
  const DType dt = parse_dtype(dtype, "--dtype");
  const std::vector<int64_t> dims = parse_list(head_dims, "--head-dims"), doc_counts = parse_list(docs, "--docs");
  const std::vector<std::string> impl_names = split_names(impls);
  SO_CHECK(!impl_names.empty(), "--impls is empty");
  for (const std::string& i : impl_names)
    SO_CHECK(i == "flash" || i == "cudnn" || i == "auto", "--impls: '", i, "' must be flash, cudnn or auto");
  for (int64_t D : dims)
    SO_CHECK(hidden % D == 0 && (hidden / D) % gqa == 0, "--hidden ", hidden, " is not a multiple of head dim ", D,
             " x --gqa ", gqa);
  for (int64_t n : doc_counts)
    SO_CHECK(n <= seq, "--docs ", n, " is more documents than the ", seq, " tokens of a row");
  std::ofstream json;
  if (!json_path.empty()) {
    json.open(json_path, std::ios::app);
    SO_CHECK(json.good(), "cannot open '", json_path, "' for appending");
  }
  std::printf(
      "# so_bench attention: causal, %s, median of %d timed runs after %d warm-up; FLOPs: forward "
      "4*B*Hq*D*sum(L^2)/2 over each row's documents, backward 2.5x\n",
      dtype_name(dt), iters, warmup);
  std::printf("# %-6s %-34s %10s %10s %10s %10s  %s\n", "impl", "shape", "fwd ms", "fwd TF/s", "bwd ms", "bwd TF/s",
              "implementation");
  int failed = 0;
  for (int64_t D : dims)
    for (int64_t n : doc_counts)
      for (const std::string& impl : impl_names) {
        const AttentionCase a{batch, seq, hidden / D, hidden / D / gqa, D, n, dt};
        const std::string shape = str_cat("B", a.B, " S", a.S, " Hq", a.Hq, " Hkv", a.Hkv, " D", a.D, " docs", a.docs);
        nlohmann::json row{
            {"bench", "attention"}, {"backend", backend}, {"impl", impl}, {"B", a.B},       {"S", a.S},
            {"Hq", a.Hq},           {"Hkv", a.Hkv},       {"D", a.D},     {"docs", a.docs}, {"dtype", dtype_name(dt)}};
        try {
          BackendOptions o;
          o.type = backend;
          o.attention = impl;
          auto be = create_backend(o);
          const AttentionTiming r = time_attention(*be, a, warmup, iters);
          if (!r.refused.empty()) {  // a result, not a failure: this implementation does not take the shape
            row["not_run"] = r.refused;
            std::printf("  %-6s %-34s not run: %s\n", impl.c_str(), shape.c_str(), r.refused.c_str());
          } else {
            const double fwd = r.forward_flop / (r.forward_ms * 1e-3) / 1e12;
            const double bwd = 2.5 * r.forward_flop / (r.backward_ms * 1e-3) / 1e12;
            row.update({{"implementation", r.implementation},
                        {"fwd_ms", r.forward_ms},
                        {"bwd_ms", r.backward_ms},
                        {"fwd_tflops", fwd},
                        {"bwd_tflops", bwd},
                        {"memory_peak_mib", r.memory_peak >> 20}});
            std::printf("  %-6s %-34s %10.3f %10.1f %10.3f %10.1f  %s\n", impl.c_str(), shape.c_str(), r.forward_ms,
                        fwd, r.backward_ms, bwd, r.implementation.c_str());
          }
        } catch (const Error& e) {
          row["error"] = e.what();
          ++failed;
          std::printf("  %-6s %-34s failed: %s\n", impl.c_str(), shape.c_str(), e.what());
        }
        std::fflush(stdout);
        if (json.is_open()) json << row.dump() << "\n" << std::flush;
      }
  return failed ? 1 : 0;
}

}  // namespace so::bench
