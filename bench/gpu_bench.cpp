// so_bench gpu-peaks and so_bench ops: the GPU's two ceilings measured through the backend (a
// large bf16 GEMM through Ops::gemm on random data, beside the same GEMM on constant data and the
// backend's own start-up measurement; a device-to-device copy, bytes read + written), then every op
// at Llama-1B-like sizes as a fraction of the ceilings measured in the same run, and causal flash
// attention up to one 131072-token sequence with the memory it took (O(S), not O(S^2)).
// Timing: CUDA events around each run (Backend::event_time), warm-up runs first, the median of
// the timed ones; inputs random, never zeros, and larger than the L2 cache unless stated.
// Both refuse to run without a CUDA device; gpu-peaks --backend cpu runs on the CPU backend (the
// measuring script's dry run).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bench/attention_timing.h"
#include "bench/bench_commands.h"
#include "bench/device_timing.h"
#include "so/backend/backend.h"
#include "so/model/rope.h"
#include "so/core/error.h"
#ifdef SO_HAVE_CUDA
#include "src/backend/cuda/cuda_cast.h"
#endif

namespace so::bench {

namespace po = boost::program_options;

namespace {

void require_gpu(const char* subcommand) {
#ifdef SO_HAVE_CUDA
  SO_CHECK(cuda::device_count() > 0, "so_bench ", subcommand,
           ": needs a CUDA device and none is visible (so::cuda::device_count() == 0); run it on a GPU machine");
#else
  SO_FAIL("so_bench ", subcommand, ": this build has no CUDA backend (configure with -DSO_CUDA=ON)");
#endif
}

std::unique_ptr<Backend> make_backend(const std::string& type, const std::string& attention = "auto",
                                      bool deterministic_attention = false) {
  BackendOptions o;
  o.type = type;
  o.attention = attention;
  o.deterministic_attention = deterministic_attention;
  return create_backend(o);
}

// The attention implementations compared: ours, cuDNN with atomics in its backward (as PyTorch's
// SDPA runs it, our default) and cuDNN deterministic (backend.deterministic_attention=true, where
// its workspace fits).
struct AttentionImpl {
  const char* name;
  const char* attention;
  bool deterministic;
};
constexpr AttentionImpl kAttentionImpls[] = {
    {"flash", "flash", true}, {"cudnn", "cudnn", false}, {"cudnn deterministic", "auto", true}};

struct Peaks {
  std::string device;
  double gemm_tflops = 0, nominal_tflops = 0, copy_gbps = 0;
  double gemm_ms = 0, copy_ms = 0;
  // The same GEMM on constant operands (fewer bits toggle: it runs faster than training's data),
  // and the backend's own start-up measurement (Backend::measured_gemm_tflops, MFU's second basis).
  double gemm_constant_tflops = 0, startup_gemm_tflops = 0;
};

Peaks measure_peaks(const std::string& backend, int64_t n, int64_t copy_mib, int warmup, int iters) {
  auto be = make_backend(backend);
  Peaks p;
  p.device = be->name();
  p.nominal_tflops = be->peak_tflops(DType::BF16);
  Ops& ops = be->ops();
  Stream& s = be->stream(StreamKind::Compute);
  const auto gemm_tflops = [&](bool random) {
    Tensors t(*be);
    void* A = random ? t.random(n * n, DType::BF16, 1) : t.constant(n * n, DType::BF16, 0.75f);
    void* B = random ? t.random(n * n, DType::BF16, 2) : t.constant(n * n, DType::BF16, 0.75f);
    void* C = t.alloc(n * n * 2);
    const double ms = time_ms(*be, warmup, iters, [&] { ops.gemm(s, Gemm::nt(n, n, n, A, B, C, DType::BF16)); });
    return std::make_pair(ms, 2.0 * n * n * n / (ms * 1e-3) / 1e12);
  };
  std::tie(p.gemm_ms, p.gemm_tflops) = gemm_tflops(true);
  p.gemm_constant_tflops = gemm_tflops(false).second;
  p.startup_gemm_tflops = be->measured_gemm_tflops(DType::BF16);
  const size_t bytes = static_cast<size_t>(copy_mib) << 20;
  Tensors t(*be);
  void *src = t.random(static_cast<int64_t>(bytes / 2), DType::BF16, 3), *dst = t.alloc(bytes);
  p.copy_ms = time_ms(*be, warmup, iters, [&] { be->copy_d2d(dst, src, bytes, s); });
  p.copy_gbps = 2.0 * bytes / (p.copy_ms * 1e-3) / 1e9;
  return p;
}

void print_peaks(const Peaks& p, int64_t n, int64_t copy_mib) {
  std::printf("# device: %s\n", p.device.c_str());
  std::printf("%-44s %9.3f ms %9.1f TFLOP/s  %.3f of nominal %.1f TFLOP/s\n",
              str_cat("gemm bf16 ", n, "x", n, "x", n, " (nt, C bf16)").c_str(), p.gemm_ms, p.gemm_tflops,
              p.gemm_tflops / p.nominal_tflops, p.nominal_tflops);
  std::printf("%-44s %12s %9.1f TFLOP/s  (the same GEMM, constant operands)\n",
              str_cat("gemm bf16 ", n, "^3 on constant data").c_str(), "", p.gemm_constant_tflops);
  std::printf("%-44s %12s %9.1f TFLOP/s  (Backend::measured_gemm_tflops, MFU's measured basis)\n",
              "gemm bf16 at the backend's start-up", "", p.startup_gemm_tflops);
  std::printf("%-44s %9.3f ms %9.1f GB/s (read + write)\n", str_cat("copy d2d ", copy_mib, " MiB").c_str(), p.copy_ms,
              p.copy_gbps);
}

nlohmann::json peaks_json(const Peaks& p) {
  return {{"bench", "gpu-peaks"},
          {"device", p.device},
          {"gemm_tflops", p.gemm_tflops},
          {"gemm_constant_tflops", p.gemm_constant_tflops},
          {"startup_gemm_tflops", p.startup_gemm_tflops},
          {"nominal_tflops", p.nominal_tflops},
          {"gemm_of_nominal", p.gemm_tflops / p.nominal_tflops},
          {"copy_gbps", p.copy_gbps}};
}

struct PeakOptions {
  int64_t gemm_n = 8192, copy_mib = 1024;
  int warmup = 5, iters = 20;
};

void add_peak_options(po::options_description& desc, PeakOptions& o) {
  desc.add_options()("gemm-size", po::value<int64_t>(&o.gemm_n)->default_value(o.gemm_n), "M = N = K of the bf16 GEMM")(
      "copy-mib", po::value<int64_t>(&o.copy_mib)->default_value(o.copy_mib), "bytes copied device to device")(
      "warmup", po::value<int>(&o.warmup)->default_value(o.warmup), "untimed runs first")(
      "iters", po::value<int>(&o.iters)->default_value(o.iters), "timed runs (median reported)");
}

// One row of `so_bench ops`: an achieved rate and its fraction of the matching measured ceiling.
struct Row {
  std::string op, shape;
  double ms = 0, rate = 0, fraction = 0;
  std::string unit;  // TFLOP/s or GB/s
  std::string note;
};

class OpsTable {
 public:
  OpsTable(const Peaks& peaks, std::ofstream* json) : peaks_(peaks), json_(json) {
    std::printf("\n# %-26s %-40s %9s %12s %-8s %8s  %s\n", "op", "shape", "ms", "achieved", "unit", "of peak", "note");
  }
  void flops(const std::string& op, const std::string& shape, double ms, double flop, const std::string& note = "") {
    add({op, shape, ms, flop / (ms * 1e-3) / 1e12, 0, "TFLOP/s", note}, peaks_.gemm_tflops);
  }
  void bytes(const std::string& op, const std::string& shape, double ms, double bytes, const std::string& note = "") {
    add({op, shape, ms, bytes / (ms * 1e-3) / 1e9, 0, "GB/s", note}, peaks_.copy_gbps);
  }

