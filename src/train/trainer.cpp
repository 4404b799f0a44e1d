#include "so/train/trainer.h"

#include <chrono>
#include <cstdio>

#include "so/core/error.h"
#include "so/core/log.h"
#include "so/data/batch_sampler.h"
#include "so/engine/engine.h"
#include "so/model/llama_model.h"
#include "so/train/metrics.h"

namespace so {

namespace {

std::unique_ptr<TokenSource> open_data(const DataConfig& d, int64_t vocab) {
  if (d.type == "text") return open_text_bytes(d.path);
  if (d.type == "tokens") return open_token_file(d.path);
  if (d.type == "hdf5") return open_hdf5_tokens(d.path, d.dataset);
  return make_synthetic_tokens(vocab, d.synthetic_tokens, d.seed);
}

double mib(size_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

}  // namespace

TrainSummary train(const RunConfig& cfg, Communicator& comm, const TrainOptions& opts) {
  SO_CHECK(comm.size() == 1, "this build trains on one rank; got a world of ", comm.size(),
           " ranks (distributed ZeRO-3/Ulysses is not available yet)");
  std::unique_ptr<Backend> backend = create_backend(cfg.backend);
  ModelOptions mo;
  mo.dtype = cfg.dtype;
  mo.micro_batch = cfg.micro_batch;
  mo.seq_len = cfg.data.seq_len;
  mo.activation_checkpointing = cfg.activation_checkpointing;
  mo.loss_chunk_tokens = cfg.loss_chunk_tokens;
  LlamaModel model(*backend, cfg.model, mo);

  EngineOptions eo;
  eo.dtype = cfg.dtype;
  eo.bucket_size = cfg.bucket_size;
  eo.grad_clip = cfg.grad_clip;
  eo.adam = cfg.adam;
  Engine engine(*backend, model.layout(), eo, comm);
  engine.init_weights(cfg.seed, cfg.model.initializer_range);

  std::unique_ptr<TokenSource> source = open_data(cfg.data, cfg.model.vocab_size);
  BatchSampler sampler(*source, cfg.data.seq_len, cfg.micro_batch, cfg.model.vocab_size, cfg.data.seed);

  const int64_t tokens_per_step = cfg.micro_batch * cfg.grad_accum * cfg.data.seq_len;
  const double flops_per_token = train_flops_per_token(cfg.model, cfg.data.seq_len);
  const double peak = cfg.peak_tflops > 0 ? cfg.peak_tflops : backend->peak_tflops(cfg.dtype);
  log_info(str_cat("model ", cfg.model_source, ": ", cfg.model.model_type, ", ", cfg.model.num_parameters() / 1e6,
                   "M parameters, ", cfg.model.num_layers, " layers, ", engine.buckets().size(), " buckets, ",
                   dtype_name(cfg.dtype)));
  log_info(str_cat("backend ", backend->name(), ": ", mib(backend->memory_stats().in_use), " MiB allocated (",
                   mib(engine.state_bytes()), " MiB parameter/optimizer state), peak ", peak,
                   " TFLOP/s for MFU; data ", source->describe(), " (", source->size(), " tokens); ",
                   tokens_per_step, " tokens/step, ", flops_per_token / 1e6, " MFLOP/token"));

  MetricsSink sink(opts.metrics_path);
  TrainSummary summary;
  double tokens_per_s_sum = 0.0;
  const float loss_scale = 1.0f / static_cast<float>(tokens_per_step);
  for (int64_t step = 1; step <= cfg.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    engine.zero_grads();
    model.zero_loss();
    for (int64_t micro = 0; micro < cfg.grad_accum; ++micro)
      model.forward_backward(sampler.next(), engine, engine, loss_scale, true);
    const float loss = model.read_loss();
    const double lr = cfg.schedule.lr_at(engine.steps_taken());
    const StepResult r = engine.step(static_cast<float>(lr));
    backend->synchronize_all();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    StepMetrics m;
    m.step = step;
    m.loss = loss;
    m.lr = lr;
    m.grad_norm = r.grad_norm;
    m.skipped = r.skipped;
    m.seconds = secs;
    m.tokens_per_s = tokens_per_step / secs;
    m.tflops = m.tokens_per_s * flops_per_token / 1e12;
    m.mfu = peak > 0 ? m.tflops / peak : 0.0;
    const MemoryStats mem = backend->memory_stats();
    m.mem_mib = mib(mem.in_use);
    m.peak_mem_mib = mib(mem.peak);
    sink.write(m, cfg.steps, step % cfg.log_every == 0 || step == 1 || step == cfg.steps);
    std::fflush(stdout);

    if (step == 1) summary.first_loss = loss;
    summary.last_loss = loss;
    summary.steps = step;
    tokens_per_s_sum += m.tokens_per_s;
  }
  summary.mean_tokens_per_s = tokens_per_s_sum / std::max<int64_t>(1, summary.steps);
  return summary;
}

}  // namespace so
