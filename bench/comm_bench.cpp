// so_bench comm: each collective's time, algorithm bandwidth and bus bandwidth per message size
// in the nccl-tests convention (nccl-tests doc/PERFORMANCE.md), so the numbers read like theirs:
//   size   the larger buffer in bytes (all_gather: the gathered recv; reduce_scatter, all_to_all:
//          the whole send), count its elements;
//   time   the slowest rank's mean over --iters collectives enqueued back to back on the comm stream;
//   algbw  size / time;  busbw = algbw * 2(n-1)/n (all_reduce), (n-1)/n (all_gather,
//          reduce_scatter, all_to_all), 1 (broadcast): comparable with the link's bandwidth;
//   #wrong elements of one more run, from fresh inputs, that differ from the exact expected values
//          (parallel/collective_check.h), summed over ranks; any makes the command fail.
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_commands.h"
#include "parallel/collective_check.h"
#include "so/backend/backend.h"
#include "so/core/clock.h"
#include "so/core/error.h"

namespace so::bench {

namespace po = boost::program_options;

namespace {

std::vector<Collective> parse_collectives(const std::string& list) {
  std::vector<Collective> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(parse_collective(item));
  SO_CHECK(!out.empty(), "--collectives is empty");
  return out;
}

double bus_factor(Collective c, int n) {
  switch (c) {
    case Collective::AllReduce: return 2.0 * (n - 1) / n;
    case Collective::Broadcast: return 1.0;
    default: return static_cast<double>(n - 1) / n;
  }
}

// The interface's count for a message of `bytes` in total (nccl-tests' size), 0 when too small.
int64_t count_for(Collective c, int64_t bytes, DType dt, int n) {
  const int64_t blocks = std::max(send_elements(c, 1, n), recv_elements(c, 1, n));
  return bytes / static_cast<int64_t>(dtype_size(dt)) / blocks;
}

struct Setup {
  Communicator& comm;
  Backend& backend;
  DType dt;
  int warmup, iters;
  static constexpr int kRoot = 0;  // broadcast's, as nccl-tests' default
};

struct Row {
  int64_t bytes = 0, elements = 0;
  double us = 0, algbw = 0, busbw = 0;
  int64_t wrong = 0;
};

// all_reduce and broadcast run in place on `send` (their only form), the others out of place.
void issue(const Setup& b, Collective c, void* send, void* recv, int64_t count) {
  Stream& s = b.backend.stream(StreamKind::Comm);
  switch (c) {
    case Collective::AllReduce: return b.comm.all_reduce(s, send, count, b.dt, ReduceOp::Sum);
    case Collective::AllGather: return b.comm.all_gather(s, recv, send, count, b.dt);
    case Collective::ReduceScatter: return b.comm.reduce_scatter(s, recv, send, count, b.dt, ReduceOp::Sum);
    case Collective::AllToAll: return b.comm.all_to_all(s, recv, send, count, b.dt);
    case Collective::Broadcast: return b.comm.broadcast(s, send, count, b.dt, Setup::kRoot);
  }
}

Row measure(const Setup& b, Collective c, int64_t count, DeviceBuffer& send, DeviceBuffer& recv) {
  const int n = b.comm.size(), rank = b.comm.rank();
  Stream& s = b.backend.stream(StreamKind::Comm);
  const int64_t send_n = send_elements(c, count, n);
  fill_check_input(send.data(), send_n, b.dt, rank);
  for (int i = 0; i < b.warmup; ++i) issue(b, c, send.data(), recv.data(), count);
  b.backend.synchronize(s);

  b.comm.barrier();
  const double t0 = now_seconds();
  for (int i = 0; i < b.iters; ++i) issue(b, c, send.data(), recv.data(), count);
  b.backend.synchronize(s);
  std::vector<double> per_rank(n, 0.0);  // each rank's mean in its slot; the sum gathers them all
  per_rank[rank] = (now_seconds() - t0) / b.iters;
  b.comm.all_reduce_sum(per_rank.data(), n);

  // nccl-tests' check: fresh inputs (all_reduce and broadcast overwrote theirs), one more run.
  fill_check_input(send.data(), send_n, b.dt, rank);
  issue(b, c, send.data(), recv.data(), count);
  b.backend.synchronize(s);
  const bool in_place = c == Collective::AllReduce || c == Collective::Broadcast;
  double wrong = static_cast<double>(count_wrong(CheckSpec{c, ReduceOp::Sum, b.dt, count, n, rank, Setup::kRoot},
                                                 in_place ? send.data() : recv.data()));
  b.comm.all_reduce_sum(&wrong, 1);

  Row r;
  r.elements = std::max(send_n, recv_elements(c, count, n));
  r.bytes = r.elements * static_cast<int64_t>(dtype_size(b.dt));
  const double seconds = *std::max_element(per_rank.begin(), per_rank.end());
  r.us = seconds * 1e6;
  r.algbw = r.bytes / seconds / 1e9;
  r.busbw = r.algbw * bus_factor(c, n);
  r.wrong = static_cast<int64_t>(wrong);
  return r;
}

}  // namespace

int comm_bench(int argc, char** argv, Communicator& comm) {
  po::options_description desc("so_bench comm options (run under mpirun; rank 0 prints)");
  std::string collectives_arg = "all_reduce,all_gather,reduce_scatter,all_to_all,broadcast";
  std::string min_arg = "8", max_arg = "64M", dtype_arg = "fp32";
  int factor = 2, iters = 20, warmup = 5;
  desc.add_options()("help,h", "show this help")(
      "collectives", po::value<std::string>(&collectives_arg)->default_value(collectives_arg),
      "comma-separated: all_reduce, all_gather, reduce_scatter, all_to_all, broadcast")(
      "min-bytes", po::value<std::string>(&min_arg)->default_value(min_arg), "smallest message (suffix K, M, G)")(
      "max-bytes", po::value<std::string>(&max_arg)->default_value(max_arg), "largest message")(
      "step-factor", po::value<int>(&factor)->default_value(factor), "each size is the previous times this")(
      "iters", po::value<int>(&iters)->default_value(iters), "timed iterations per size (the mean is reported)")(
      "warmup", po::value<int>(&warmup)->default_value(warmup), "untimed iterations first")(
      "dtype", po::value<std::string>(&dtype_arg)->default_value(dtype_arg), "element type: fp32 or bf16");
  po::variables_map vm;
  if (!parse_command_line(desc, argc, argv, vm)) return 0;
  const std::vector<Collective> collectives = parse_collectives(collectives_arg);
  const int64_t min_bytes = parse_bytes(min_arg, "--min-bytes"), max_bytes = parse_bytes(max_arg, "--max-bytes");
  SO_CHECK(min_bytes <= max_bytes, "--min-bytes ", min_bytes, " is above --max-bytes ", max_bytes);
  SO_CHECK(factor >= 2, "--step-factor must be at least 2, got ", factor);
  SO_CHECK(iters >= 1 && warmup >= 0, "--iters must be >= 1 and --warmup >= 0");

  BackendOptions bo;
  bo.type = "cpu";  // the MPI communicator moves host memory
  std::unique_ptr<Backend> backend = create_backend(bo);
  comm.attach(*backend);
  const Setup setup{comm, *backend, parse_dtype(dtype_arg, "--dtype"), warmup, iters};
  // nccl-tests' size is the larger buffer, so max_bytes bounds both.
  DeviceBuffer send = backend->alloc(max_bytes, "comm bench send"), recv = backend->alloc(max_bytes, "comm bench recv");
  const bool printer = comm.rank() == 0;
  const char* type = setup.dt == DType::F32 ? "float" : "bfloat16";  // nccl-tests' names

  int64_t wrong_total = 0;
  for (Collective c : collectives) {
    if (printer) {
      std::printf(
          "# so_bench comm %s: %d ranks, %s, %lld..%lld B x%d, %d warm-up + %d timed iterations, %s backend "
          "comm stream\n",
          collective_name(c), comm.size(), dtype_name(setup.dt), static_cast<long long>(min_bytes),
          static_cast<long long>(max_bytes), factor, warmup, iters, backend->name().c_str());
      std::printf("#%11s  %12s  %8s  %6s  %6s  %9s  %8s  %8s  %6s\n", "size", "count", "type", "redop", "root", "time",
                  "algbw", "busbw", "#wrong");
      std::printf("#%11s  %12s  %8s  %6s  %6s  %9s  %8s  %8s\n", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)",
                  "(GB/s)");
    }
    double busbw_sum = 0;
    int rows = 0;
    for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= factor) {
      const int64_t count = count_for(c, bytes, setup.dt, comm.size());
      if (count == 0) continue;  // less than one element per rank's block
      const Row r = measure(setup, c, count, send, recv);
      wrong_total += r.wrong;
      busbw_sum += r.busbw;
      ++rows;
      if (printer) {
        std::printf(" %11lld  %12lld  %8s  %6s  %6d  %9.2f  %8.3f  %8.3f  %6lld\n", static_cast<long long>(r.bytes),
                    static_cast<long long>(r.elements), type, is_reduction(c) ? "sum" : "none",
                    c == Collective::Broadcast ? Setup::kRoot : -1, r.us, r.algbw, r.busbw,
                    static_cast<long long>(r.wrong));
        std::fflush(stdout);
      }
    }
    if (printer) std::printf("# Avg bus bandwidth    : %.3f GB/s\n#\n", rows ? busbw_sum / rows : 0.0);
  }
  if (printer) std::printf("# %lld wrong results\n", static_cast<long long>(wrong_total));
  return wrong_total == 0 ? 0 : 1;
}

}  // namespace so::bench