 private:
  void add(Row r, double peak) {
    r.fraction = r.rate / peak;
    std::printf("  %-26s %-40s %9.3f %12.1f %-8s %8.3f  %s\n", r.op.c_str(), r.shape.c_str(), r.ms, r.rate,
                r.unit.c_str(), r.fraction, r.note.c_str());
    std::fflush(stdout);
    if (json_)
      *json_ << nlohmann::json{{"bench", "ops"}, {"op", r.op},     {"shape", r.shape},      {"ms", r.ms},
                               {"rate", r.rate}, {"unit", r.unit}, {"of_peak", r.fraction}, {"note", r.note}}
                    .dump()
             << "\n";
  }
  const Peaks& peaks_;
  std::ofstream* json_;
};

struct OpsShape {
  int64_t tokens = 16384, hidden = 2048, heads = 32, kv_heads = 8, head_dim = 64, intermediate = 5632, vocab = 32000,
          loss_rows = 1024;
};

std::string dims(std::initializer_list<int64_t> d) {
  std::string s;
  for (int64_t x : d) {
    if (!s.empty()) s += 'x';
    s += std::to_string(x);
  }
  return s;
}

void gemm_rows(Backend& be, OpsTable& tab, const OpsShape& m, int warmup, int iters) {
  Ops& ops = be.ops();
  Stream& s = be.stream(StreamKind::Compute);
  const int64_t T = m.tokens, H = m.hidden, I = m.intermediate, qkv = (m.heads + 2 * m.kv_heads) * m.head_dim;
  struct G {
    const char* name;
    bool ta, tb;
    int64_t M, N, K;
    float beta;
    DType c;
  };
  const G gemms[] = {{"gemm qkv proj (nt)", false, true, T, qkv, H, 0.0f, DType::BF16},
                     {"gemm o proj (nt)", false, true, T, H, m.heads * m.head_dim, 0.0f, DType::BF16},
                     {"gemm gate|up proj (nt)", false, true, T, I, H, 0.0f, DType::BF16},
                     {"gemm down proj (nt)", false, true, T, H, I, 0.0f, DType::BF16},
                     {"gemm down dX (nn)", false, false, T, I, H, 0.0f, DType::BF16},
                     {"gemm down dW += (tn)", true, false, H, I, T, 1.0f, DType::BF16},
                     {"gemm lm_head chunk (nt)", false, true, m.loss_rows, m.vocab, H, 0.0f, DType::F32}};
  for (const G& g : gemms) {
    Tensors t(be);
    void* A = t.random(g.M * g.K, DType::BF16, 11);
    void* B = t.random(g.K * g.N, DType::BF16, 12);
    void* C = t.random(g.M * g.N, g.c, 13);
    const double ms = time_ms(be, warmup, iters, [&] {
      ops.gemm(s, Gemm::nn(g.M, g.N, g.K, A, B, C, DType::BF16, g.beta).transposed(g.ta, g.tb).out_as(g.c));
    });
    tab.flops(g.name, dims({g.M, g.N, g.K}) + " bf16, C " + dtype_name(g.c), ms, 2.0 * g.M * g.N * g.K);
  }
}

// The memory-bound ops; bytes = each input read once + each output written once.
void memory_rows(Backend& be, OpsTable& tab, const OpsShape& m, int warmup, int iters) {
  Ops& ops = be.ops();
  Stream& s = be.stream(StreamKind::Compute);
  const DType bf = DType::BF16;
  const int64_t T = m.tokens, H = m.hidden, I = m.intermediate, V = m.vocab, D = m.head_dim;
  const std::string th = dims({T, H}) + " bf16";
  auto timed = [&](auto&& fn) { return time_ms(be, warmup, iters, fn); };
  std::mt19937 rng(7);
  std::vector<int32_t> tokens(static_cast<size_t>(T)), positions(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i)
    tokens[i] = static_cast<int32_t>(rng() % V), positions[i] = static_cast<int32_t>(i % 4096);
  const double distinct = static_cast<double>(std::set<int32_t>(tokens.begin(), tokens.end()).size());
  {
    Tensors t(be);
    void *table = t.random(V * H, bf, 21), *out = t.alloc(T * H * 2);
    const int32_t* tok = t.ints(tokens);
    tab.bytes("embedding_forward", th + ", V " + std::to_string(V),
              timed([&] { ops.embedding_forward(s, {.T = T, .V = V, .H = H, .dtype = bf}, out, table, tok); }),
              2.0 * T * H * 2 + T * 4);
    void* dout = t.random(T * H, bf, 22);
    tab.bytes("embedding_backward", th + ", V " + std::to_string(V),
              timed([&] { ops.embedding_backward(s, {.T = T, .V = V, .H = H, .dtype = bf}, table, dout, tok, -1); }),
              T * H * 2 + 2 * distinct * H * 2 + T * 4, "table rows touched: read + write");
  }
  {
    Tensors t(be);
    void *x = t.random(T * H, bf, 23), *w = t.random(H, bf, 24), *out = t.alloc(T * H * 2);
    auto* rstd = static_cast<float*>(t.alloc(T * 4));
    const RmsNormShape norm{.rows = T, .dim = H, .eps = 1e-5f, .dtype = bf};
    tab.bytes("rmsnorm_forward", th, timed([&] { ops.rmsnorm_forward(s, norm, out, rstd, x, w); }),
              2.0 * T * H * 2 + H * 2 + T * 4);
    void *dout = t.random(T * H, bf, 25), *dx = t.alloc(T * H * 2), *dw = t.random(H, bf, 26);
    tab.bytes("rmsnorm_backward", th, timed([&] {
                ops.rmsnorm_backward(s, norm, {.dx = dx, .dw_acc = dw, .accumulate = false}, dout, x, w, rstd);
              }),
              3.0 * T * H * 2 + 3 * H * 2 + T * 4);
  }
  {
    Tensors t(be);
    const int64_t n = T * m.heads * D;
    void* q = t.random(n, bf, 27);
    const int32_t* pos = t.ints(positions);
    const double* freq = t.doubles(rope_default_inv_freq(500000.0, D));
    tab.bytes("rope (q, in place)", dims({T, m.heads, D}) + " bf16", timed([&] {
                ops.rope(s, {.T = T, .heads = m.heads, .head_dim = D, .positions = pos, .inv_freq = freq, .dtype = bf},
                         q, false);
              }),
              2.0 * n * 2 + T * 4);
  }
  {
    Tensors t(be);
    const int64_t n = T * I;
    void *g = t.random(n, bf, 28, 3.0f), *u = t.random(n, bf, 29), *out = t.alloc(n * 2);
    tab.bytes("swiglu_forward", dims({T, I}) + " bf16", timed([&] { ops.swiglu_forward(s, out, g, u, n, bf); }),
              3.0 * n * 2);
    void *dg = t.alloc(n * 2), *du = t.alloc(n * 2);
    tab.bytes("swiglu_backward", dims({T, I}) + " bf16",
              timed([&] { ops.swiglu_backward(s, dg, du, out, g, u, n, bf); }), 5.0 * n * 2);
  }
  {
    Tensors t(be);
    const int64_t R = m.loss_rows;
    const auto* logits = static_cast<const float*>(t.random(R * V, DType::F32, 30, 4.0f));
    auto* loss = static_cast<float*>(t.random(1, DType::F32, 31));
    void* dlogits = t.alloc(R * V * 2);
    const int32_t* tg = t.ints(std::vector<int32_t>(tokens.begin(), tokens.begin() + R));
    tab.bytes("cross_entropy (+dlogits)", dims({R, V}) + " fp32 -> bf16", timed([&] {
                ops.cross_entropy(s, {.rows = R, .V = V, .scale = 1.0f / R, .z_loss = 0.0f, .dtype = bf}, loss, dlogits,
                                  logits, tg);
              }),
              R * V * 4.0 + R * V * 2.0);
  }
  {
    Tensors t(be);
    const int64_t n = int64_t{1} << 28;
    auto* acc = static_cast<float*>(t.random(1, DType::F32, 32));
    void* x = t.random(n, bf, 33);
    tab.bytes("sum_squares", std::to_string(n) + " bf16", timed([&] { ops.sum_squares(s, acc, x, n, bf); }), n * 2.0);
    void* wide = t.alloc(n * 4);
    tab.bytes("cast bf16 -> fp32", std::to_string(n), timed([&] { ops.cast(s, wide, DType::F32, x, bf, n); }), n * 6.0);
  }
  {
    Tensors t(be);
    const int64_t n = int64_t{1} << 27;
    auto* p = static_cast<float*>(t.random(n, DType::F32, 34));
    auto* mm = static_cast<float*>(t.random(n, DType::F32, 35, 0.01f));
    auto* vv = static_cast<float*>(t.random(n, DType::F32, 36, 0.01f));
    void *g = t.random(n, bf, 37, 0.01f), *out = t.alloc(n * 2);
    AdamWParams hp;
    hp.weight_decay = 0.1;
    hp.step = 10;
    const AdamArrays a{p, mm, vv, g, bf, out, bf};
    tab.bytes("adamw (grad, out bf16)", std::to_string(n) + " params",
              timed([&] { ops.adam(s, AdamCall::Step, a, n, hp); }), n * 28.0,
              "p, m, v read + write; grad read; out write");
    tab.bytes("adamw redo (grad, out bf16)", std::to_string(n) + " params",
              timed([&] { ops.adam(s, AdamCall::Redo, a, n, hp, 0.5f); }), n * 28.0,
              "one pass: the speculative step undone and redone with the clip coefficient");
  }
  {
    Tensors t(be);
    const int64_t P = 8, n = T * H;
    void *src = t.random(n, bf, 38), *dst = t.alloc(n * 2);
    tab.bytes("transpose_blocks", dims({P, T / P, H}) + " bf16",
              timed([&] { ops.transpose_blocks(s, dst, src, P, T / P, H, bf); }), 2.0 * n * 2);
    const int64_t narrow = T * m.kv_heads * D;
    void *kv = t.random(narrow, bf, 39), *wide = t.alloc(narrow * 2 * 2);
    const HeadReplication rep{.rows = T, .heads = m.kv_heads, .copies = 2, .head_dim = D, .dtype = bf};
    tab.bytes("replicate_heads x2", dims({T, m.kv_heads, D}) + " bf16",
              timed([&] { ops.replicate_heads(s, rep, wide, kv, false); }), 3.0 * narrow * 2);
    tab.bytes("replicate_heads x2 reverse", dims({T, m.kv_heads, D}) + " bf16",
              timed([&] { ops.replicate_heads(s, rep, kv, wide, true); }), 3.0 * narrow * 2);
  }
}

// Causal attention forward and backward at sequence length S with B = max(1, tokens / S), each
// on a fresh backend so its peak memory is this size's alone, through one implementation.
void attention_rows(OpsTable& tab, const OpsShape& m, int64_t S, int warmup, int iters, const AttentionImpl& impl) {
  auto be = make_backend("cuda", impl.attention, impl.deterministic);
  const AttentionCase a{std::max<int64_t>(1, m.tokens / S), S, m.heads, m.kv_heads, m.head_dim, 1, DType::BF16};
  const std::string shape = str_cat("B", a.B, " S", S, " Hq", a.Hq, " Hkv", a.Hkv, " D", a.D, " bf16");
  // "auto" that falls back is not cuDNN deterministic: its rows would repeat the flash ones.
  if (std::string(impl.attention) == "auto") {
    const std::string runs = be->ops().attention_implementation(
        AttentionShape{a.B, S, a.Hq, a.Hkv, a.D, 1.0f / std::sqrt(static_cast<float>(a.D))}, AttentionMask{}, a.dt);
    if (runs.rfind("cuDNN", 0) != 0) {
      std::printf("# attention [%s] %s: not run: %s\n", impl.name, shape.c_str(), runs.c_str());
      return;
    }
  }
  const AttentionTiming r = time_attention(*be, a, warmup, iters);
  if (!r.refused.empty()) {
    std::printf("# attention [%s] %s: not run: %s\n", impl.name, shape.c_str(), r.refused.c_str());
    return;
  }
  tab.flops(str_cat("attention_forward causal [", impl.name, "]"), shape, r.forward_ms, r.forward_flop);
  const double mib = 1.0 / (1 << 20);
  const double peak = static_cast<double>(r.memory_peak), tensors = static_cast<double>(r.tensor_bytes);
  const double scores = 4.0 * a.B * a.Hq * static_cast<double>(S) * S;  // what an fp32 S x S score matrix would take
  tab.flops(str_cat("attention_backward causal [", impl.name, "]"), shape, r.backward_ms, 2.5 * r.forward_flop,
            str_cat("memory peak ", static_cast<int64_t>(peak * mib), " MiB = tensors ",
                    static_cast<int64_t>(tensors * mib), " + workspace ", static_cast<int64_t>((peak - tensors) * mib),
                    " MiB (S x S fp32 scores would be ", static_cast<int64_t>(scores * mib), " MiB)"));
}

}  // namespace

int gpu_peaks_bench(int argc, char** argv, Communicator&) {
  po::options_description desc("so_bench gpu-peaks options");
  PeakOptions o;
  std::string backend = "cuda";
  desc.add_options()("help,h", "show this help")("backend", po::value<std::string>(&backend)->default_value(backend),
                                                 "cuda, or cpu (small sizes: the measuring script's dry run)");
  add_peak_options(desc, o);
  po::variables_map vm;
  if (!parse_command_line(desc, argc, argv, vm)) return 0;
  SO_CHECK(backend == "cuda" || backend == "cpu", "--backend is '", backend, "'; choose cuda or cpu");
  SO_CHECK(o.gemm_n > 0 && o.copy_mib > 0 && o.warmup >= 0 && o.iters > 0,
           "--gemm-size, --copy-mib and --iters must be positive, --warmup not negative");
  if (backend == "cuda") require_gpu("gpu-peaks");
  std::printf("# so_bench gpu-peaks: median of %d timed runs after %d warm-up, %s\n", o.iters, o.warmup,
              backend == "cuda" ? "CUDA events" : "the CPU backend's stream clock");
  const Peaks p = measure_peaks(backend, o.gemm_n, o.copy_mib, o.warmup, o.iters);
  print_peaks(p, o.gemm_n, o.copy_mib);
  std::printf("%s\n", peaks_json(p).dump().c_str());
  return 0;
}

int ops_bench(int argc, char** argv, Communicator&) {
  po::options_description desc("so_bench ops options");
  PeakOptions o;
  OpsShape m;
  std::string attn_seqs = "4096,16384,131072", json_path;
  int attn_iters = 3;
  desc.add_options()("help,h", "show this help")("tokens", po::value<int64_t>(&m.tokens)->default_value(m.tokens),
                                                 "tokens per step (B*S)")(
      "hidden", po::value<int64_t>(&m.hidden)->default_value(m.hidden), "hidden size")(
      "heads", po::value<int64_t>(&m.heads)->default_value(m.heads), "query heads")(
      "kv-heads", po::value<int64_t>(&m.kv_heads)->default_value(m.kv_heads), "key/value heads")(
      "head-dim", po::value<int64_t>(&m.head_dim)->default_value(m.head_dim), "head dimension")(
      "intermediate", po::value<int64_t>(&m.intermediate)->default_value(m.intermediate), "MLP intermediate size")(
      "vocab", po::value<int64_t>(&m.vocab)->default_value(m.vocab), "vocabulary")(
      "loss-rows", po::value<int64_t>(&m.loss_rows)->default_value(m.loss_rows), "rows per output-projection chunk")(
      "attn-seqs", po::value<std::string>(&attn_seqs)->default_value(attn_seqs),
      "attention sequence lengths (B = max(1, tokens / S)); empty: none")(
      "attn-iters", po::value<int>(&attn_iters)->default_value(attn_iters), "timed attention runs (after 1 warm-up)")(
      "json", po::value<std::string>(&json_path), "also append one JSON object per row to this file");
  add_peak_options(desc, o);
  po::variables_map vm;
  if (!parse_command_line(desc, argc, argv, vm)) return 0;
  require_gpu("ops");
  const std::vector<int64_t> seqs = attn_seqs.empty() ? std::vector<int64_t>{} : parse_list(attn_seqs, "--attn-seqs");
  std::ofstream json;
  if (!json_path.empty()) {
    json.open(json_path, std::ios::app);
    SO_CHECK(json.good(), "cannot open '", json_path, "' for appending");
  }
  std::printf("# so_bench ops: median of %d timed runs after %d warm-up (attention: %d after 1), CUDA events\n",
              o.iters, o.warmup, attn_iters);
  std::printf("# ceilings measured now (\"of peak\" below: TFLOP/s over the GEMM's, GB/s over the copy's)\n");
  const Peaks peaks = measure_peaks("cuda", o.gemm_n, o.copy_mib, o.warmup, o.iters);
  print_peaks(peaks, o.gemm_n, o.copy_mib);
  if (json.is_open()) json << peaks_json(peaks).dump() << "\n";
  OpsTable tab(peaks, json.is_open() ? &json : nullptr);
  {
    auto be = make_backend("cuda");
    gemm_rows(*be, tab, m, o.warmup, o.iters);
    memory_rows(*be, tab, m, o.warmup, o.iters);
  }
  for (int64_t S : seqs)
    for (const AttentionImpl& impl : kAttentionImpls) attention_rows(tab, m, S, 1, attn_iters, impl);
  std::printf("# attention FLOPs: forward 4*B*Hq*S*S*D/2 (causal), backward 2.5x forward\n");
  return 0;
}

}  // namespace so::bench
