// so_bench: the project's benchmarks behind one binary, in the spirit of nccl-tests.
//   so_bench <subcommand> [options]      so_bench <subcommand> -h      so_bench -h
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>

#include "bench/bench_commands.h"
#include "so/core/error.h"

namespace so::bench {

namespace po = boost::program_options;

bool parse_command_line(const po::options_description& desc, int argc, char** argv, po::variables_map& vm) {
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    SO_FAIL("command line: ", e.what(), " (see so_bench ", argv[0], " -h)");
  }
  if (!vm.count("help")) return true;
  std::cout << "usage: so_bench " << argv[0] << " [options]\n" << desc << "\n";
  return false;
}

int64_t parse_bytes(const std::string& s, const char* what) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string suffix = used ? s.substr(used) : "";
  const int shift = suffix.empty() ? 0 : suffix == "K" ? 10 : suffix == "M" ? 20 : suffix == "G" ? 30 : -1;
  SO_CHECK(used && v > 0 && shift >= 0 && v <= (INT64_MAX >> shift), what, ": '", s,
           "' is not a positive byte count below 2^63 (optional suffix K, M, G)");
  return v << shift;
}

std::vector<int64_t> parse_list(const std::string& s, const char* what) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    try {
      out.push_back(std::stoll(item));
    } catch (const std::exception&) {
      SO_FAIL(what, ": '", item, "' is not an integer");
    }
    SO_CHECK(out.back() > 0, what, ": ", out.back(), " must be positive");
  }
  return out;
}

DType parse_dtype(const std::string& s, const char* what) {
  if (s == "fp32") return DType::F32;
  if (s == "bf16") return DType::BF16;
  SO_FAIL(what, ": '", s, "' must be fp32 or bf16");
}

namespace {

struct Subcommand {
  const char* name;
  const char* description;
  int (*run)(int argc, char** argv, Communicator& comm);
};

// One row per subcommand.
constexpr Subcommand kSubcommands[] = {
    {"adam",
     "GraceAdam (CPU AdamW) per size vs its roofline (same-stream probe, arithmetic ceiling) and vs torch "
     "and DeepSpeed CPU AdamW",
     adam_bench},
    {"step", "exposed optimizer time per step: ZeRO-Offload vs SuperOffload on the same model and data", step_bench},
    {"ckpt", "HDF5 checkpoint save and load time, file size and bytes/s for a model from random weights", ckpt_bench},
    {"link", "host <-> device copy GB/s per direction and chunk size, pinned and pageable host memory", link_bench},
    {"comm", "collectives' time, algorithm and bus bandwidth per size (nccl-tests' table), results checked",
     comm_bench},
    {"gpu-peaks", "GPU ceilings: bf16 GEMM TFLOP/s (vs the nominal peak) and device copy GB/s, CUDA-event timed",
     gpu_peaks_bench},
    {"calibrate",
     "the performance model's machine profile: GEMM, attention and memory-bound throughputs, link, CPU "
     "Adam and (under mpirun) collectives, as JSON",
     calibrate_bench},
    {"ops", "every op at Llama-1B sizes as a fraction of the measured ceilings; attention up to S = 131072", ops_bench},
    {"attention",
     "causal GQA attention forward/backward TFLOP/s per implementation (our kernels, cuDNN), unpacked "
     "and packed-document rows",
     attention_bench},
};

void print_usage(std::FILE* to) {
  std::fprintf(to, "usage: so_bench <subcommand> [options]   (so_bench <subcommand> -h for its options)\n\n");
  for (const Subcommand& s : kSubcommands) std::fprintf(to, "  %-10s %s\n", s.name, s.description);
}

int run(int argc, char** argv, Communicator& comm) {
  if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")) {
    print_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (const Subcommand& s : kSubcommands)
    if (argv[1] == std::string(s.name)) return s.run(argc - 1, argv + 1, comm);
  std::fprintf(stderr, "so_bench: unknown subcommand '%s'\n\n", argv[1]);
  print_usage(stderr);
  return 2;
}

}  // namespace
}  // namespace so::bench

int main(int argc, char** argv) {
  try {
    so::MpiSession mpi(&argc, &argv);
    try {
      auto comm = so::make_mpi_world_communicator();
      return so::bench::run(argc, argv, *comm);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "so_bench: error: %s\n", e.what());
      std::fflush(stderr);
      if (mpi.world_size() > 1) so::MpiSession::abort_job(1);  // no rank left waiting in a collective
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "so_bench: error: %s\n", e.what());
    return 1;
  }
}
