// so_train against PyTorch/Transformers: the fixtures in fixtures/ were written by
// make_fixtures.py (LlamaForCausalLM / Qwen3ForCausalLM, fp32, eager attention). Loss, logits,
// every parameter gradient and a 10-step AdamW run must match, on the CPU backend (Transformers/*)
// and on the CUDA backend (TransformersCuda/*, skipped without a CUDA device).
#include <gtest/gtest.h>

#include <fstream>
#include <numeric>

#include <nlohmann/json.hpp>

#include "parallel/communicator.h"
#include "so/engine/engine.h"
#include "so/io/hdf5_file.h"
#include "so/model/decoder_model.h"
#include "tests/reference/reference_fixture.h"
#include "tests/test_util.h"
#ifdef SO_HAVE_CUDA
#include "src/backend/cuda/cuda_cast.h"
#endif

namespace so {
namespace {

// Tolerances, fp32: the bounds. bf16: storage rounding of weights and activations
// (8 mantissa bits, relative step 2^-8 = 0.4%) compounds through the layers; bounds measured
// on these fixtures (worst: loss 2.3e-4, gradient 2.5e-2) with margin; see docs/testing.md.
struct Tolerance {
  double loss, logits, grad, train_loss;
};
// fp32 on the CPU: the 1e-5 for loss, logits and every gradient (measured worst: loss
// 1.9e-7, gradient 1.4e-6 over 15 cases).
constexpr Tolerance kF32{1e-5, 1e-5, 1e-5, 1e-4};
constexpr Tolerance kBF16{2e-3, 3e-2, 6e-2, 2e-3};
// CUDA: fp32 ops compute in fp32 (no TF32); the earlier fp32 bounds stand until measured on a GPU
// with these fixtures. bf16: flash attention also
// rounds the softmax probabilities (and dS in backward) to bf16 before its matmuls, which the CPU
// does not; 1.5x the CPU's bf16 bounds (not yet measured on a GPU).
constexpr Tolerance kBF16Cuda{3e-3, 4.5e-2, 9e-2, 3e-3};
constexpr Tolerance kF32Cuda{1e-5, 1e-4, 1e-4, 1e-4};

// PyTorch's own bf16 error against its fp32 on a fixture (fixtures/torch_bf16_error.json).
struct TorchBf16Error {
  double logits, worst_grad;
  std::string worst_grad_name;
};
TorchBf16Error torch_bf16_error(const std::string& fixture) {
  const std::string path = std::string(SO_FIXTURE_DIR) + "/torch_bf16_error.json";
  std::ifstream in(path);
  SO_CHECK(in, "cannot open ", path, " (written by tests/reference/make_torch_bf16_error.py)");
  const nlohmann::json j = nlohmann::json::parse(in);
  SO_CHECK(j["fixtures"].contains(fixture), path, " has no entry for ", fixture,
           ": add it to make_torch_bf16_error.py's BF16_FIXTURES and run it");
  const nlohmann::json& f = j["fixtures"][fixture];
  return {f["logits"].get<double>(), f["worst_grad"].get<double>(), f["worst_grad_name"].get<std::string>()};
}

bool cuda_available() {
#ifdef SO_HAVE_CUDA
  return cuda::device_count() > 0;
#else
  return false;
#endif
}

struct Case {
  std::string fixture;
  DType dtype;
  bool checkpointing;
  int64_t loss_chunk;
  int64_t loss_grad_chunk = 0;  // tokens per lm_head weight-gradient GEMM (0: the model's choice)
  std::string backend = "cpu";  // explicit: "auto" would pick the GPU where there is one
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  return info.param.fixture + "_" + dtype_name(info.param.dtype) + (info.param.checkpointing ? "_ckpt" : "") +
         (info.param.loss_chunk ? "_chunk" + std::to_string(info.param.loss_chunk) : "") +
         (info.param.loss_grad_chunk ? "_grad" + std::to_string(info.param.loss_grad_chunk) : "") +
         (info.param.backend == "cpu" ? "" : "_" + info.param.backend);
}
void PrintTo(const Case& c, std::ostream* os) { *os << case_name({c, 0}); }

class ReferenceTest : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (GetParam().backend == "cuda" && !cuda_available()) GTEST_SKIP() << "no CUDA device";
    comm_ = make_mpi_world_communicator();
    BackendOptions bo;
    bo.type = GetParam().backend;
    backend_ = create_backend(bo);
    fx_ = std::make_unique<Fixture>(open_fixture(GetParam().fixture));
    ModelOptions mo;
    mo.dtype = GetParam().dtype;
    mo.micro_batch = fx_->B;
    mo.seq_len = fx_->S;
    mo.activation_checkpointing = GetParam().checkpointing;
    mo.loss_chunk_tokens = GetParam().loss_chunk;
    mo.loss_grad_chunk_tokens = GetParam().loss_grad_chunk;
    model_ = std::make_unique<DecoderModel>(*backend_, fx_->cfg, mo);
  }
  Tolerance tol() const {
    if (GetParam().dtype == DType::F32) return GetParam().backend == "cuda" ? kF32Cuda : kF32;
    return GetParam().backend == "cuda" ? kBF16Cuda : kBF16;
  }

