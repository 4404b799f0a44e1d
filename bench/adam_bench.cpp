// so_bench adam: GraceAdam against its roofline and against its peers, per size and thread count.
//
// Ours: GraceAdam's step on host buffers allocated as the offload optimizer allocates them. The
// bound that fits the access pattern: memory, the best of several `stream_probe`s (the same loads
// and stores over the same arrays with one add per stream: plain, with software prefetch 512 ahead, with
// non-temporal stores, and plain over a second set of arrays on the other page size), and the
// step's arithmetic ceiling, the same kernel on an L1-resident block; the roofline is the lower of
// the two, raised to any peer's measured rate on the same bytes (what a peer does is possible).
// Peers, each in its own long-lived process pinned to the same cores
// (bench/peers/cpu_adam_peer.py), interleaved with ours round by round and compared per round:
// torch.optim.AdamW(fused=True), AdamW(foreach=True), DeepSpeed's CPUAdam.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_commands.h"
#include "bench/device_timing.h"
#include "bench/peer_process.h"
#include "so/engine/optimizer_host_state.h"
#include "so/core/cpu_affinity.h"
#include "so/core/error.h"
#include "so/backend/host_buffer.h"
#include "so/optim/adam_prefetch.h"
#include "so/optim/grace_adam.h"

namespace so::bench {

namespace po = boost::program_options;

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

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

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, sep);) out.push_back(item);
  return out;
}

// "N", "2^K" or "A*2^K"; a positive element count, else an error naming the option.
int64_t parse_count(const std::string& s, const char* what) {
  const size_t caret = s.find("^");
  int64_t factor = 1, value = 0;
  std::string rest = s;
  if (const size_t star = s.find('*'); star != std::string::npos && caret != std::string::npos) {
    factor = parse_count(s.substr(0, star), what);
    rest = s.substr(star + 1);
  }
  size_t used = 0;
  try {
    if (rest.rfind("2^", 0) == 0) {
      const int k = std::stoi(rest.substr(2), &used);
      used += 2;
      if (k >= 0 && k < 40) value = int64_t{1} << k;
    } else {
      value = std::stoll(rest, &used);
    }
  } catch (const std::exception&) {
    used = 0;
  }
  SO_CHECK(used == rest.size() && value > 0 && factor > 0, what, ": '", s,
           "' is not a positive count (N, 2^K or A*2^K, K < 40)");
  return factor * value;
}

// "2^20..2^28" is every power of two in between; otherwise a comma-separated list of counts.
std::vector<int64_t> parse_sizes(const std::string& s) {
  if (const size_t dots = s.find(".."); dots != std::string::npos) {
    const int64_t lo = parse_count(s.substr(0, dots), "--sizes"), hi = parse_count(s.substr(dots + 2), "--sizes");
    SO_CHECK(lo <= hi && (lo & (lo - 1)) == 0 && (hi & (hi - 1)) == 0, "--sizes: '", s,
             "' must be a range of powers of two, low..high");
    std::vector<int64_t> out;
    for (int64_t n = lo; n <= hi; n *= 2) out.push_back(n);
    return out;
  }
  std::vector<int64_t> out;
  for (const std::string& item : split(s, ',')) out.push_back(parse_count(item, "--sizes"));
  return out;
}

std::vector<int> parse_threads(const std::string& s) {
  std::vector<int> out;
  for (const std::string& item : split(s, ',')) {
    const int64_t v = parse_count(item, "--threads");
    SO_CHECK(v < 4096, "--threads: '", item, "' is not a thread count");
    out.push_back(static_cast<int>(v));
  }
  return out;
}

// The arrays of one size, allocated as the offload optimizer allocates its state (the same type).
struct Arrays {
  OptimizerHostState state;
  AdamArrays view;
  Arrays(int64_t n, DType grad_dt, bool has_out, DType out_dt, bool skew = true, bool huge_pages = true) {
    OptimizerHostStateSpec spec;
    spec.elements = n, spec.grad_dtype = grad_dt, spec.has_out = has_out, spec.out_dtype = out_dt, spec.skew = skew;
    spec.huge_pages = huge_pages;
    state = OptimizerHostState(spec);
    std::fill_n(state.p(), n, 0.5f);
    std::fill_n(state.m(), n, 1e-3f);
    std::fill_n(state.v(), n, 1e-6f);
    std::fill_n(static_cast<char*>(state.grads()), n * dtype_size(grad_dt), char{0x3c});  // bf16 or fp32: ~0.0115
    view = state.arrays(0, false);
  }
};

