#include "so/train/trainer.h"

#include <cstdio>
#include <optional>

#include "so/core/cpu_affinity.h"
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
  // With offload, the optimizer pool and the compute stream get disjoint cores.
  const bool offload = cfg.offload.mode != OffloadMode::None;
  CoreSplit cores;
  BackendOptions bo = cfg.backend;
  if (offload) {
    cores = split_cores(process_cores(), cfg.offload.cpu_cores_fraction);
    bo.compute_cores = cores.compute;
  }
  std::unique_ptr<Backend> backend = create_backend(bo);
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
  eo.offload = cfg.offload;
  eo.optimizer_cores = cores.optimizer;
  eo.trace_path = opts.trace_path;
  eo.rank = comm.rank();
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
  if (offload)
    log_info(str_cat("cores: compute stream on ", format_core_list(cores.compute), ", optimizer pool on ",
                     format_core_list(cores.optimizer)));
  log_info(engine.describe());

  MetricsSink sink(opts.metrics_path);
  TrainSummary summary;
  double tokens_per_s_sum = 0.0, step_sum = 0.0, exposed_sum = 0.0, busy_sum = 0.0;
  // A step's timing is known once the next step's forward has started (the optimizer of an
  // offloaded step overlaps it), so each line is written one step late.
  std::optional<StepMetrics> pending;
  auto emit = [&](StepMetrics m) {
    const std::optional<StepTiming> t = engine.timeline().finish(m.step);
    SO_CHECK(t, "timeline of step ", m.step, " is not complete");
    m.seconds = t->seconds;
    m.exposed_optimizer_s = t->exposed_optimizer;
    m.optimizer_busy_s = t->optimizer_busy;
    m.tokens_per_s = tokens_per_step / m.seconds;
    m.tflops = m.tokens_per_s * flops_per_token / 1e12;
    m.mfu = peak > 0 ? m.tflops / peak : 0.0;
    sink.write(m, cfg.steps, m.step % cfg.log_every == 0 || m.step == 1 || m.step == cfg.steps);
    std::fflush(stdout);
    tokens_per_s_sum += m.tokens_per_s;
    if (m.step > 1) step_sum += m.seconds, exposed_sum += m.exposed_optimizer_s, busy_sum += m.optimizer_busy_s;
  };

  const float loss_scale = 1.0f / static_cast<float>(tokens_per_step);
  for (int64_t step = 1; step <= cfg.steps; ++step) {
    const double lr = cfg.schedule.lr_at(engine.steps_taken());
    engine.begin_step(static_cast<float>(lr), static_cast<int>(cfg.grad_accum));
    model.zero_loss();
    for (int64_t micro = 0; micro < cfg.grad_accum; ++micro)
      model.forward_backward(sampler.next(), engine, engine, loss_scale, true);
    const float loss = model.read_loss();
    if (pending) emit(*pending);
    const StepResult r = engine.end_step();

    StepMetrics m;
    m.step = step;
    m.loss = loss;
    m.lr = lr;
    m.grad_norm = r.grad_norm;
    m.skipped = r.skipped;
    const MemoryStats mem = backend->memory_stats();
    m.mem_mib = mib(mem.in_use);
    m.peak_mem_mib = mib(mem.peak);
    pending = m;

    summary.clipped_steps += !r.skipped && r.clip_coef < 1.0f;
    summary.skipped_steps += r.skipped;
    if (step == 1) summary.first_loss = loss;
    summary.last_loss = loss;
    summary.steps = step;
  }
  engine.finish();
  if (pending) emit(*pending);
  engine.timeline().write_trace();
  summary.mean_tokens_per_s = tokens_per_s_sum / std::max<int64_t>(1, summary.steps);
  summary.mean_step_s = step_sum / std::max<int64_t>(1, summary.steps - 1);
  summary.mean_exposed_optimizer_s = exposed_sum / std::max<int64_t>(1, summary.steps - 1);
  summary.mean_optimizer_busy_s = busy_sum / std::max<int64_t>(1, summary.steps - 1);
  return summary;
}

}  // namespace so
