// so_bench adam: GraceAdam's throughput (params/s and GB/s by the bytes one parameter must move)
// for each thread count, against a STREAM triad on the same pinned cores as the bound, plus the
// cost of a rollback relative to a step and, when python3 has torch, torch.optim.AdamW(foreach).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_commands.h"
#include "so/core/cpu_affinity.h"
#include "so/core/error.h"
#include "so/optim/grace_adam.h"

namespace so::bench {

namespace po = boost::program_options;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// Median seconds of fn over `iters` runs after `warmup` unrecorded ones.
template <typename Fn>
double time_median(int warmup, int iters, Fn&& fn) {
  std::vector<double> t;
  for (int i = 0; i < warmup + iters; ++i) {
    const double t0 = now_s();
    fn();
    if (i >= warmup) t.push_back(now_s() - t0);
  }
  return median(t);
}

std::vector<int> parse_int_list(const std::string& s, const char* what) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    SO_CHECK(used == item.size() && v > 0, what, ": '", item, "' is not a positive integer");
    out.push_back(v);
  }
  SO_CHECK(!out.empty(), what, " is empty");
  return out;
}

// STREAM's triad on doubles, a = b + s*c, 24 bytes per element by STREAM's count, compiled for
// the best vector ISA of the CPU as STREAM built with -march=native would be.
__attribute__((target_clones("avx512f", "avx2", "default"))) void triad(double* a, const double* b, const double* c,
                                                                         double s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

// Parallel loop over [0, n) in GraceAdam-sized blocks.
template <typename Fn>
void for_blocks(ThreadPool& pool, int64_t n, Fn&& fn) {
  const int64_t blocks = (n + GraceAdam::kBlock - 1) / GraceAdam::kBlock;
  pool.parallel_for(blocks, [&](int64_t b) {
    const int64_t begin = b * GraceAdam::kBlock;
    fn(begin, std::min(n, begin + GraceAdam::kBlock));
  });
}

struct TorchResult {
  bool ok = false;
  double seconds = 0;
  std::string detail;  // torch version, or why it is unavailable
};

// Runs bench/torch_adamw.py (torch.optim.AdamW(foreach=True), fp32 params and grads) on the same
// element count, thread count and cores.
TorchResult run_torch(int64_t n, const std::vector<int>& cores, int warmup, int iters) {
  std::string core_list;
  for (int c : cores) {
    if (!core_list.empty()) core_list += ',';
    core_list += std::to_string(c);
  }
  const std::string cmd = str_cat("python3 ", SO_BENCH_DIR, "/torch_adamw.py --elements ", n, " --threads ",
                                  cores.size(), " --cores ", core_list, " --warmup ", warmup, " --iters ", iters,
                                  " 2>&1");
  TorchResult r;
  std::FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return {false, 0, "cannot start python3"};
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, pipe)) out += buf;
  const int status = pclose(pipe);
  std::string last = out;
  while (!last.empty() && last.back() == '\n') last.pop_back();
  last = last.substr(last.find_last_of('\n') == std::string::npos ? 0 : last.find_last_of('\n') + 1);
  if (status == 0 && std::sscanf(last.c_str(), "median_s=%lf", &r.seconds) == 1) {
    r.ok = true;
    r.detail = last.substr(last.find("torch=") == std::string::npos ? last.size() : last.find("torch="));
  } else {
    r.detail = last.rfind("unavailable: ", 0) == 0 ? last.substr(13) : "python3/torch failed: " + last;
  }
  return r;
}

}  // namespace