  std::unique_ptr<Engine> make_engine(const AdamWParams& adam, float clip, const std::string& weights_group) {
    EngineOptions eo;
    eo.dtype = GetParam().dtype;
    eo.bucket_size = 5000;  // several buckets even for these tiny models
    eo.adam = adam;
    eo.grad_clip = clip;
    auto engine = std::make_unique<Engine>(*backend_, model_->layout(), eo, *comm_);
    for (const std::string& name : fx_->file.members(weights_group)) {
      const int id = model_->layout().find(name);
      EXPECT_GE(id, 0) << "fixture parameter " << name << " has no counterpart in so_train's layout";
      if (id >= 0)
        engine->load_weight(id, fx_->file.read_f32(weights_group + "/" + name, model_->layout().params[id].shape));
    }
    EXPECT_EQ(fx_->file.members(weights_group).size(), model_->layout().params.size());
    return engine;
  }

  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Fixture> fx_;
  std::unique_ptr<DecoderModel> model_;
};

TEST_P(ReferenceTest, LossLogitsAndEveryGradient) {
  auto engine = make_engine(AdamWParams{}, 0.0f, "/weights");
  const int64_t T = fx_->B * fx_->S;
  engine->begin_step(0.0f);
  model_->zero_loss();
  model_->forward_backward(fixture_batch(*fx_), *engine, *engine, 1.0f / static_cast<float>(T), true);
  const float loss = model_->read_loss();
  const float ref_loss = fx_->file.read_f32("/loss", {1})[0];
  EXPECT_LE(std::abs(loss - ref_loss) / ref_loss, tol().loss) << "loss " << loss << " vs torch " << ref_loss;
  RecordProperty("loss_rel_error", std::to_string(std::abs(loss - ref_loss) / ref_loss));

  // Logits of the first 4 positions: hn @ W_out^T computed through the backend's GEMM.
  const ModelConfig& c = fx_->cfg;
  const int64_t V = c.vocab_size, H = c.hidden_size, K = 4;
  const std::vector<float> hn = test::download(*backend_, model_->final_hidden(), T * H, GetParam().dtype);
  const std::vector<float> w_out = engine->read_weight(model_->layout().lm_head);
  const std::vector<float> ref_logits = fx_->file.read_f32("/logits", {fx_->B, K, V});
  std::vector<float> logits;
  for (int64_t b = 0; b < fx_->B; ++b)
    for (int64_t t = 0; t < K; ++t)
      for (int64_t v = 0; v < V; ++v) {
        double acc = 0;
        for (int64_t h = 0; h < H; ++h) acc += double(hn[(b * fx_->S + t) * H + h]) * w_out[v * H + h];
        logits.push_back(static_cast<float>(acc));
      }
  const double logits_err = test::rel_error(logits, ref_logits);
  EXPECT_LE(logits_err, tol().logits);

  double worst = 0;
  std::string worst_name;
  for (const std::string& name : fx_->file.members("/grads")) {
    const int id = model_->layout().find(name);
    ASSERT_GE(id, 0) << name;
    const double err =
        test::rel_error(engine->read_grad(id), fx_->file.read_f32("/grads/" + name, model_->layout().params[id].shape));
    EXPECT_LE(err, tol().grad) << "gradient of " << name;
    if (err > worst) worst = err, worst_name = name;
  }
  std::printf("[%s] loss %.7f (torch %.7f, rel %.2e); logits rel error %.2e; worst gradient rel error %.2e (%s)\n",
              case_name({GetParam(), 0}).c_str(), loss, ref_loss, std::abs(loss - ref_loss) / ref_loss, logits_err,
              worst, worst_name.c_str());
  if (GetParam().dtype == DType::BF16 && GetParam().backend == "cpu") {
    // bf16 against fp32 has a floor that no implementation passes: PyTorch's own bf16 run of the
    // same fixture (make_torch_bf16_error.py) lands at 1.8e-2..3.8e-1 on the worst gradient. Ours
    // must be at least as close to fp32 as it, on the logits and on the worst gradient. (The loss's
    // error is a sum of cancelling roundings, 1e-5..6e-4 on either side: not compared.)
    const TorchBf16Error torch_bf16 = torch_bf16_error(GetParam().fixture);
    EXPECT_LE(logits_err, torch_bf16.logits) << "logits further from fp32 than PyTorch's bf16";
    EXPECT_LE(worst, torch_bf16.worst_grad) << "worst gradient (" << worst_name << ") further from fp32 than PyTorch's "
                                            << "bf16 (" << torch_bf16.worst_grad_name << ")";
    std::printf("[%s] PyTorch bf16 vs fp32: logits %.2e, worst gradient %.2e (%s)\n",
                case_name({GetParam(), 0}).c_str(), torch_bf16.logits, torch_bf16.worst_grad,
                torch_bf16.worst_grad_name.c_str());
  }
}

