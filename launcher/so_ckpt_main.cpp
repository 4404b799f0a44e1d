// so_ckpt: look into, check and convert so_train checkpoints (docs/checkpoints.md).
//   so_ckpt inspect FILE|DIR           tensors, shapes, training state, config
//   so_ckpt verify FILE|DIR            every checksum and the manifest; exit 0 intact, 1 damaged
//   so_ckpt export --hf OUT FILE|DIR   Hugging Face directory (config.json + safetensors)
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "parallel/communicator.h"
#include "so/core/error.h"
#include "so/model/hf_model.h"
#include "so/checkpoint/checkpoint.h"

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: so_ckpt inspect FILE|DIR\n"
               "       so_ckpt verify FILE|DIR\n"
               "       so_ckpt export --hf OUT_DIR [--dtype bf16|fp32] [--max-shard-size BYTES] FILE|DIR\n");
  return 2;
}

int inspect(const std::string& path) {
  const so::CheckpointSummary c = so::read_checkpoint_summary(path);
  std::printf(
      "%s\n  format version %lld, written by %lld ranks (ZeRO stage %lld)\n  iteration %lld, optimizer steps "
      "%lld, next sample %lld\n",
      c.path.c_str(), static_cast<long long>(c.format_version), static_cast<long long>(c.world_size),
      static_cast<long long>(c.zero_stage), static_cast<long long>(c.state.iteration),
      static_cast<long long>(c.state.steps_taken), static_cast<long long>(c.state.data_position));
  std::printf("  model: %s\n  tensors (each also under /optim/exp_avg and /optim/exp_avg_sq):\n",
              c.model_config.dump().c_str());
  int64_t total = 0;
  for (const nlohmann::json& t : c.manifest) {
    std::printf("    /model/%-50s %-16s %s\n", t["name"].get<std::string>().c_str(), t["shape"].dump().c_str(),
                t["dtype"].get<std::string>().c_str());
    total += t["numel"].get<int64_t>();
  }
  std::printf("  %zu tensors, %lld parameters\n  config: %s\n", c.manifest.size(), static_cast<long long>(total),
              c.config.dump().c_str());
  return 0;
}

int verify(const std::string& path) {
  const std::vector<std::string> problems = so::verify_checkpoint(path);
  for (const std::string& p : problems) std::printf("DAMAGED: %s\n", p.c_str());
  if (problems.empty())
    std::printf("ok: %s (every tensor read, checksums and manifest match)\n", so::resolve_checkpoint(path).c_str());
  return problems.empty() ? 0 : 1;
}

int export_hf(int argc, char** argv) {
  std::string out, path, dtype = "bf16", shard = "0";
  for (int i = 0; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--hf") && i + 1 < argc)
      out = argv[++i];
    else if (!std::strcmp(argv[i], "--dtype") && i + 1 < argc)
      dtype = argv[++i];
    else if (!std::strcmp(argv[i], "--max-shard-size") && i + 1 < argc)
      shard = argv[++i];
    else if (argv[i][0] != '-' && path.empty())
      path = argv[i];
    else
      throw so::Error(std::string("export: unexpected argument '") + argv[i] + "'");
  }
  if (out.empty() || path.empty()) return usage();
  SO_CHECK(dtype == "bf16" || dtype == "fp32", "export: --dtype is '", dtype, "'; choose bf16 or fp32");
  const so::CheckpointReader reader(path);
  const so::CheckpointSummary& c = reader.summary();
  const so::ModelConfig cfg = so::ModelConfig::from_hf_json(c.model_config, c.path + ": model_config");
  const so::ParamLayout layout = so::ParamLayout::for_model(cfg);
  so::HfExportOptions opts;
  opts.dtype = dtype == "bf16" ? so::DType::BF16 : so::DType::F32;
  // Hugging Face's max_shard_size, in bytes: 0 writes one model.safetensors.
  char* end = nullptr;
  errno = 0;
  opts.max_shard_bytes = std::strtoll(shard.c_str(), &end, 10);
  SO_CHECK(errno == 0 && end != shard.c_str() && *end == '\0' && opts.max_shard_bytes >= 0,
           "export: --max-shard-size is '", shard, "'; give a byte count (0 = one file)");
  so::export_hf_model(
      out, cfg, layout, [&](int id) { return reader.tensor("/model/" + layout.params[id].name); }, opts);
  std::printf("exported %s (step %lld) to %s as %s safetensors\n", c.path.c_str(),
              static_cast<long long>(c.state.steps_taken), out.c_str(), dtype.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    so::MpiSession mpi(&argc, &argv);
    if (argc < 3) return usage();
    const std::string cmd = argv[1];
    if (cmd == "inspect" && argc == 3) return inspect(argv[2]);
    if (cmd == "verify" && argc == 3) return verify(argv[2]);
    if (cmd == "export") return export_hf(argc - 2, argv + 2);
    return usage();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "so_ckpt: error: %s\n", e.what());
    return 1;
  }
}