int adam_bench(int argc, char** argv, Communicator& comm) {
  po::options_description desc("so_bench adam options");
  std::string threads_arg = "1,2", isa_arg, grad_arg = "bf16", out_arg = "bf16";
  int64_t n = int64_t{32} << 20;
  int iters = 10, warmup = 3;
  desc.add_options()("help,h", "show this help")(
      "threads,t", po::value<std::string>(&threads_arg)->default_value(threads_arg),
      "comma-separated thread counts; counts above this process's cores are dropped")(
      "elements,n", po::value<int64_t>(&n)->default_value(n),
      "parameters per step (default 32M: arrays far beyond the last-level cache)")(
      "iters", po::value<int>(&iters)->default_value(iters), "timed iterations (the median is reported)")(
      "warmup", po::value<int>(&warmup)->default_value(warmup), "untimed iterations first")(
      "isa", po::value<std::string>(&isa_arg), "kernel ISA (default: the best this CPU runs, or SO_SIMD)")(
      "grad-dtype", po::value<std::string>(&grad_arg)->default_value(grad_arg), "gradient dtype: bf16 or fp32")(
      "out-dtype", po::value<std::string>(&out_arg)->default_value(out_arg),
      "dtype of the device weights written in the same pass: bf16, fp32 or none")(
      "no-torch", "skip the torch.optim.AdamW comparison");
  po::variables_map vm;
  if (!parse_command_line(desc, argc, argv, vm)) return 0;
  SO_CHECK(n > 0 && iters > 0 && warmup >= 0, "--elements and --iters must be positive, --warmup >= 0");
  const SimdIsa isa = isa_arg.empty() ? default_simd_isa() : parse_simd_isa(isa_arg);
  const DType grad_dt = parse_dtype(grad_arg, "--grad-dtype");
  const bool has_out = out_arg != "none";
  const DType out_dt = has_out ? parse_dtype(out_arg, "--out-dtype") : DType::F32;
  const std::vector<int> cores = process_cores();
  std::vector<int> thread_counts;
  for (int t : parse_int_list(threads_arg, "--threads")) {
    if (t <= static_cast<int>(cores.size())) thread_counts.push_back(t);
    else if (comm.rank() == 0) std::printf("# --threads %d dropped: this process has %zu cores\n", t, cores.size());
  }
  SO_CHECK(!thread_counts.empty(), "--threads: no count fits this process's ", cores.size(), " cores");

  // What one parameter must move: p, m, v read and written, the gradient read, the device copy written.
  const int64_t bytes_per_param = 24 + dtype_size(grad_dt) + (has_out ? dtype_size(out_dt) : 0);
  // The triad's arrays take as much memory as the optimizer's (24 bytes per element).
  const int64_t triad_n = n * bytes_per_param / 24;
  std::vector<float> p(n), m(n), v(n);
  std::vector<double> a(triad_n), b(triad_n), c(triad_n);
  std::vector<char> grad(n * dtype_size(grad_dt)), out(has_out ? n * dtype_size(out_dt) : 0);
  const AdamWParams hp{.lr = 1e-3f, .weight_decay = 0.01f, .step = 10, .grad_scale = 1.0f};

  std::printf("# so_bench adam: %lld params, grad %s, out %s, %lld bytes/param (p,m,v read+write 24, grad %zu, out %zu)\n",
              static_cast<long long>(n), dtype_name(grad_dt), has_out ? dtype_name(out_dt) : "none",
              static_cast<long long>(bytes_per_param), dtype_size(grad_dt), has_out ? dtype_size(out_dt) : size_t{0});
  std::printf("# triad a=b+s*c over %lld doubles (24 bytes/element, STREAM's count); median of %d after %d warm-up\n",
              static_cast<long long>(triad_n), iters, warmup);
  std::printf("# %7s %-8s %-12s %10s %9s %10s %9s %14s %12s %10s %11s\n", "threads", "cores", "isa", "Gparams/s",
              "adam GB/s", "triad GB/s", "fraction", "rollback/step", "torch Gpar/s", "torch GB/s", "ours/torch");
  bool torch_available = !vm.count("no-torch");
  std::string torch_note = torch_available ? "" : "skipped (--no-torch)";
  for (int t : thread_counts) {
    const std::vector<int> use(cores.begin(), cores.begin() + t);
    GraceAdam ga(use, isa);
    // The bound runs on its own pool on the same cores, pinned the same way (GraceAdam's is private).
    ThreadPool triad_pool(use);
    // First touch by the threads that will use the memory (NUMA placement), then steady state.
    for_blocks(triad_pool, n, [&](int64_t lo, int64_t hi) {
      std::fill(p.begin() + lo, p.begin() + hi, 0.5f);
      std::fill(m.begin() + lo, m.begin() + hi, 1e-3f);
      std::fill(v.begin() + lo, v.begin() + hi, 1e-6f);
    });
    std::fill(grad.begin(), grad.end(), char{0x3c});  // 0x3c3c: bf16 ~0.0115; as fp32 ~0.0115 too
    for_blocks(triad_pool, triad_n, [&](int64_t lo, int64_t hi) {
      std::fill(a.begin() + lo, a.begin() + hi, 0.0);
      std::fill(b.begin() + lo, b.begin() + hi, 1.0);
      std::fill(c.begin() + lo, c.begin() + hi, 2.0);
    });

    std::vector<double> step_t, rollback_t;
    for (int i = 0; i < warmup + iters; ++i) {
      const double t0 = now_s();
      ga.step(p.data(), m.data(), v.data(), grad.data(), grad_dt, has_out ? out.data() : nullptr, out_dt, n, hp);
      const double t1 = now_s();
      ga.rollback(p.data(), m.data(), v.data(), grad.data(), grad_dt, n, hp);
      const double t2 = now_s();
      if (i >= warmup) {
        step_t.push_back(t1 - t0);
        rollback_t.push_back(t2 - t1);
      }
    }
    const double step_s = median(step_t), rollback_s = median(rollback_t);
    const double triad_s = time_median(warmup, iters, [&] {
      for_blocks(triad_pool, triad_n,
                 [&](int64_t lo, int64_t hi) { triad(a.data() + lo, b.data() + lo, c.data() + lo, 3.0, hi - lo); });
    });
    const double params_s = n / step_s;
    const double adam_gbs = params_s * bytes_per_param * 1e-9;
    const double triad_gbs = 24.0 * triad_n / triad_s * 1e-9;
    std::printf("  %7d %-8s %-12s %10.3f %9.2f %10.2f %9.3f %14.3f", t, format_core_list(use).c_str(),
                simd_isa_name(ga.isa()), params_s * 1e-9, adam_gbs, triad_gbs, adam_gbs / triad_gbs, rollback_s / step_s);
    if (torch_available) {
      const TorchResult r = run_torch(n, use, warmup, iters);
      torch_available = r.ok;
      torch_note = r.detail;
      if (r.ok) {
        // torch moves the same state plus an fp32 gradient and writes no device copy: 28 bytes.
        std::printf(" %12.3f %10.2f %11.2f\n", n / r.seconds * 1e-9, n / r.seconds * 28 * 1e-9, params_s * r.seconds / n);
        continue;
      }
    }
    std::printf(" %12s %10s %11s\n", "-", "-", "-");
  }
  std::printf("# fraction = adam GB/s / triad GB/s (target >= 0.90); rollback/step target <= 1.10\n");
  if (torch_available)
    std::printf("# torch: %s, torch.optim.AdamW(foreach=True), fp32 params and grads, 28 bytes/param counted\n",
                torch_note.c_str());
  else
    std::printf("# torch: unavailable (%s)\n", torch_note.c_str());
  return 0;
}

}  // namespace so::bench