// The step's arithmetic throughput on one core (params/s): the kernel alone on a block that stays in
// L1, so no memory level limits it. A ceiling: interference only slows it, so the fastest of many
// short runs is the estimate (a median moved it by 30% between runs on a shared VM).
double arithmetic_ceiling(SimdIsa isa, DType grad_dt, bool has_out, DType out_dt) {
  constexpr int64_t kL1Block = 1024;  // p, m, v, grad, out: at most 20 KiB
  Arrays a(kL1Block, grad_dt, has_out, out_dt);
  const AdamKernels& k = adam_kernels(isa);
  const AdamWParams hp{.lr = 1e-3, .weight_decay = 0.01, .step = 10};
  constexpr int kReps = 500, kRuns = 41;
  double best = 1e30;
  for (int run = 0; run < kRuns; ++run) {
    const double t0 = now_s();
    for (int r = 0; r < kReps; ++r) k.step(a.view, kL1Block, hp);
    best = std::min(best, now_s() - t0);
  }
  return kL1Block * kReps / best;
}

// Longer than a peer's OpenMP team spins after a parallel region (libgomp's GOMP_SPINCOUNT, 300000
// polls by default: well under a millisecond to a few).
constexpr int kPeerSpinMs = 20;

struct Peer {
  std::string impl;
  std::unique_ptr<PeerProcess> proc;
};

}  // namespace