TEST_P(ReferenceTest, TenAdamWStepsMatchTorch) {
  const H5File& f = fx_->file;
  const AdamWParams adam = read_adamw_params(f, "/train");
  const double lr = f.read_double_attr("/train", "lr");
  const float clip = static_cast<float>(f.read_double_attr("/train", "grad_clip"));
  auto engine = make_engine(adam, clip, "/weights");

  const int64_t steps = f.read_int_attr("/train", "steps"), per = fx_->B * (fx_->S + 1);
  const std::vector<int32_t> ids = f.read_i32("/train/input_ids", {steps, fx_->B, fx_->S + 1});
  const std::vector<float> ref_losses = f.read_f32("/train/losses", {steps});
  const std::vector<float> ref_norms = f.read_f32("/train/grad_norms", {steps});
  std::vector<float> losses;
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<int32_t> step_ids(ids.begin() + s * per, ids.begin() + (s + 1) * per);
    engine->begin_step(lr);
    model_->zero_loss();
    model_->forward_backward(to_batch(step_ids, fx_->B, fx_->S), *engine, *engine,
                             1.0f / static_cast<float>(fx_->B * fx_->S), true);
    losses.push_back(model_->read_loss());
    engine->end_step();
    const StepResult r = engine->step_result();
    ASSERT_FALSE(r.skipped);
    // After the first step the weights carry AdamW's amplified round-off (below), which the
    // next gradients see: 5x the bound from then on (seen at step 7 of gpt_oss_window_sinks:
    // 1.3e-5 with q, k and v projected by three GEMMs, 3.0e-5 with one, whose dh sums in another
    // order; step 1, before any update, stays within the bound itself).
    EXPECT_NEAR(r.grad_norm, ref_norms[s], tol().grad * (s == 0 ? 1 : 5) * ref_norms[s]) << "step " << s;
  }
  for (int64_t s = 0; s < steps; ++s)
    EXPECT_LE(std::abs(losses[s] - ref_losses[s]) / ref_losses[s], tol().train_loss) << "step " << s;
  // Final weights after 10 steps (fp32 only: bf16 rounding of the device copy is a separate path).
  if (GetParam().dtype == DType::F32) {
    for (const std::string& name : f.members("/train/final_weights")) {
      const int id = model_->layout().find(name);
      const std::vector<float> got = engine->read_weight(id),
                               want = f.read_f32("/train/final_weights/" + name, model_->layout().params[id].shape);
      if (!name.ends_with("k_proj.bias")) {
        // AdamW divides each element's step by its own gradient history, so an element whose
        // gradients are near zero (round-off on both sides) takes steps of round-off-dependent
        // size: a few such elements may differ by up to the steps' total, lr x steps (MoE fixtures:
        // an expert's weights see only its tokens, an embedding row only its token; seen: one
        // element in 4096 off by 0.5 lr). All others must agree within 1e-4 relative.
        std::vector<float> g_rest, w_rest;
        size_t outliers = 0;
        const double rms = std::sqrt(std::inner_product(want.begin(), want.end(), want.begin(), 0.0) / want.size());
        for (size_t i = 0; i < got.size(); ++i) {
          const double d = std::abs(double(got[i]) - want[i]);
          if (d > 1e-3 * rms) {
            ++outliers;
            EXPECT_LE(d, lr * steps) << name << "[" << i << "]";
          } else {
            g_rest.push_back(got[i]), w_rest.push_back(want[i]);
          }
        }
        EXPECT_LE(outliers, std::max<size_t>(1, got.size() / 1000)) << name << ": elements off by more than 1e-3 rms";
        EXPECT_LE(test::rel_error(g_rest, w_rest), 1e-4) << name;
        continue;
      }
      // k_proj's bias reaches the scores only through RoPE's turn of it: on pairs that barely
      // turn over the sequence (large rope_theta) it adds the same q.b to every score of a query,
      // which softmax ignores, so its gradient there is rounding noise that AdamW turns into steps
      // of up to lr of either sign. Both sides may only have moved it that far from each other.
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_LE(std::abs(got[i] - want[i]), 2.0 * lr * steps) << name << "[" << i << "]";
    }
  }
  std::printf("[%s] 10-step losses: first %.6f (torch %.6f), last %.6f (torch %.6f)\n",
              case_name({GetParam(), 0}).c_str(), losses.front(), ref_losses.front(), losses.back(), ref_losses.back());
}

