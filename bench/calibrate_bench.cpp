// so_bench calibrate: the throughputs the performance model (jobs/sweeps/perf_model.py) divides
// work by, measured on the machine at hand through the backend, written as a machine profile
// (configs/machines/*.json, docs/perf-model.md):
//   gemm        TFLOP/s by size (square-ish GEMMs from 2^20 to ~2^36 FLOP), per compute thread count
//   attention   causal forward and backward TFLOP/s by sequence length and head dim
//   memory      GB/s of the memory-bound ops (bytes each reads + writes): RMSNorm, SwiGLU, RoPE,
//               cross-entropy, embedding, casts, the device AdamW
//   link        host <-> device GB/s per direction (pinned host memory)
//   cpu_adam    GraceAdam parameters/s per thread count (fp32 gradients, no device copy)
//   collectives with --collectives under mpirun: bus bandwidth and latency of all-gather,
//               reduce-scatter, all-reduce and all-to-all (nccl-tests' busbw convention), added to
//               an existing profile under the rank count ("collectives": {"2": {...}, "4": {...}}) —
//               measured apart, since ranks sharing the machine would skew the compute tables

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_commands.h"
#include "bench/device_timing.h"
#include "so/backend/backend.h"
#include "so/backend/host_buffer.h"
#include "so/core/clock.h"
#include "so/core/cpu_affinity.h"
#include "so/core/error.h"
#include "so/core/json_reader.h"
#include "so/model/rope.h"
#include "so/optim/grace_adam.h"

