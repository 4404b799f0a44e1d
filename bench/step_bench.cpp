// so_bench step: one model, one data stream, several optimizer placements, each trained for the
// same steps by the real trainer (optionally from a checkpoint, so the clipped fraction is that of
// real training, and with clipping forced on every step or off); reports per placement the
// optimizer time the compute lane waited for (exposed), the CPU optimizer's own work, tokens/s,
// the fraction of steps clipped, and exposure as a fraction of ZeRO-Offload's in the same run.
#include <boost/program_options.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench/bench_commands.h"
#include "so/core/error.h"
#include "so/checkpoint/checkpoint.h"
#include "so/train/trainer.h"

namespace so::bench {

namespace po = boost::program_options;

namespace {

struct Placement {
  std::string name;
  OffloadMode mode;
  double ratio;
};

Placement parse_placement(const std::string& spec) {
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  Placement p;
  p.name = spec;
  if (kind == "zero-offload")
    p.mode = OffloadMode::ZeroOffload;
  else if (kind == "superoffload")
    p.mode = OffloadMode::SuperOffload;
  else if (kind == "device")
    p.mode = OffloadMode::None;
  else
    throw Error("--modes: '" + spec + "' must be device, zero-offload[:RATIO] or superoffload[:RATIO]");
  p.ratio = 1.0;
  if (colon != std::string::npos) {
    try {
      p.ratio = std::stod(spec.substr(colon + 1));
    } catch (const std::exception&) {
      throw Error("--modes: ratio in '" + spec + "' is not a number");
    }
  }
  return p;
}

}  // namespace

int step_bench(int argc, char** argv, Communicator& comm) {
  po::options_description desc("so_bench step options");
  std::string config = "configs/runs/bench-step.json", modes = "zero-offload:1,superoffload:1,superoffload:0.9";
  std::string trace_prefix, resume, clip = "config", json_path;
  std::vector<std::string> sets;
  int64_t steps = 0;
  desc.add_options()("help,h", "show this help")("config", po::value<std::string>(&config)->default_value(config),
                                                 "run config (model, data, batch, optimizer)")(
      "modes", po::value<std::string>(&modes)->default_value(modes),
      "comma-separated placements: device, zero-offload[:RATIO], superoffload[:RATIO]")(
      "steps", po::value<int64_t>(&steps), "steps per placement (default: the config's train.steps)")(
      "set", po::value<std::vector<std::string>>(&sets)->composing(), "config override key.path=value (repeatable)")(
      "trace", po::value<std::string>(&trace_prefix), "write PREFIX-<placement>.json Chrome traces")(
      "resume", po::value<std::string>(&resume),
      "start every placement from this checkpoint (file or directory); --steps then counts steps after it")(
      "clip", po::value<std::string>(&clip)->default_value(clip),
      "gradient clipping: config (the config's gradient_clipping), always (threshold 1e-3: every step clips), never")(
      "json", po::value<std::string>(&json_path), "also write the table as one JSON object to this file");
  po::variables_map vm;
  if (!parse_command_line(desc, argc, argv, vm)) return 0;

  std::vector<Placement> placements;
  std::stringstream ss(modes);
  for (std::string item; std::getline(ss, item, ',');) placements.push_back(parse_placement(item));
  SO_CHECK(clip == "config" || clip == "always" || clip == "never", "--clip is '", clip,
           "'; choose config, always or never");
  nlohmann::json doc = load_json_file(config);
  for (const std::string& s : sets) apply_override(doc, s);
  // A threshold below any real gradient norm, so every step clips (the clipped column shows it),
  // but not so small that the scaled gradients become subnormal floats, which the CPU computes on
  // with microcode assists at a fraction of its speed (1e-30 made every CPU step 3x slower).
  if (clip == "always") apply_override(doc, "gradient_clipping=1e-3");
  if (clip == "never") apply_override(doc, "gradient_clipping=0");
  const int64_t start = resume.empty() ? 0 : read_checkpoint_summary(resume).state.iteration;
  // From a checkpoint, the run goes on for --steps (or the config's train.steps) more steps.
  if (!vm.count("steps")) steps = parse_run_config(doc, config).steps;
  apply_override(doc, "train.steps=" + std::to_string(start + steps));

  struct Row {
    std::string name;
    TrainSummary s;
  };
  std::vector<Row> rows;
  for (const Placement& p : placements) {
    RunConfig cfg = parse_run_config(doc, config);
    cfg.offload.mode = p.mode;
    cfg.offload.ratio = p.ratio;
    cfg.offload.device_tail_buckets = -1;
    TrainOptions opts;
    opts.resume = resume;
    if (!trace_prefix.empty()) opts.trace_path = trace_prefix + "-" + p.name + ".json";
    if (comm.rank() == 0) std::printf("# --- %s ---\n", p.name.c_str()), std::fflush(stdout);
    rows.push_back(Row{p.name, train(cfg, comm, opts)});
  }
  if (comm.rank() != 0) return 0;
  const TrainSummary* zero = nullptr;
  for (const Row& r : rows)
    if (r.name.rfind("zero-offload", 0) == 0) zero = &r.s;
  nlohmann::json json_rows = nlohmann::json::array();
  std::printf("\n#%24s %9s %10s %10s %16s %12s %16s\n", "placement", "clipped", "tokens/s", "step ms", "opt exposed ms",
              "opt CPU ms", "exposed/ZeRO-Off");
  for (const Row& r : rows) {
    const std::string clipped = std::to_string(r.s.clipped_steps) + "/" + std::to_string(r.s.steps - start);
    std::printf(" %24s %9s %10.0f %10.2f %16.2f %12.2f", r.name.c_str(), clipped.c_str(), r.s.mean_tokens_per_s,
                1e3 * r.s.mean_step_s, 1e3 * r.s.mean_exposed_optimizer_s, 1e3 * r.s.mean_optimizer_busy_s);
    const bool vs_zero = zero && zero->mean_exposed_optimizer_s > 0;
    const double of_zero = vs_zero ? r.s.mean_exposed_optimizer_s / zero->mean_exposed_optimizer_s : 0.0;
    if (vs_zero)
      std::printf(" %16.3f\n", of_zero);
    else
      std::printf(" %16s\n", "-");
    json_rows.push_back({{"placement", r.name},
                         {"clipped_steps", r.s.clipped_steps},
                         {"steps", r.s.steps - start},
                         {"tokens_per_s", r.s.mean_tokens_per_s},
                         {"step_ms", 1e3 * r.s.mean_step_s},
                         {"exposed_optimizer_ms", 1e3 * r.s.mean_exposed_optimizer_s},
                         {"optimizer_cpu_ms", 1e3 * r.s.mean_optimizer_busy_s},
                         {"exposed_of_zero_offload", vs_zero ? nlohmann::json(of_zero) : nlohmann::json()}});
  }
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << nlohmann::json{{"bench", "step"}, {"config", config}, {"clip", clip}, {"rows", json_rows}}.dump() << "\n";
    SO_CHECK(out.good(), "cannot write '", json_path, "'");
  }
  std::printf(
      "# clipped: steps clipped / steps run (--clip %s%s); means over the steps after each run's first; "
      "targets: SuperOffload never above 1.0x ZeRO-Offload's exposed time\n",
      clip.c_str(), resume.empty() ? "" : str_cat(", from ", resume).c_str());
  return 0;
}

}  // namespace so::bench