int adam_bench(int argc, char** argv, Communicator& comm) {
  po::options_description desc("so_bench adam options");
  std::string threads_arg = "1,2", sizes_arg = "2^25", isa_arg, grad_arg = "bf16", out_arg = "bf16";
  std::string peers_arg = "torch-fused,torch-foreach,deepspeed", layout = "skewed", pages = "huge";
  int iters = 7, warmup = 2, rounds = 3;
  desc.add_options()("help,h", "show this help")(
      "sizes,n", po::value<std::string>(&sizes_arg)->default_value(sizes_arg),
      "parameters per step: a list of N, 2^K or A*2^K, or a range of powers of two such as 2^20..2^28")(
      "threads,t", po::value<std::string>(&threads_arg)->default_value(threads_arg),
      "comma-separated thread counts; counts above this process's cores are dropped")(
      "iters", po::value<int>(&iters)->default_value(iters), "timed iterations per round (the median is kept)")(
      "warmup", po::value<int>(&warmup)->default_value(warmup), "untimed iterations first")(
      "rounds", po::value<int>(&rounds)->default_value(rounds),
      "rounds; in each, every peer's steps and a burst of ours right after (their ratio), then ours with the probes")(
      "isa", po::value<std::string>(&isa_arg), "kernel ISA (default: the best this CPU runs, or SO_SIMD)")(
      "grad-dtype", po::value<std::string>(&grad_arg)->default_value(grad_arg), "gradient dtype: bf16 or fp32")(
      "out-dtype", po::value<std::string>(&out_arg)->default_value(out_arg),
      "dtype of the device weights written in the same pass: bf16, fp32 or none")(
      "peers", po::value<std::string>(&peers_arg)->default_value(peers_arg),
      "comma-separated peers (torch-fused, torch-foreach, deepspeed), or none")(
      "layout", po::value<std::string>(&layout)->default_value(layout),
      "host arrays: skewed (the offload optimizer's: each stream a different offset into its page) or aligned "
      "(every stream page-aligned)")(
      "pages", po::value<std::string>(&pages)->default_value(pages),
      "host arrays: huge (the offload optimizer's: transparent huge pages where the kernel offers them) or small "
      "(ordinary pages); the bound also probes the other");
  po::variables_map vm;
  if (!parse_command_line(desc, argc, argv, vm)) return 0;
  SO_CHECK(iters > 0 && warmup >= 0 && rounds > 0, "--iters and --rounds must be positive, --warmup >= 0");
  SO_CHECK(layout == "skewed" || layout == "aligned", "--layout is '", layout, "'; choose skewed or aligned");
  SO_CHECK(pages == "huge" || pages == "small", "--pages is '", pages, "'; choose huge or small");
  const bool huge = pages == "huge";
  const std::vector<int64_t> sizes = parse_sizes(sizes_arg);
  const SimdIsa isa = isa_arg.empty() ? default_simd_isa() : parse_simd_isa(isa_arg);
  const DType grad_dt = parse_dtype(grad_arg, "--grad-dtype");
  const bool has_out = out_arg != "none";
  const DType out_dt = has_out ? parse_dtype(out_arg, "--out-dtype") : DType::F32;
  // The peers have a like-for-like job in two configurations only.
  const bool same_bytes = grad_dt == DType::F32 && !has_out;
  const bool superoffload_io = grad_dt == DType::BF16 && has_out && out_dt == DType::BF16;
  const std::string peer_mode = same_bytes ? "fp32" : "bf16-io";
  std::vector<std::string> peer_impls;
  if (peers_arg != "none")
    for (const std::string& impl : split(peers_arg, ',')) {
      SO_CHECK(impl == "torch-fused" || impl == "torch-foreach" || impl == "deepspeed", "--peers: '", impl,
               "' is not one of torch-fused, torch-foreach, deepspeed (or none)");
      peer_impls.push_back(impl);
    }
  if (!same_bytes && !superoffload_io) peer_impls.clear();
  const std::vector<int> cores = process_cores();
  std::vector<int> thread_counts;
  for (int t : parse_threads(threads_arg)) {
    if (t <= static_cast<int>(cores.size()))
      thread_counts.push_back(t);
    else if (comm.rank() == 0)
      std::printf("# --threads %d dropped: this process has %zu cores\n", t, cores.size());
  }
  SO_CHECK(!thread_counts.empty(), "--threads: no count fits this process's ", cores.size(), " cores");

  // What one parameter must move: p, m, v read and written, the gradient read, the device copy written.
  const int64_t bytes_per_param = 24 + dtype_size(grad_dt) + (has_out ? dtype_size(out_dt) : 0);
  const AdamWParams hp{.lr = 1e-3, .weight_decay = 0.01, .step = 10};
  const ThpSettings thp = thp_settings();
  std::printf(
      "# so_bench adam: isa %s, grad %s, out %s, %s arrays on %s pages (THP %s, %zu KiB): %lld bytes/param "
      "(p,m,v read+written 24, grad %zu, out %zu); software prefetch %lld elements ahead\n",
      simd_isa_name(isa), dtype_name(grad_dt), has_out ? dtype_name(out_dt) : "none", layout.c_str(), pages.c_str(),
      thp.mode.empty() ? "absent" : thp.mode.c_str(), thp.huge_page / 1024, static_cast<long long>(bytes_per_param),
      dtype_size(grad_dt), has_out ? dtype_size(out_dt) : size_t{0}, static_cast<long long>(adam_prefetch_ahead()));
  std::printf(
      "# bound = max(min(memory: the best stream probe, the step's loads and stores with an add per stream, same "
      "threads:\n"
      "#                  plain, prefetch (512 ahead), nt (non-temporal stores), %s (plain, on %s pages);\n"
      "#              arithmetic ceiling: the step on an L1-resident block, best of 41 runs, x threads),\n"
      "#          the fastest peer on the same bytes); median of %d rounds of %d (+%d warm-up); each round\n"
      "#          starts with each peer's steps, each followed by as many of ours alone, for the peer's ratio\n",
      huge ? "4k" : "huge", huge ? "ordinary" : "huge", rounds, iters, warmup);
  const double ceiling1 = arithmetic_ceiling(isa, grad_dt, has_out, out_dt);
  std::printf("# arithmetic ceiling: %.3f Gparams/s per thread\n", ceiling1 * 1e-9);
  if (!peer_impls.empty())
    std::printf("# peers (%s): %s\n", peer_mode.c_str(),
                same_bytes ? "fp32 grads, no copy out: the same 28 bytes/param"
                           : "bf16 grads cast to fp32 + the fp32 step + the weights cast to bf16, all timed");
  // The probes, each timed right after the step in every iteration: three ways over ours' arrays, and
  // plain over arrays on the other page size (so neither page size is assumed to be the faster).
  struct Probe {
    std::string name;
    StreamProbe kind;
    bool other_pages;
  };
  const std::vector<Probe> probes = {{"plain", StreamProbe::Plain, false},
                                     {"prefetch", StreamProbe::Prefetch, false},
                                     {"nt", StreamProbe::NonTemporal, false},
                                     {huge ? "4k" : "huge", StreamProbe::Plain, true}};
  std::printf("%12s %3s %10s %9s %6s", "elements", "thr", "Gparams/s", "GB/s", "huge%");
  for (const Probe& pr : probes) std::printf(" %9s", pr.name.c_str());
  std::printf(" %8s %-9s %9s %9s", "bound", "binds", "rollback", "redo");
  for (const std::string& impl : peer_impls) std::printf(" %14s %8s", (impl + " Gp/s").c_str(), "ours/it");
  std::printf("\n");

  std::map<std::string, std::string> peer_notes;
  const char* python_env = std::getenv("SO_PYTHON");
  const std::string python = python_env != nullptr && *python_env != '\0' ? python_env : SO_PYTHON;
  for (int t : thread_counts) {
    const std::vector<int> use(cores.begin(), cores.begin() + t);
    GraceAdam ga(use, isa);
    std::vector<Peer> peers;
    for (const std::string& impl : peer_impls) {
      std::string core_list;
      for (int c : use) {
        if (!core_list.empty()) core_list += ',';
        core_list += std::to_string(c);
      }
      auto proc = std::make_unique<PeerProcess>(
          std::vector<std::string>{python, std::string(SO_BENCH_DIR) + "/peers/cpu_adam_peer.py", "--impl", impl,
                                   "--threads", std::to_string(t), "--cores", core_list},
          600.0);
      peer_notes[impl] = proc->available() ? proc->banner() : "unavailable: " + proc->why();
      peers.push_back({impl, std::move(proc)});
    }
    for (int64_t n : sizes) {
      Arrays a(n, grad_dt, has_out, out_dt, layout == "skewed", huge);
      Arrays other(n, grad_dt, has_out, out_dt, layout == "skewed", !huge);
      // Steady state before timing (the pages were touched when allocated, by this thread).
      ga.stream_probe(a.view, n, StreamProbe::Plain);
      ga.stream_probe(other.view, n, StreamProbe::Plain);
      // Step, probes, rollback and redo back to back in every iteration, and the ratios taken per
      // iteration: the host's drift (a VM's neighbours share its last-level cache) cancels. A peer's
      // ratio is taken the same way, per pair of bursts (the peer's steps, then ours'): on a VM the
      // memory bandwidth of two threads moves between ~58 and ~92 GB/s within a run (the 2-core AMD
      // machine: where the host runs the vCPUs), so a peer timed at another moment than ours is
      // compared with another machine. Each side times its steps after its own warm-up.
      std::vector<double> step_t, bound_ratio, rollback_ratio, redo_ratio;
      std::vector<std::vector<double>> probe_t(probes.size()), peer_t(peers.size()), peer_ratio(peers.size());
      std::vector<bool> peer_failed(peers.size(), false);
      std::map<std::string, int> binds;  // per iteration, which of the probes or the ceiling bound
      auto timed = [](auto&& fn) {
        const double t0 = now_s();
        fn();
        return now_s() - t0;
      };
      for (int r = 0; r < rounds; ++r) {
        // Each peer's burst, then a burst of ours' steps alone right after it: the pair's ratio.
        for (size_t k = 0; k < peers.size(); ++k) {
          if (peer_failed[k]) continue;
          const std::optional<std::string> reply =
              peers[k].proc->request(str_cat(n, " ", peer_mode, " ", warmup, " ", iters), "median_s=", 600.0);
          if (!reply) {
            peer_failed[k] = true;
            peer_notes[peers[k].impl] = "failed: " + peers[k].proc->why();
            continue;
          }
          // A peer's OpenMP team spins on its cores for a while after its last step (libgomp's
          // default wait policy); ours must not share the cores with it.
          std::this_thread::sleep_for(std::chrono::milliseconds(kPeerSpinMs));
          std::vector<double> burst;
          for (int i = 0; i < warmup + iters; ++i) {
            const double ts = timed([&] { ga.step(a.view, n, hp); });
            if (i >= warmup) burst.push_back(ts);
          }
          const double tpeer = std::stod(reply->substr(9));
          peer_t[k].push_back(tpeer), peer_ratio[k].push_back(tpeer / median(burst));
        }
        for (int i = 0; i < warmup + iters; ++i) {
          const double ts = timed([&] { ga.step(a.view, n, hp); });
          std::vector<double> tp;
          for (const Probe& pr : probes)
            tp.push_back(timed([&] { ga.stream_probe((pr.other_pages ? other : a).view, n, pr.kind); }));
          const double tr = timed([&] { ga.rollback(a.view, n, hp); });
          const double td = timed([&] { ga.redo(a.view, n, hp, 0.5f); });
          if (i < warmup) continue;
          step_t.push_back(ts);
          for (size_t k = 0; k < probes.size(); ++k) probe_t[k].push_back(tp[k]);
          const size_t best = std::min_element(tp.begin(), tp.end()) - tp.begin();
          const bool compute_bound = ceiling1 * t < n / tp[best];
          ++binds[compute_bound ? "ceiling" : probes[best].name];
          bound_ratio.push_back(n / ts / std::min(n / tp[best], ceiling1 * t));
          rollback_ratio.push_back(tr / ts), redo_ratio.push_back(td / ts);
        }
      }
      const double step_s = median(step_t), rate = n / step_s;
      // The roofline's verdict, unless a peer did better on the same bytes: then the peer's rate is the
      // bound (it is possible, so no probe that says less is the limit).
      double bound = median(bound_ratio);
      std::string bound_by = std::max_element(binds.begin(), binds.end(), [](const auto& x, const auto& y) {
                               return x.second < y.second;
                             })->first;
      for (size_t i = 0; i < peers.size(); ++i)
        if (same_bytes && !peer_failed[i] && median(peer_ratio[i]) < bound)
          bound = median(peer_ratio[i]), bound_by = peers[i].impl;
      std::printf("%12lld %3d %10.3f %9.2f %6.0f", static_cast<long long>(n), t, rate * 1e-9,
                  rate * bytes_per_param * 1e-9, 100 * a.state.huge_page_share());
      for (const std::vector<double>& pt : probe_t) std::printf(" %9.2f", n / median(pt) * bytes_per_param * 1e-9);
      std::printf(" %8.3f %-9s %9.3f %9.3f", bound, bound_by.c_str(), median(rollback_ratio), median(redo_ratio));
      for (size_t i = 0; i < peers.size(); ++i) {
        if (!peer_failed[i])
          std::printf(" %14.3f %8.2f", n / median(peer_t[i]) * 1e-9, median(peer_ratio[i]));
        else
          std::printf(" %14s %8s", "-", "-");
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  std::printf(
      "# huge%%: the share of ours' arrays the kernel backed with huge pages (smaps AnonHugePages)\n"
      "# probe columns: GB/s of each memory probe (median); bound column: ours / min(best probe, arithmetic\n"
      "# ceiling x threads), median of per-iteration ratios, or ours / the fastest same-bytes peer where that is\n"
      "# lower (target >= 0.95); binds: what set the bound most often; rollback, redo: their time / the step's,\n"
      "# per iteration; peers: Gp/s of their median step; ours/it: median over rounds of their median step /\n"
      "# the median of a burst of ours' steps right after it\n");
  for (const auto& [impl, note] : peer_notes) std::printf("# %s: %s\n", impl.c_str(), note.c_str());
  if (!same_bytes && !superoffload_io && peers_arg != "none")
    std::printf(
        "# peers: none for these dtypes (like-for-like only with --grad-dtype fp32 --out-dtype none, or bf16/bf16)\n");
  return 0;
}

}  // namespace so::bench