namespace so::bench {

namespace po = boost::program_options;

namespace {

struct CalibrateOptions {
  std::string backend = "cpu", out, name;
  DType dtype = DType::F32;
  int iters = 3;
  double max_gemm_flops = 0;  // 0: 2^34 on the CPU backend, 2^38 on a GPU
  std::vector<int> threads;   // CPU backend compute threads to calibrate; empty = 1 and all cores
};

std::unique_ptr<Backend> make_backend(const CalibrateOptions& o, int threads) {
  BackendOptions bo;
  bo.type = o.backend;
  bo.compute_threads = threads;
  return create_backend(bo);
}

nlohmann::json gemm_table(Backend& be, const CalibrateOptions& o) {
  nlohmann::json rows = nlohmann::json::array();
  Ops& ops = be.ops();
  Stream& s = be.stream(StreamKind::Compute);
  const double top = o.max_gemm_flops > 0 ? o.max_gemm_flops : be.device_is_host() ? 0x1p34 : 0x1p38;
  // m x n x k with m = 4 n = 4 k (tokens x out x in, the model's shape class), doubling.
  for (int64_t k = 32;; k *= 2) {
    const int64_t n = k, m = 4 * k;
    const double flops = 2.0 * m * n * k;
    if (flops > top) break;
    Tensors t(be);
    void *A = t.random(m * k, o.dtype, 1), *B = t.random(n * k, o.dtype, 2), *C = t.alloc(m * n * dtype_size(o.dtype));
    const Gemm g = Gemm::nt(m, n, k, A, B, C, o.dtype);
    const double ms = time_ms(be, 1, o.iters, [&] { ops.gemm(s, g); });
    rows.push_back({{"m", m}, {"n", n}, {"k", k}, {"flops", flops}, {"tflops", flops / (ms * 1e-3) / 1e12}});
    std::printf("  gemm %6lld x %6lld x %6lld  %10.3f ms  %8.3f TFLOP/s\n", static_cast<long long>(m),
                static_cast<long long>(n), static_cast<long long>(k), ms, flops / (ms * 1e-3) / 1e12);
  }
  return rows;
}

nlohmann::json attention_table(Backend& be, const CalibrateOptions& o) {
  nlohmann::json rows = nlohmann::json::array();
  Ops& ops = be.ops();
  Stream& s = be.stream(StreamKind::Compute);
  const std::vector<int64_t> seqs =
      be.device_is_host() ? std::vector<int64_t>{128, 512, 2048} : std::vector<int64_t>{1024, 4096, 16384, 65536};
  for (int64_t D : {32, 64, 128})
    for (int64_t S : seqs) {
      const int64_t Hq = 4, Hkv = 2, B = 1, nq = B * S * Hq * D, nkv = B * S * Hkv * D;
      const DType dt = o.dtype;
      const AttentionShape a{B, S, Hq, Hkv, D, 1.0f / std::sqrt(static_cast<float>(D))};
      Tensors t(be);
      void *q = t.random(nq, dt, 41), *k = t.random(nkv, dt, 42), *v = t.random(nkv, dt, 43);
      void* out = t.alloc(nq * dtype_size(dt));
      void* lse = t.alloc(B * Hq * S * 4);
      const AttentionInputs in = a.inputs(dt, q, k, v);
      const double fwd = time_ms(be, 1, o.iters, [&] {
        ops.attention_forward(s, a, AttentionMask{}, in, a.query_view(out, dt), a.lse_view(lse));
      });
      void *dout = t.random(nq, dt, 44), *dq = t.alloc(nq * dtype_size(dt)), *dk = t.alloc(nkv * dtype_size(dt)),
           *dv = t.alloc(nkv * dtype_size(dt));
      const double bwd = time_ms(be, 1, o.iters, [&] {
        ops.attention_backward(s, a, AttentionMask{}, in, a.query_view(out, dt), a.lse_view(lse),
                               a.query_view(dout, dt), a.grads(dt, dq, dk, dv, nullptr));
      });
      const double flops = 4.0 * B * Hq * S * S * D / 2.0;  // causal forward
      rows.push_back({{"S", S},
                      {"D", D},
                      {"fwd_tflops", flops / (fwd * 1e-3) / 1e12},
                      {"bwd_tflops", 2.5 * flops / (bwd * 1e-3) / 1e12}});
      std::printf("  attention S %6lld D %4lld  forward %8.4f TFLOP/s  backward %8.4f TFLOP/s\n",
                  static_cast<long long>(S), static_cast<long long>(D), flops / (fwd * 1e-3) / 1e12,
                  2.5 * flops / (bwd * 1e-3) / 1e12);
    }
  return rows;
}

// GB/s of the memory-bound ops, each on 2^22 tokens x 64 (large enough to leave the caches).
nlohmann::json memory_table(Backend& be, const CalibrateOptions& o) {
  nlohmann::json out = nlohmann::json::object();
  Ops& ops = be.ops();
  Stream& s = be.stream(StreamKind::Compute);
  const DType dt = o.dtype;
  const double e = static_cast<double>(dtype_size(dt));
  const int64_t rows = int64_t{1} << 16, width = 256, n = rows * width;
  auto rate = [&](const char* name, double bytes, const std::function<void()>& fn) {
    const double ms = time_ms(be, 1, o.iters, fn);
    out[name] = bytes / (ms * 1e-3) / 1e9;
    std::printf("  %-20s %8.2f GB/s\n", name, out[name].get<double>());
  };
  Tensors t(be);
  void *x = t.random(n, dt, 1), *w = t.random(width, dt, 2), *y = t.alloc(n * e), *dx = t.alloc(n * e);
  auto* rstd = static_cast<float*>(t.alloc(rows * 4));
  void* dw = t.alloc(width * 4);
  const RmsNormShape norm{.rows = rows, .dim = width, .eps = 1e-5f, .dtype = dt};
  rate("rmsnorm_forward", 2.0 * n * e, [&] { ops.rmsnorm_forward(s, norm, y, rstd, x, w); });
  rate("rmsnorm_backward", 3.0 * n * e,
       [&] { ops.rmsnorm_backward(s, norm, {.dx = dx, .dw_acc = dw, .accumulate = false}, y, x, w, rstd); });
  rate("swiglu_forward", 3.0 * n * e, [&] { ops.swiglu_forward(s, y, x, dx, n, dt); });
  void *dg = t.alloc(n * e), *du = t.alloc(n * e);
  rate("swiglu_backward", 5.0 * n * e, [&] { ops.swiglu_backward(s, dg, du, y, x, dx, n, dt); });
  std::vector<int32_t> pos(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) pos[i] = static_cast<int32_t>(i);
  const int32_t* p = t.ints(pos);
  const double* freq = t.doubles(rope_default_inv_freq(10000.0, 64));
  const Rope rope{.T = rows, .heads = width / 64, .head_dim = 64, .positions = p, .inv_freq = freq, .dtype = dt};
  rate("rope", 2.0 * n * e, [&] { ops.rope(s, rope, y, false); });
  rate("copy", 2.0 * n * e, [&] { be.copy_d2d(y, x, n * e, s); });
  const int64_t V = 4096, R = n / V;
  auto* logits = static_cast<float*>(t.random(R * V, DType::F32, 3, 4.0f));
  auto* loss = static_cast<float*>(t.random(1, DType::F32, 4));
  std::vector<int32_t> targets(static_cast<size_t>(R));
  for (int64_t i = 0; i < R; ++i) targets[i] = static_cast<int32_t>((i * 7919) % V);
  const int32_t* tg = t.ints(targets);
  rate("cross_entropy", R * V * (4.0 + e), [&] {
    ops.cross_entropy(s, {.rows = R, .V = V, .scale = 1.0f / R, .z_loss = 0.0f, .dtype = dt}, loss, dg, logits, tg);
  });
  {
    const int64_t an = int64_t{1} << 22;
    auto* pp = static_cast<float*>(t.random(an, DType::F32, 5));
    auto* mm = static_cast<float*>(t.random(an, DType::F32, 6, 0.01f));
    auto* vv = static_cast<float*>(t.random(an, DType::F32, 7, 0.01f));
    void* g = t.random(an, dt, 8, 0.01f);
    AdamWParams hp;
    hp.weight_decay = 0.1;
    hp.step = 10;
    const AdamArrays arr{pp, mm, vv, g, dt, nullptr, dt};
    const double ms = time_ms(be, 1, o.iters, [&] { ops.adam(s, AdamCall::Step, arr, an, hp); });
    out["device_adam_params_per_s"] = an / (ms * 1e-3);
    std::printf("  %-20s %8.3g params/s\n", "device adam", out["device_adam_params_per_s"].get<double>());
  }
  return out;
}

nlohmann::json link_table(Backend& be, const CalibrateOptions& o) {
  const size_t bytes = size_t{64} << 20;
  HostBuffer host(bytes, -1, &be, "calibrate link");
  Tensors t(be);
  void* dev = t.alloc(bytes);
  nlohmann::json out;
  for (const bool up : {true, false}) {
    Stream& s = be.stream(up ? StreamKind::H2D : StreamKind::D2H);
    std::vector<double> sec;
    for (int i = 0; i <= o.iters; ++i) {
      const double t0 = now_seconds();
      if (up)
        be.copy_h2d(dev, host.data(), bytes, s);
      else
        be.copy_d2h(host.data(), dev, bytes, s);
      be.synchronize(s);
      if (i > 0) sec.push_back(now_seconds() - t0);
    }
    out[up ? "h2d_gbps" : "d2h_gbps"] = bytes / median(sec) / 1e9;
  }
  std::printf("  link h2d %.2f GB/s, d2h %.2f GB/s (pinned, 64 MiB)\n", out["h2d_gbps"].get<double>(),
              out["d2h_gbps"].get<double>());
  return out;
}

// GraceAdam on 1..all of the process's cores, 2^24 parameters (out of the caches).
nlohmann::json cpu_adam_table(const CalibrateOptions& o) {
  nlohmann::json rows = nlohmann::json::array();
  const std::vector<int> cores = process_cores();
  const int64_t n = int64_t{1} << 24;
  std::vector<float> p(n, 0.5f), m(n, 0.0f), v(n, 0.0f), g(n, 1e-3f);
  for (size_t k = 1; k <= cores.size(); ++k) {
    GraceAdam adam(std::vector<int>(cores.begin(), cores.begin() + k), default_simd_isa());
    AdamWParams hp;
    hp.weight_decay = 0.1;
    const AdamArrays a{p.data(), m.data(), v.data(), g.data(), DType::F32, nullptr, DType::BF16};
    std::vector<double> sec;
    for (int i = 0; i <= o.iters; ++i) {
      hp.step = i + 1;
      const double t0 = now_seconds();
      adam.step(a, n, hp);
      if (i > 0) sec.push_back(now_seconds() - t0);
    }
    rows.push_back({{"threads", k}, {"params_per_s", n / median(sec)}});
    std::printf("  cpu adam %zu threads  %8.3g params/s\n", k, n / median(sec));
  }
  return rows;
}

// Bus bandwidth (nccl-tests' factors) at 64 MiB and latency at 4 KiB of each collective.
nlohmann::json collective_table(Backend& be, Communicator& comm, const CalibrateOptions& o) {
  nlohmann::json out = nlohmann::json::object();
  comm.attach(be);
  Stream& s = be.stream(StreamKind::Comm);
  const int P = comm.size();
  const DType dt = o.dtype;
  const double e = static_cast<double>(dtype_size(dt));
  for (const char* op : {"all_gather", "reduce_scatter", "all_reduce", "all_to_all"}) {
    nlohmann::json row;
    for (const int64_t total_bytes : {int64_t{4} << 10, int64_t{64} << 20}) {
      const int64_t count = total_bytes / static_cast<int64_t>(e) / P * P;  // elements of the whole buffer
      Tensors t(be);
      void *a = t.random(count, dt, 9), *b = t.alloc(count * e);
      auto run = [&] {
        const std::string name = op;
        if (name == "all_gather") comm.all_gather(s, b, a, count / P, dt);
        if (name == "reduce_scatter") comm.reduce_scatter(s, a, b, count / P, dt, ReduceOp::Sum);
        if (name == "all_reduce") comm.all_reduce(s, a, count, dt, ReduceOp::Sum);
        if (name == "all_to_all") comm.all_to_all(s, b, a, count / P, dt);
      };
      std::vector<double> sec;
      for (int i = 0; i <= o.iters; ++i) {
        double t0 = now_seconds();
        run();
        be.synchronize(s);
        double dt_s = now_seconds() - t0;
        comm.all_reduce_sum(&dt_s, 1);  // the slowest rank's view: every rank waits for it
        if (i > 0) sec.push_back(dt_s / P);
      }
      const double t_med = median(sec);
      const std::string name = op;
      const double factor = name == "all_reduce" ? 2.0 * (P - 1) / P : static_cast<double>(P - 1) / P;
      if (total_bytes < (1 << 20))
        row["latency_s"] = t_med;
      else
        row["busbw_gbps"] = count * e * factor / t_med / 1e9;
    }
    out[op] = row;
    if (comm.rank() == 0)
      std::printf("  %-15s busbw %8.2f GB/s, latency %8.1f us (%d ranks)\n", op, row["busbw_gbps"].get<double>(),
                  1e6 * row["latency_s"].get<double>(), P);
  }
  return out;
}

}  // namespace

int calibrate_bench(int argc, char** argv, Communicator& comm) {
  po::options_description desc("so_bench calibrate options");
  CalibrateOptions o;
  std::string dtype = "fp32", threads;
  bool collectives_only = false;
  desc.add_options()("help,h", "show this help")(
      "out", po::value<std::string>(&o.out)->required(),
      "write the machine profile (JSON) here, e.g. configs/machines/NAME.json")(
      "name", po::value<std::string>(&o.name), "the profile's name (default: the file name)")(
      "backend", po::value<std::string>(&o.backend)->default_value(o.backend), "cpu or cuda")(
      "dtype", po::value<std::string>(&dtype)->default_value(dtype), "fp32 or bf16: the runs to be predicted")(
      "threads", po::value<std::string>(&threads),
      "CPU backend: compute thread counts to calibrate, e.g. 1,2 "
      "(default: 1 and all the process's cores)")("max-gemm-flops", po::value<double>(&o.max_gemm_flops),
                                                  "largest GEMM timed (default 2^34 CPU, 2^38 GPU)")(
      "iters", po::value<int>(&o.iters)->default_value(o.iters), "timed runs per point (median)")(
      "collectives", po::bool_switch(&collectives_only),
      "under mpirun: measure only the collectives over these ranks and add them to the --out profile");
  po::variables_map vm;
  if (!parse_command_line(desc, argc, argv, vm)) return 0;
  o.dtype = parse_dtype(dtype, "--dtype");
  SO_CHECK(o.iters >= 1, "--iters must be at least 1");
  SO_CHECK(o.backend == "cpu" || o.backend == "cuda", "--backend is '", o.backend, "'; choose cpu or cuda");
  SO_CHECK(!std::filesystem::exists(o.out) || std::filesystem::is_regular_file(o.out), "--out '", o.out,
           "' exists and is not a regular file");
  const int cores = static_cast<int>(process_cores().size());
  if (!threads.empty())
    for (int64_t t : parse_list(threads, "--threads")) {
      SO_CHECK(t >= 1 && t <= 4096, "--threads: ", t, " is not a thread count");
      o.threads.push_back(static_cast<int>(t));
    }
  if (o.threads.empty()) o.threads = cores > 1 ? std::vector<int>{1, cores} : std::vector<int>{1};
  if (o.backend == "cuda") o.threads = {0};
  if (o.name.empty()) {
    const size_t slash = o.out.find_last_of('/'), dot = o.out.rfind(".json");
    o.name =
        o.out.substr(slash == std::string::npos ? 0 : slash + 1,
                     dot == std::string::npos ? std::string::npos : dot - (slash == std::string::npos ? 0 : slash + 1));
  }

  if (collectives_only) {
    SO_CHECK(comm.size() > 1, "--collectives needs several ranks (mpirun -np N so_bench calibrate --collectives ...)");
    // The project's reader: refuses FIFOs, directories, deep nesting and duplicate keys by name.
    nlohmann::json prof = read_json_file(o.out, "machine profile (--collectives adds to it)");
    SO_CHECK(prof.is_object() && prof.contains("compute"), "'", o.out,
             "' is not a machine profile written by so_bench "
             "calibrate (no 'compute' table)");
    auto be = make_backend(o, 1);
    const nlohmann::json table = collective_table(*be, comm, o);
    if (comm.rank() == 0) {
      prof["collectives"][std::to_string(comm.size())] = table;
      std::ofstream f(o.out);
      f << prof.dump(2) << "\n";
      SO_CHECK(f.good(), "writing '", o.out, "' failed");
      std::printf("added the collectives over %d ranks to %s\n", comm.size(), o.out.c_str());
    }
    return 0;
  }
  SO_CHECK(comm.size() == 1,
           "calibrate the compute tables on one rank (ranks sharing the machine would skew them); "
           "then add collectives with mpirun -np N so_bench calibrate --collectives --out FILE");
  nlohmann::json prof;
  prof["name"] = o.name;
  prof["source"] = "measured: so_bench calibrate";
  prof["backend"] = o.backend;
  prof["dtype"] = dtype_name(o.dtype);
  prof["cores"] = cores;
  prof["compute"] = nlohmann::json::array();
  for (int t : o.threads) {
    auto be = make_backend(o, t);
    if (comm.rank() == 0) std::printf("# %s backend, %d compute threads (0: the GPU)\n", be->name().c_str(), t);
    nlohmann::json c;
    c["threads"] = t;
    c["gemm"] = gemm_table(*be, o);
    c["attention"] = attention_table(*be, o);
    c["memory_gbps"] = memory_table(*be, o);
    prof["compute"].push_back(c);
    if (t == o.threads.front()) {
      prof["device"] = be->name();
      prof["device_bytes"] = be->memory_stats().capacity;
      prof["link"] = link_table(*be, o);
      prof["peak_tflops"] = be->peak_tflops(o.dtype);
    }
  }
  prof["cpu_adam"] = cpu_adam_table(o);
  std::ofstream f(o.out);
  SO_CHECK(f.good(), "cannot write '", o.out, "'");
  f << prof.dump(2) << "\n";
  SO_CHECK(f.good(), "writing '", o.out, "' failed");
  std::printf("wrote %s\n", o.out.c_str());
  return 0;
}

}  // namespace so::bench
