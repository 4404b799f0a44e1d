// so_bench link: host <-> device copy bandwidth per direction and chunk size, from pinned and from
// pageable host memory, on the backend's D2H and H2D streams (the ones the offload pipeline uses),
// timed by stream events. Each row copies the whole buffer (--max-bytes) in chunks of one size, as
// nvbandwidth does, so a row is comparable with its numbers. On the CPU backend both "directions"
// are memcpy through the stream threads.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "bench/bench_commands.h"
#include "so/backend/backend.h"
#include "so/backend/host_buffer.h"
#include "so/core/error.h"

namespace so::bench {

namespace po = boost::program_options;

namespace {

// Median seconds of `iters` timed runs (after `warmup`) of work enqueued on stream s.
double time_stream(Backend& be, Stream& s, int warmup, int iters, const std::function<void()>& enqueue) {
  std::vector<double> t;
  for (int i = 0; i < warmup + iters; ++i) {
    std::unique_ptr<Event> a = be.create_event(), b = be.create_event();
    be.record(*a, s);
    enqueue();
    be.record(*b, s);
    const double dt = be.event_time(*b) - be.event_time(*a);
    if (i >= warmup) t.push_back(dt);
  }
  std::sort(t.begin(), t.end());
  return std::max(t[t.size() / 2], 1e-12);
}

}  // namespace

int link_bench(int argc, char** argv, Communicator& comm) {
  po::options_description desc("so_bench link options");
  std::string min_arg = "4K", max_arg = "256M", backend_arg = "auto", memory_arg = "pinned,pageable";
  int factor = 4, iters = 5, warmup = 2, device = -1;
  desc.add_options()("help,h", "show this help")("min-bytes", po::value<std::string>(&min_arg)->default_value(min_arg),
                                                 "smallest chunk (suffix K, M, G)")(
      "max-bytes", po::value<std::string>(&max_arg)->default_value(max_arg),
      "largest chunk, and the bytes every row copies in total")(
      "step-factor", po::value<int>(&factor)->default_value(factor), "each chunk size is the previous times this")(
      "iters", po::value<int>(&iters)->default_value(iters), "timed iterations per row (the median is reported)")(
      "warmup", po::value<int>(&warmup)->default_value(warmup), "untimed iterations first")(
      "memory", po::value<std::string>(&memory_arg)->default_value(memory_arg),
      "host memory kinds: pinned, pageable, or both (comma-separated)")(
      "backend", po::value<std::string>(&backend_arg)->default_value(backend_arg), "auto, cpu or cuda")(
      "device", po::value<int>(&device)->default_value(device), "CUDA device ordinal (-1: the first)");
  po::variables_map vm;
  if (!parse_command_line(desc, argc, argv, vm)) return 0;
  const int64_t min_bytes = parse_bytes(min_arg, "--min-bytes"), max_bytes = parse_bytes(max_arg, "--max-bytes");
  SO_CHECK(min_bytes <= max_bytes, "--min-bytes ", min_bytes, " is above --max-bytes ", max_bytes);
  SO_CHECK(factor >= 2, "--step-factor must be at least 2, got ", factor);
  SO_CHECK(iters >= 1 && warmup >= 0, "--iters must be >= 1 and --warmup >= 0");
  SO_CHECK(memory_arg == "pinned" || memory_arg == "pageable" || memory_arg == "pinned,pageable" ||
               memory_arg == "pageable,pinned",
           "--memory is '", memory_arg, "'; choose pinned, pageable or pinned,pageable");
  SO_CHECK(backend_arg == "auto" || backend_arg == "cpu" || backend_arg == "cuda", "--backend is '", backend_arg,
           "'; choose auto, cpu or cuda");
  if (comm.rank() != 0) return 0;
  BackendOptions bo;
  bo.type = backend_arg;
  bo.device = device;
  std::unique_ptr<Backend> be = create_backend(bo);

  const auto bytes = static_cast<size_t>(max_bytes);
  DeviceBuffer dev = be->alloc(bytes, "link probe (device)");
  HostBuffer pinned(bytes, -1, be.get(), "link probe (pinned host)");
  std::vector<char> pageable(bytes, 1);  // plain malloc'd memory, touched
  std::printf(
      "# so_bench link: backend %s, %lld bytes copied per row in chunks, median of %d (+%d warm-up), "
      "event-timed on the D2H / H2D streams\n",
      be->name().c_str(), static_cast<long long>(max_bytes), iters, warmup);
  std::printf("#%12s %9s %8s %10s %10s\n", "chunk (B)", "memory", "chunks", "h2d GB/s", "d2h GB/s");
  Stream& h2d = be->stream(StreamKind::H2D);
  Stream& d2h = be->stream(StreamKind::D2H);
  for (const char* kind : {"pinned", "pageable"}) {
    if (memory_arg.find(kind) == std::string::npos) continue;
    char* host = std::strcmp(kind, "pinned") == 0 ? pinned.as<char>() : pageable.data();
    for (int64_t chunk = min_bytes; chunk <= max_bytes; chunk *= factor) {
      const int64_t chunks = max_bytes / chunk;
      auto copies = [&](bool up, Stream& s) {
        for (int64_t c = 0; c < chunks; ++c) {
          char* d = dev.as<char>() + c * chunk;
          char* h = host + c * chunk;
          up ? be->copy_h2d(d, h, chunk, s) : be->copy_d2h(h, d, chunk, s);
        }
      };
      const double moved = static_cast<double>(chunks * chunk);
      const double t_up = time_stream(*be, h2d, warmup, iters, [&] { copies(true, h2d); });
      const double t_down = time_stream(*be, d2h, warmup, iters, [&] { copies(false, d2h); });
      std::printf(" %12lld %9s %8lld %10.2f %10.2f\n", static_cast<long long>(chunk), kind,
                  static_cast<long long>(chunks), moved / t_up / 1e9, moved / t_down / 1e9);
      std::fflush(stdout);
      if (chunk > max_bytes / factor) break;
    }
  }
  std::printf(
      "# the offload pipeline copies one bucket per transfer from pinned memory (so_train prints what it "
      "measured at start-up: 'casting: link measured with ...')\n");
  return 0;
}

}  // namespace so::bench