// The same cases on each backend.
std::vector<Case> cases_on(const std::string& backend) {
  // A table, two cases a row.
  // clang-format off
  std::vector<Case> cases = {{"llama_gqa_untied", DType::F32, false, 0}, {"llama_tied_mqa", DType::F32, false, 0},
                             {"qwen3_tied", DType::F32, false, 0},       {"llama_gqa_untied", DType::F32, true, 5},
                             {"qwen3_tied", DType::F32, true, 7, 21},    {"llama_gqa_untied", DType::BF16, false, 0},
                             {"llama_tied_mqa", DType::BF16, true, 0},   {"qwen3_tied", DType::BF16, false, 0},
                             {"llama_rope_llama3", DType::F32, false, 0}, {"llama_rope_yarn", DType::F32, true, 0},
                             {"qwen2_gqa_untied", DType::F32, false, 0},  {"qwen2_tied_mqa_qdim", DType::F32, true, 5},
                             {"llama_attention_bias", DType::F32, false, 0}, {"mistral_window", DType::F32, false, 0},
                             {"qwen2_gqa_untied", DType::BF16, false, 0},  {"phi3_gqa_pad", DType::F32, false, 0},
                             {"phi3_gqa_pad", DType::F32, true, 9, 20},   {"llama_tied_pad", DType::F32, false, 0},
                             {"seed_oss_qdim_bias", DType::F32, false, 0},
                             {"seed_oss_qdim_bias", DType::BF16, true, 0},
                             // Windows shorter than the sequence; packed rows (documents alone).
                             {"mistral_window_short", DType::F32, false, 0}, {"mistral_window_short", DType::F32, true, 0},
                             {"qwen2_sliding_layers", DType::F32, false, 0}, {"qwen2_sliding_layers", DType::F32, true, 6},
                             {"llama_packed", DType::F32, false, 0},         {"llama_packed", DType::F32, true, 0},
                             {"mistral_packed_window", DType::F32, false, 0}, {"mistral_packed_window", DType::F32, true, 0},
                             {"mistral_window_short", DType::BF16, false, 0}, {"llama_packed", DType::BF16, true, 0},
                             // Sinks as a parameter (packed rows too), their gradient among the others.
                             {"llama_sinks", DType::F32, false, 0},          {"llama_sinks", DType::F32, true, 0},
                             // Mixture of experts (Qwen3-MoE), dense and MoE layers.
                             {"qwen3_moe_mixed", DType::F32, false, 0},   {"qwen3_moe_mixed", DType::F32, true, 0},
                             {"gpt_oss_window_sinks", DType::F32, false, 0}, {"gpt_oss_window_sinks", DType::F32, true, 0},
                             // The load-balancing loss (output_router_logits), with and without recompute.
                             {"qwen3_moe_aux", DType::F32, false, 0},     {"qwen3_moe_aux", DType::F32, true, 0},
                             {"gpt_oss_aux", DType::F32, false, 0},       {"gpt_oss_aux", DType::F32, true, 0},
                             // Qwen3-MoE in bf16: a router whose top-2 choices are clear of bf16 rounding.
                             {"qwen3_moe_routed", DType::F32, false, 0},  {"qwen3_moe_routed", DType::BF16, false, 0},
                             {"qwen3_moe_routed", DType::BF16, true, 0}};
  // clang-format on
  for (Case& c : cases) c.backend = backend;
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Transformers, ReferenceTest, testing::ValuesIn(cases_on("cpu")), case_name);
INSTANTIATE_TEST_SUITE_P(TransformersCuda, ReferenceTest, testing::ValuesIn(cases_on("cuda")), case_name);

}  // namespace
}  // namespace so
