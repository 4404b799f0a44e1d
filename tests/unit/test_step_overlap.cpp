// The overlapped step: without offloaded buckets the engine validates a step on the device and
// end_step returns without waiting for the device, and the training loop reads each step's figures
// (loss, norm, skip, learning rate) one step late. Both must change nothing but when the host waits:
// the same states and the same logged values as reading everything at once.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "parallel/communicator.h"
#include "so/data/token_source.h"
#include "so/engine/engine.h"
#include "so/model/decoder_model.h"
#include "so/train/run_config.h"
#include "so/train/trainer.h"
#include "tests/optimizer_state.h"
#include "tests/test_util.h"
#include "tests/tiny_training.h"

namespace so {
namespace {

// end_step with the compute and comm streams held behind a gate the host opens only after
// end_step has returned: it must enqueue the validation and the optimizer without waiting for
// either stream (a wait would never return: a watchdog opens the gate after a minute so that the
// failure is reported rather than hung). Then the step's result and state equal those of the same
// steps run without the gate.
TEST(StepOverlap, EndStepWaitsForNoStream) {
  std::unique_ptr<Communicator> comm = make_mpi_world_communicator();
  const ModelConfig cfg = ModelConfig::from_hf_file("configs/models/tiny.json");
  const std::unique_ptr<TokenSource> tokens = make_synthetic_tokens(cfg.vocab_size, 1 << 14, 7);
  auto train = [&](bool gated) {
    auto backend = create_backend(test::cpu_backend_options());
    EngineOptions eo;
    eo.grad_clip = 0.05f;  // clips every step: the device's coefficient is used
    test::TinyTraining t(*backend, cfg, {.micro_batch = 2, .seq_len = 32}, eo, *comm, *tokens);
    auto& [mo, model, engine, sampler] = t;
    std::vector<StepResult> results;
    bool opened_by_watchdog = false;
    for (int it = 1; it <= 3; ++it) {
      engine.begin_step(1e-3 * it);
      model.forward_backward(sampler.next(), engine, engine, 1.0f / (mo.micro_batch * mo.seq_len), true);
      if (gated && it == 2) {
        std::promise<void> open;
        std::shared_future<void> gate = open.get_future().share();
        for (StreamKind k : {StreamKind::Compute, StreamKind::Comm})
          backend->host_func(backend->stream(k), [gate] { gate.wait(); });
        std::promise<void> returned;
        std::thread watchdog([&] {
          if (returned.get_future().wait_for(std::chrono::minutes(1)) == std::future_status::timeout) {
            opened_by_watchdog = true;
            open.set_value();
          }
        });
        engine.end_step();
        returned.set_value();
        watchdog.join();
        if (!opened_by_watchdog) open.set_value();
      } else {
        engine.end_step();
      }
      results.push_back(engine.step_result());
    }
    EXPECT_FALSE(opened_by_watchdog) << "end_step waited for a stream held behind the gate";
    engine.finish();
    return std::make_pair(results, test::OptimizerState::read(engine));
  };
  const auto [free_results, free_state] = train(false);
  const auto [gated_results, gated_state] = train(true);
  for (size_t s = 0; s < free_results.size(); ++s) {
    EXPECT_LT(gated_results[s].clip_coef, 1.0f) << "step " << s + 1;
    EXPECT_EQ(gated_results[s].grad_norm, free_results[s].grad_norm) << "step " << s + 1;
    EXPECT_EQ(gated_results[s].clip_coef, free_results[s].clip_coef) << "step " << s + 1;
    EXPECT_EQ(gated_results[s].steps_taken, static_cast<int64_t>(s + 1));
  }
  test::expect_same_optimizer_state(gated_state, free_state, "gated");
}

// The training loop on one rank (ZeRO-3 over one rank: the device path), clipping every step, two
// micro-batches per step and a warm-up schedule (the learning rate follows the steps taken):
// figures read one step late (no checkpoints), at once (a checkpoint due every step, which makes
// the loop read each step's figures as it ends), and late again after resuming from the step-4
// checkpoint. Every logged loss, learning rate, norm and skip flag, and the final state, the same
// bit for bit.
struct TrainedRun {
  std::vector<double> losses;
  std::vector<nlohmann::json> lines;  // --metrics
  test::OptimizerState state;
};

TrainedRun train_tiny(const std::string& dir, const std::string& name, int64_t save_every,
                      const std::string& resume = "") {
  nlohmann::json doc = load_json_file("configs/runs/tiny-demo.json");
  for (const char* s : {"train.steps=8", "data.seq_len=32", "steps_per_print=100", "train_micro_batch_size_per_gpu=2",
                        "gradient_accumulation_steps=2", "gradient_clipping=0.01", "zero_optimization.stage=3",
                        "scheduler.params.warmup_num_steps=10"})
    apply_override(doc, s);
  const RunConfig cfg = parse_run_config(doc, "test_step_overlap");
  std::unique_ptr<Communicator> comm = make_mpi_world_communicator();
  TrainedRun r;
  TrainOptions opts;
  opts.metrics_path = dir + "/" + name + ".jsonl";
  opts.quiet = true;
  if (save_every > 0) opts.save_dir = dir + "/" + name, opts.save_every = save_every, opts.keep = 100;
  opts.resume = resume;
  opts.at_end = [&](Engine& e) { r.state = test::OptimizerState::read(e); };
  r.losses = train(cfg, *comm, opts).losses;
  std::ifstream in(opts.metrics_path);
  for (std::string line; std::getline(in, line);) r.lines.push_back(nlohmann::json::parse(line));
  return r;
}

void expect_same_lines(const std::vector<nlohmann::json>& got, const std::vector<nlohmann::json>& ref, size_t first,
                       const char* name) {
  ASSERT_EQ(got.size() + first, ref.size()) << name;
  for (size_t i = 0; i < got.size(); ++i) {
    const nlohmann::json &g = got[i], &f = ref[i + first];
    EXPECT_EQ(g.at("step"), f.at("step")) << name;
    for (const char* key : {"loss", "lr", "grad_norm"})
      EXPECT_EQ(g.at(key).get<double>(), f.at(key).get<double>()) << name << " " << key << " of step " << f.at("step");
    EXPECT_EQ(g.at("skipped"), f.at("skipped")) << name << " step " << f.at("step");
  }
}

TEST(StepOverlap, FiguresReadLateEqualFiguresReadAtOnce) {
  const test::ScratchDir scratch("step_overlap");
  const std::string dir = scratch.path().string();
  const TrainedRun late = train_tiny(dir, "late", 0);
  const TrainedRun at_once = train_tiny(dir, "at_once", 1);
  const TrainedRun resumed = train_tiny(dir, "resumed", 0, dir + "/at_once/step-00000004.h5");
  ASSERT_EQ(late.lines.size(), 8u);
  std::set<double> lrs;
  for (const nlohmann::json& l : late.lines) lrs.insert(l.at("lr").get<double>());
  EXPECT_GE(lrs.size(), 6u) << "the warm-up did not change the learning rate from step to step";
  EXPECT_EQ(late.losses, at_once.losses);
  expect_same_lines(late.lines, at_once.lines, 0, "late vs at once");
  test::expect_same_optimizer_state(late.state, at_once.state, "late vs at once");
  EXPECT_EQ(resumed.losses, std::vector<double>(late.losses.begin() + 4, late.losses.end()));
  expect_same_lines(resumed.lines, late.lines, 4, "resumed vs late");
  test::expect_same_optimizer_state(resumed.state, late.state, "resumed vs late");
}

}  // namespace
}  // namespace so
