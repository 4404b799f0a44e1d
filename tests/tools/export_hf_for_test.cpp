// Writes Hugging Face model directories with so_train's exporter for the interop test
// (tests/reference/hf_interop.sh, then check_hf_export.py in transformers). Each fixture of
// MODELS_DIR named below is loaded, trained two AdamW steps in so_train (so the exported weights
// are so_train's, not transformers'), and exported in F32 (one file) and BF16 (sharded). The
// manifest gives so_train's loss of each export on the fixtures' tokens, computed from the
// directory as so_train reads it back.
//
//   export_hf_for_test MODELS_DIR OUT_DIR      (writes OUT_DIR/<model>_<dtype>/, OUT_DIR/manifest.json)
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "so/core/error.h"
#include "so/model/hf_model.h"
#include "tests/reference/model_runner.h"

namespace fs = std::filesystem;

namespace {

void run(const fs::path& models, const fs::path& out) {
  std::ifstream in(models / "reference.json");
  SO_CHECK(in.good(), "cannot open '", (models / "reference.json").string(), "'");
  const std::vector<int32_t> tokens = nlohmann::json::parse(in)["tokens"].get<std::vector<int32_t>>();
  const int64_t seq_len = static_cast<int64_t>(tokens.size()) - 1;
  nlohmann::json manifest = {{"tokens", tokens}, {"exports", nlohmann::json::array()}};
  for (const std::string name : {"llama_untied_fp32", "qwen3_tied_bf16"}) {
    const so::HfModel m = so::load_hf_model((models / name).string());
    so::test::ModelRunner trainer(m.config, seq_len);
    trainer.load(m.values);
    for (int step = 0; step < 2; ++step) trainer.step(tokens, 1e-2f);
    const auto get = [&](int id) { return trainer.engine().read_weight(id); };
    for (const so::HfExportOptions opts : {so::HfExportOptions{so::DType::F32, 0}, so::HfExportOptions{so::DType::BF16, 100'000}}) {
      const std::string dir = name + "_" + so::dtype_name(opts.dtype);
      so::export_hf_model((out / dir).string(), m.config, trainer.layout(), get, opts);
      const so::HfModel back = so::load_hf_model((out / dir).string());
      so::test::ModelRunner runner(back.config, seq_len);
      runner.load(back.values);
      const float loss = runner.step(tokens, 0.0f);
      std::printf("%s: so_train loss %.7f\n", dir.c_str(), loss);
      manifest["exports"].push_back({{"dir", dir}, {"loss", loss}});
    }
  }
  std::ofstream(out / "manifest.json") << manifest.dump(1) << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  so::MpiSession mpi(&argc, &argv);
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s MODELS_DIR OUT_DIR\n", argv[0]);
    return 2;
  }
  try {
    run(argv[1], argv[2]);
  } catch (const so::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
