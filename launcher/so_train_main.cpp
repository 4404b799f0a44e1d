// so_train: the training binary. Launch directly, or under mpirun / srun (docs/launching.md).
//   so_train --config FILE [--model DIR|config.json] [--data FILE --seq-len N] [--steps N]
//            [--set key.path=value ...] [--metrics FILE] [--tensorboard DIR] [--trace FILE]
//            [--bind auto|none] [--bind-core-list LIST] [--print-binding]
#include <algorithm>
#include <charconv>
#include <boost/program_options.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "launcher/node_ranks.h"
#include "launcher/rank_binding.h"
#include "parallel/communicator.h"
#include "so/core/error.h"
#include "so/core/log.h"
#include "so/data/prepared_data.h"
#include "so/train/memory_plan.h"
#include "so/train/trainer.h"

namespace po = boost::program_options;

namespace {

int run(int argc, char** argv, so::MpiSession& mpi) {
  po::options_description desc("so_train options");
  std::string config, metrics, tensorboard, trace, bind_mode, bind_core_list, model, data;
  std::vector<std::string> sets;
  int64_t steps = 0, seq_len = 0;
  std::string save_dir, resume, async_save, profile_steps;
  int64_t save_every = 0;
  int keep = 3;
  std::string plan_machine, plan_json;
  int plan_ranks = 0;
  double plan_host_gib = 0;
  desc.add_options()("help,h", "show this help")(
      "config,c", po::value<std::string>(&config),
      "run config (JSON): a DeepSpeed config as it is, plus so_train's model/data/train/backend sections")(
      "deepspeed_config", po::value<std::string>(&config), "the same as --config (DeepSpeed's flag)")(
      "model", po::value<std::string>(&model),
      "the model: a Hugging Face model directory (weights and config.json) or a config.json (random weights); "
      "replaces the config's model section")(
      "data", po::value<std::string>(&data),
      "training data: a .txt file (bytes as tokens), .h5/.hdf5 (dataset 'tokens') or a token file (docs/configs.md); "
      "replaces data.type and data.path")("seq-len", po::value<int64_t>(&seq_len),
                                          "tokens per sequence (data.seq_len)")(
      "steps", po::value<int64_t>(&steps), "number of optimizer steps (overrides train.steps)")(
      "set", po::value<std::vector<std::string>>(&sets)->composing(),
      "override a config value: --set optimizer.params.lr=3e-4 (repeatable)")(
      "metrics", po::value<std::string>(&metrics), "append one JSON line per step to this file")(
      "tensorboard", po::value<std::string>(&tensorboard),
      "write TensorBoard event files to DIR/<tensorboard.job_name>/ (sets tensorboard.enabled and "
      "tensorboard.output_path)")(
      "quiet,q",
      "short logs: no start-up notes (warnings and errors only) and short step lines (progress, loss, lr, "
      "norm, throughput, ETA) every steps_per_print steps")(
      "trace", po::value<std::string>(&trace),
      "write a Chrome/Perfetto trace (compute, D2H, H2D and CPU-optimizer lanes, per bucket) to this file")(
      "profile-steps", po::value<std::string>(&profile_steps),
      "A:B: steps A..B between cudaProfilerStart and Stop, the device idle before and after (for nsys profile "
      "--capture-range=cudaProfilerApi; jobs/local/kernel_split.py splits the kernels by op class)")(
      "bind", po::value<std::string>(&bind_mode)->default_value("auto"),
      "auto: bind each rank to its GPU's NUMA node (no GPU: spread ranks over NUMA nodes) and its share of that "
      "node's cores, host memory there; none: leave the process as launched")(
      "bind-core-list", po::value<std::string>(&bind_core_list),
      "hand out only these CPUs to the node's ranks, e.g. 0-63,72-135 (like DeepSpeed's --bind_core_list)")(
      "print-binding", "bind, print every rank's binding (rank 0, one line per rank) and exit without training")(
      "save-dir", po::value<std::string>(&save_dir),
      "write HDF5 checkpoints here (atomically, with a `latest` pointer); also on SIGTERM/SIGUSR1")(
      "save-every", po::value<int64_t>(&save_every), "checkpoint every N steps (needs --save-dir)")(
      "save-at-end", "checkpoint after the last step too (needs --save-dir)")(
      "keep", po::value<int>(&keep)->default_value(3), "checkpoints to keep in --save-dir")(
      "async-save", po::value<std::string>(&async_save)->default_value("on"),
      "on: training goes on while a checkpoint is written (committed when every rank is done); off: wait for it")(
      "resume", po::value<std::string>(&resume), "resume from a checkpoint file, or the `latest` one of a directory")(
      "plan",
      "print the memory plan of this run (device and host bytes per rank, term by term, whether they fit, the "
      "largest sequence length that would) and exit without training")(
      "plan-machine", po::value<std::string>(&plan_machine)->default_value("this"),
      "with --plan: this (the backend the config selects, with its capacity), gh200-96, gh200-144 or h100-80")(
      "plan-ranks", po::value<int>(&plan_ranks), "with --plan: plan for this many ranks (default: the ranks launched)")(
      "plan-host-gib", po::value<double>(&plan_host_gib),
      "with --plan: host memory per rank in GiB (default: the profile's)")(
      "plan-json", po::value<std::string>(&plan_json),
      "with --plan: also write the run's description for the performance model (jobs/sweeps/perf_model.py) here");
  po::variables_map vm;
  try {
    const po::parsed_options parsed = po::command_line_parser(argc, argv).options(desc).run();
    const std::vector<std::string> stray = po::collect_unrecognized(parsed.options, po::include_positional);
    if (!stray.empty()) throw so::Error("command line: '" + stray.front() + "' is not an option (see --help)");
    po::store(parsed, vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw so::Error(std::string("command line: ") + e.what() + " (see --help)");
  }
  if (vm.count("help")) {
    if (mpi.world_rank() == 0) std::cout << desc << "\n";
    return 0;
  }
  if (vm.count("quiet")) so::set_log_level(so::LogLevel::Warn);
  const bool print_binding = vm.count("print-binding") > 0;
  if (config.empty() && !print_binding) throw so::Error("command line: --config FILE is required (see --help)");
  const so::BindOptions bind = so::parse_bind_options(bind_mode, bind_core_list);

  // Without a config (--print-binding alone): the defaults, i.e. backend auto and no optimizer pool.
  so::RunConfig cfg;
  if (!config.empty()) {
    nlohmann::json doc = so::load_json_file(config);
    // A DeepSpeed config names neither model nor data: these flags supply them.
    if (!model.empty() && doc.is_object())
      doc["model"] =
          std::filesystem::is_directory(model) ? nlohmann::json{{"hf_dir", model}} : nlohmann::json{{"config", model}};
    if (!data.empty() && doc.is_object()) {
      const std::string ext = std::filesystem::path(data).extension().string();
      if (!doc.contains("data") || !doc["data"].is_object()) doc["data"] = nlohmann::json::object();
      doc["data"]["type"] = ext == ".txt"                    ? "text"
                            : ext != ".h5" && ext != ".hdf5" ? "tokens"
                            : so::is_prepared_file(data)     ? "prepared"
                                                             : "hdf5";
      doc["data"]["path"] = data;
    }
    if (vm.count("seq-len")) so::apply_override(doc, "data.seq_len=" + std::to_string(seq_len));
    for (const std::string& s : sets) so::apply_override(doc, s);
    if (vm.count("steps")) so::apply_override(doc, "train.steps=" + std::to_string(steps));
    // A plan does not depend on how long the run is: --plan needs no step count.
    if (vm.count("plan") && doc.is_object() &&
        !(doc.contains("train") && doc["train"].is_object() &&
          (doc["train"].contains("steps") || doc["train"].contains("num_train_epochs"))))
      so::apply_override(doc, "train.steps=1");
    if (!tensorboard.empty() && doc.is_object()) {
      if (!doc.contains("tensorboard") || !doc["tensorboard"].is_object())
        doc["tensorboard"] = nlohmann::json::object();
      doc["tensorboard"]["enabled"] = true;
      doc["tensorboard"]["output_path"] = tensorboard;
    }
    cfg = so::parse_run_config(doc, config);
  }

  if (async_save != "on" && async_save != "off")
    throw so::Error("command line: --async-save is '" + async_save + "'; choose on or off");
  if (vm.count("plan")) {
    if (config.empty()) throw so::Error("command line: --plan needs --config FILE");
    const int ranks = vm.count("plan-ranks") ? plan_ranks : mpi.world_size();
    if (ranks < 1) throw so::Error("command line: --plan-ranks must be at least 1");
    if (!(plan_host_gib >= 0 && plan_host_gib <= 1e9))
      throw so::Error(so::str_cat("command line: --plan-host-gib is ", plan_host_gib, "; give GiB in [0, 1e9]"));
    if (!plan_json.empty() && std::filesystem::exists(plan_json) && !std::filesystem::is_regular_file(plan_json))
      throw so::Error("command line: --plan-json '" + plan_json + "' exists and is not a regular file");
    const size_t host_bytes = static_cast<size_t>(plan_host_gib * (1 << 30));
    std::unique_ptr<so::Backend> backend;
    so::MachineProfile machine;
    if (plan_machine == "this") {
      backend = so::create_backend(cfg.backend);
      machine = so::machine_profile_of(*backend);
      machine.host_bytes = host_bytes;
      so::measure_offload_link(machine, cfg, ranks, 0, {});
    } else {
      machine = so::machine_profile(plan_machine, host_bytes);
      machine.deterministic_attention = cfg.backend.deterministic_attention;
    }
    const std::string chosen = so::resolve_auto_memory(cfg, ranks, machine);
    const so::MemoryPlan plan = so::plan_memory(cfg, ranks, 0, machine, !save_dir.empty() && async_save == "on");
    if (mpi.world_rank() == 0) {
      std::printf("%s%s", chosen.empty() ? "" : (chosen + "\n").c_str(),
                  so::format_plan(cfg, ranks, plan, machine).c_str());
      if (!plan_json.empty()) {
        std::ofstream f(plan_json);
        f << so::plan_json(cfg, ranks, plan).dump(2) << "\n";
        if (!f.good()) throw so::Error("cannot write --plan-json file '" + plan_json + "'");
      }
    }
    return 0;
  }

  // Before train(): it splits the cores this binding leaves the process (process_cores()).
  const double optimizer_fraction = cfg.offload.mode != so::OffloadMode::None ? cfg.offload.cpu_cores_fraction : 0.0;
  const so::RankBinding binding = so::bind_this_rank(bind, cfg.backend.type, optimizer_fraction);
  if (print_binding) {
    for (const std::string& line : so::gather_at_root(binding.description)) std::printf("%s\n", line.c_str());
    return 0;
  }
  so::log_info("binding: " + binding.description);
  // The placement decides: "auto" drives GPUs only where every local rank got one.
  if (cfg.backend.type == "auto") cfg.backend.type = binding.gpu >= 0 ? "cuda" : "cpu";
  if (cfg.backend.device < 0) cfg.backend.device = binding.gpu;

  auto comm = so::make_mpi_world_communicator();
  so::TrainOptions opts;
  opts.metrics_path = metrics;
  if (cfg.wandb.enabled && metrics.empty())
    throw so::Error(
        "command line: wandb.enabled is true but there is no --metrics FILE: scripts/wandb_log.py logs the "
        "run to wandb from that file");
  opts.quiet = vm.count("quiet") > 0;
  opts.trace_path = trace;
  if (save_every < 0) throw so::Error("command line: --save-every must not be negative");
  if (save_every > 0 && save_dir.empty()) throw so::Error("command line: --save-every needs --save-dir");
  if (keep < 1) throw so::Error("command line: --keep must be at least 1");
  opts.save_dir = save_dir;
  opts.save_every = save_every;
  opts.save_at_end = vm.count("save-at-end") > 0;
  if (opts.save_at_end && save_dir.empty()) throw so::Error("command line: --save-at-end needs --save-dir");
  opts.async_save = async_save == "on";
  opts.keep = keep;
  opts.resume = resume;
  if (vm.count("profile-steps")) {
    // Both numbers whole, in range, nothing else: from_chars refuses signs, spaces and overflow.
    const char* text = profile_steps.data();
    const char* end = text + profile_steps.size();
    const char* colon = std::find(text, end, ':');
    int64_t a = 0, b = 0;
    const auto first = std::from_chars(text, colon, a);
    const auto last = colon == end ? first : std::from_chars(colon + 1, end, b);
    if (colon == end || first.ec != std::errc() || first.ptr != colon || last.ec != std::errc() || last.ptr != end ||
        a < 1 || b < a)
      throw so::Error("command line: --profile-steps is '" + profile_steps + "'; give A:B with 1 <= A <= B");
    opts.profile_first = a, opts.profile_last = b;
  }
  const so::TrainSummary s = so::train(cfg, *comm, opts);
  if (comm->rank() == 0)
    std::printf(
        "done: %lld steps, loss %.4f -> %.4f, mean %.0f tokens/s, exposed optimizer %.2f ms/step "
        "(CPU optimizer busy %.2f ms/step)\n",
        static_cast<long long>(s.steps), s.first_loss, s.last_loss, s.mean_tokens_per_s,
        1e3 * s.mean_exposed_optimizer_s, 1e3 * s.mean_optimizer_busy_s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    so::MpiSession mpi(&argc, &argv);
    try {
      return run(argc, argv, mpi);
    } catch (const std::exception& e) {
      // Name the rank in a job of several, unless the message (SO_CHECK's) already does.
      const std::string msg = e.what();
      const bool named = msg.rfind("[rank ", 0) == 0;
      std::fprintf(stderr, "so_train: error: %s%s\n",
                   mpi.world_size() > 1 && !named ? so::str_cat("[rank ", mpi.world_rank(), "] ").c_str() : "",
                   msg.c_str());
      std::fflush(stderr);
      // Other ranks may be inside a collective: end the whole job rather than leave them waiting.
      if (mpi.world_size() > 1) so::MpiSession::abort_job(1);
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "so_train: error: %s\n", e.what());
    return 1;
  }
}
