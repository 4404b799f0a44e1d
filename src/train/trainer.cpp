#include "so/train/trainer.h"

#include <csignal>
#include <cstdio>
#include <optional>

#include "parallel/collective_watchdog.h"
#include "so/core/clock.h"
#include "so/core/cpu_affinity.h"
#include "so/core/error.h"
#include "so/core/log.h"
#include "so/data/batch_sampler.h"
#include "so/train/evaluation.h"
#include "so/train/training_data.h"
#include "so/engine/engine.h"
#include "so/model/hf_model.h"
#include "so/model/llama_model.h"
#include "so/train/checkpoint.h"
#include "so/train/csv_monitor.h"
#include "so/train/decay_groups.h"
#include "so/train/memory_plan.h"
#include "so/train/metrics.h"
#include "so/train/nan_policy.h"
#include "so/train/rank_agreement.h"

namespace so {

namespace {

// SIGTERM / SIGUSR1 (Slurm's preemption signals): finish the step, save, exit cleanly.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

// The model's view of the sequence-parallel group.
class CommSequenceParallel final : public SequenceParallel {
 public:
  explicit CommSequenceParallel(Communicator& c) : c_(c) {}
  int size() const override { return c_.size(); }
  int rank() const override { return c_.rank(); }
  void all_to_all(Stream& s, void* recv, const void* send, int64_t count, DType dt) override {
    c_.all_to_all(s, recv, send, count, dt);
  }

 private:
  Communicator& c_;
};

const char* zero_stage_summary(int stage) {
  switch (stage) {
    case 0: return "nothing sharded";
    case 1: return "optimizer state sharded";
    case 2: return "optimizer state and gradients sharded";
    default: return "optimizer state, gradients and weights sharded";
  }
}

std::string layout_total_note(int64_t full, int64_t shard) {
  return str_cat(100.0 * static_cast<double>(shard) / static_cast<double>(full), "% of ", full);
}

}  // namespace

TrainSummary train(const RunConfig& cfg, Communicator& job, const TrainOptions& opts) {
  // Before anything is sized from the config: ranks that disagree would issue collectives of
  // different sizes. The model by its content (a config file may differ between nodes).
  nlohmann::json agreed = cfg.resolved.is_object() ? cfg.resolved : nlohmann::json::object();
  agreed["model"] = cfg.model.to_hf_json();
  agreed["command line"] = {{"save_dir", opts.save_dir}, {"save_every", opts.save_every},
                            {"async_save", opts.async_save}, {"resume", opts.resume}};
  CollectiveWatchdog::set_timeout(cfg.collective_timeout_s);
  check_ranks_agree(agreed, job);
  // With offload, the optimizer pool and the compute stream get disjoint cores.
  const bool offload = cfg.offload.mode != OffloadMode::None;
  CoreSplit cores;
  BackendOptions bo = cfg.backend;
  if (offload) {
    cores = split_cores(process_cores(), cfg.offload.cpu_cores_fraction);
    bo.compute_cores = cores.compute;
  }
  // The backend first: the CUDA backend selects this rank's GPU, which NCCL then binds to.
  std::unique_ptr<Backend> backend = create_backend(bo);
  ProcessGroups groups =
      make_process_groups(communicator_for(*backend, job.split(0, job.rank(), "world")), cfg.sequence_parallel_size);
  Communicator& comm = *groups.world;
  SO_CHECK(cfg.data.seq_len % groups.sp_size == 0, "data.seq_len (", cfg.data.seq_len,
           ") is not divisible by sequence_parallel_size (", groups.sp_size, ")");
  const BatchSizes batch = resolve_batch_sizes(cfg, groups.dp_size);
  const int64_t global_batch = batch.global;
  // The memory plan, before anything is allocated: "auto" settings resolved from it, and a run that
  // cannot fit refused with the table rather than failing at some allocation later.
  RunConfig run = cfg;
  const TrainingData data = open_training_data(cfg, batch.micro);
  if (run.steps == 0) run.steps = steps_for_epochs(cfg.num_train_epochs, data.train->samples_per_epoch(), global_batch);
  const MachineProfile machine = machine_profile_of(*backend);
  const std::string auto_choice = resolve_auto_memory(run, comm.size(), machine);
  const MemoryPlan plan = plan_memory(run, comm.size(), comm.rank(), machine, !opts.save_dir.empty() && opts.async_save);
  if (const std::optional<std::string> over = first_term_over(plan, machine))
    throw Error(str_cat("the run does not fit: ", *over, "\n", format_plan(run, comm.size(), plan, machine),
                        "(train.activation_offload and train.mlp_tile_tokens \"auto\" offload and tile as needed; "
                        "so_train --plan shows this table without starting)"));
  ModelOptions mo = model_options(run, batch.micro, groups.sp_size);
  CommSequenceParallel ulysses(*groups.sp);
  if (groups.sp_size > 1) {
    groups.sp->attach(*backend);
    mo.sequence_parallel = &ulysses;
  }
  LlamaModel model(*backend, cfg.model, mo);

  EngineOptions eo;
  eo.dtype = cfg.dtype;
  eo.bucket_size = cfg.bucket_size;
  eo.grad_clip = cfg.grad_clip;
  eo.adam = cfg.adam;
  const DecayGroups decay = decay_groups(model.layout(), cfg.decay, cfg.adam.weight_decay);
  eo.no_decay = decay.no_decay;
  eo.offload = cfg.offload;
  eo.zero_stage = cfg.zero_stage;
  eo.optimizer_cores = cores.optimizer;
  // One trace per rank: rank r of a multi-rank job writes FILE.rank<r>.
  eo.trace_path = opts.trace_path.empty() || comm.size() == 1 ? opts.trace_path : str_cat(opts.trace_path, ".rank", comm.rank());
  eo.rank = comm.rank();
  Engine engine(*backend, model.layout(), eo, comm);
  if (groups.world->size() > 1)
    log_info(str_cat("rank ", comm.rank(), " of ", comm.size(), ": data-parallel ", groups.dp_rank, "/",
                     groups.dp_size, ", sequence-parallel ", groups.sp_rank, "/", groups.sp_size, "; ZeRO stage ",
                     engine.zero_stage(), " (", zero_stage_summary(engine.zero_stage()), "): optimizer shard of ",
                     engine.shards().total, " elements (", layout_total_note(model.layout().total, engine.shards().total),
                     "); weights + gradients + optimizer state ", mib(engine.state_bytes()), " MiB on the device, ",
                     mib(engine.host_state_bytes()), " MiB on the host"));
  engine.init_weights(cfg.seed, cfg.model.initializer_range);
  if (!cfg.init_hf_dir.empty()) {
    load_hf_weights(cfg.init_hf_dir, model.layout(),
                    [&](int id, std::vector<float> values) { engine.load_weight(id, values); });
    if (comm.rank() == 0) log_info(str_cat("weights loaded from the Hugging Face model in ", cfg.init_hf_dir));
  }
  TrainState state;
  if (!opts.resume.empty()) {
    state = load_checkpoint(engine, comm, cfg, opts.resume);
    if (comm.rank() == 0)
      log_info(str_cat("resumed from ", resolve_checkpoint(opts.resume), " at step ", state.iteration,
                       " (optimizer step ", state.steps_taken, ", sample ", state.data_position, ")"));
  }
  if (!opts.save_dir.empty()) {
    std::signal(SIGTERM, on_stop_signal);
    std::signal(SIGUSR1, on_stop_signal);
    if (opts.async_save) {
      engine.reserve_snapshot_space();  // its pages faulted in now, not by the step after a save
      if (comm.rank() == 0)
        log_info(str_cat("asynchronous saves: ", mib(engine.snapshot_space_bytes()),
                         " MiB of host memory per rank for the saved state: device state is staged there at each save, "
                         "host state put aside there before the next step changes it"));
    }
  }

  // Every rank's loss is scaled by the step's supervised tokens (train.loss_normalization) and
  // gradients are summed over ranks, so the step sees the mean over the global batch.
  const int64_t tokens_per_step = global_batch * cfg.data.seq_len;
  const double flops_per_token = train_flops_per_token(cfg.model, cfg.data.seq_len);
  const double flops_noncausal = train_flops_per_token(cfg.model, cfg.data.seq_len, false);
  const double peak = cfg.peak_tflops > 0 ? cfg.peak_tflops : backend->peak_tflops(cfg.dtype);
  const double gemm_peak = backend->measured_gemm_tflops(cfg.dtype);
  const bool lead = comm.rank() == 0;
  const std::string attention = model.attention_implementation();  // every rank builds its plans now
  if (lead) {
    log_info(str_cat("batch: ", batch.global, " sequences of ", cfg.data.seq_len, " tokens per step = micro-batch ",
                     batch.micro, " x gradient accumulation ", batch.accumulation, " x data-parallel size ",
                     groups.dp_size, batch.derived.empty() ? "" : str_cat(" (derived: ", batch.derived, ")")));
    log_info(str_cat("model ", cfg.model_source, ": ", cfg.model.model_type, ", ", cfg.model.num_parameters() / 1e6,
                     "M parameters, ", cfg.model.num_layers, " layers, ", engine.buckets().size(), " buckets, ",
                     dtype_name(cfg.dtype)));
    log_info(decay.description);
    if (!auto_choice.empty()) log_info(auto_choice);
    log_info(str_cat("attention: ", attention));
    log_info(str_cat("backend ", backend->name(), ": ", mib(backend->memory_stats().in_use), " MiB allocated (",
                     mib(engine.state_bytes()), " MiB parameter/optimizer state; planned device peak ",
                     mib(plan.device_peak), " MiB on rank 0), peak ", peak,
                     " TFLOP/s for MFU (attention counted causally; the non-causal figure beside it), ", gemm_peak,
                     " TFLOP/s measured GEMM; data ", data.train->describe(), " (", data.tokens_count, " tokens",
                     data.train->samples_per_epoch() > 0
                         ? str_cat(", ", run.steps * global_batch / static_cast<double>(data.train->samples_per_epoch()),
                                   " epochs in ", run.steps, " steps")
                         : "",
                     "); ",
                     tokens_per_step, " tokens/step, ", flops_per_token / 1e6, " MFLOP/token"));
    if (offload)
      log_info(str_cat("cores: compute stream on ", format_core_list(cores.compute), ", optimizer pool on ",
                       format_core_list(cores.optimizer)));
    log_info(engine.describe());
  }

  MetricsSink sink(lead ? opts.metrics_path : "", opts.quiet);
  CsvMonitor monitor(cfg.csv_monitor, lead);
  if (!monitor.directory().empty()) log_info(str_cat("csv_monitor: DeepSpeed's CSV files in ", monitor.directory()));
  const double run_start = now_seconds();
  TrainSummary summary;
  double tokens_per_s_sum = 0.0, step_sum = 0.0, exposed_sum = 0.0, busy_sum = 0.0;
  // A step's timing is known once the next step's forward has started (the optimizer of an
  // offloaded step overlaps it), so each line is written one step late.
  std::optional<StepMetrics> pending;
  const int64_t first_step = state.iteration + 1;
  auto emit = [&](StepMetrics m) {
    const std::optional<StepTiming> t = engine.timeline().finish(m.step);
    SO_CHECK(t, "timeline of step ", m.step, " is not complete");
    m.seconds = t->seconds;
    m.exposed_optimizer_s = t->exposed_optimizer;
    m.optimizer_busy_s = t->optimizer_busy;
    m.tokens_per_s = tokens_per_step / m.seconds;
    m.supervised_tokens_per_s = m.supervised_tokens / m.seconds;
    m.tflops = m.tokens_per_s * flops_per_token / 1e12;
    m.mfu = peak > 0 ? m.tflops / peak : 0.0;
    m.mfu_noncausal = peak > 0 ? m.tokens_per_s * flops_noncausal / 1e12 / peak : 0.0;
    m.mfu_gemm = gemm_peak > 0 ? m.tflops / gemm_peak : 0.0;
    m.elapsed_s = now_seconds() - run_start;
    m.eta_s = m.elapsed_s / static_cast<double>(m.step - first_step + 1) * static_cast<double>(run.steps - m.step);
    sink.write(m, run.steps, lead && (m.step % cfg.log_every == 0 || m.step == 1 || m.step == run.steps || m.evaluated));
    std::fflush(stdout);
    tokens_per_s_sum += m.tokens_per_s;
    summary.step_seconds.push_back(m.seconds);
    if (m.step > first_step)  // the first step of a run pays start-up effects
      step_sum += m.seconds, exposed_sum += m.exposed_optimizer_s, busy_sum += m.optimizer_busy_s;
  };

  SO_CHECK(opts.profile_first == 0 || (opts.profile_first > state.iteration && opts.profile_last <= run.steps),
           "--profile-steps ", opts.profile_first, ":", opts.profile_last, " is not within the steps this run takes (",
           state.iteration + 1, " to ", run.steps, ")");
  const EvaluationShare eval_share{batch.micro, cfg.data.seq_len, groups.dp_size, groups.dp_rank, groups.sp_size,
                                   groups.sp_rank};
  int64_t sample = state.data_position;  // index of the next global sample
  // At most one save in flight: its writers run while training goes on; it is committed at the
  // first step boundary where every rank's writer has finished (or before the next save).
  std::unique_ptr<CheckpointSave> in_flight;
  auto commit = [&] {
    const std::string path = in_flight->commit();
    in_flight.reset();
    if (lead) log_info(str_cat("checkpoint saved: ", path));
  };
  auto save = [&](bool async) {
    if (in_flight) commit();
    state.data_position = sample;
    state.steps_taken = engine.steps_taken();
    state.last_step_redone = engine.last_step_redone();
    in_flight = std::make_unique<CheckpointSave>(engine, comm, cfg, state, opts.save_dir, opts.keep, async);
    if (!async) commit();
  };
  StepGuard guard(cfg.nan_policy);
  // A diverged run stops with an error, its state saved first when saving is on: the steps it skipped
  // changed nothing, so that state is the last good one.
  auto stop_diverged = [&](const std::string& why) {
    std::string saved;
    if (!opts.save_dir.empty()) {
      save(false);
      saved = str_cat("; saved to ", opts.save_dir);
    }
    engine.finish();
    if (pending) emit(*pending);
    throw Error(str_cat(why, saved));
  };
  for (int64_t step = state.iteration + 1; step <= run.steps; ++step) {
    if (step == opts.profile_first) backend->profile_range(true);
    const double lr = cfg.schedule.lr_at(engine.steps_taken());
    const int64_t samples_before = sample;
    engine.begin_step(lr, static_cast<int>(batch.accumulation), cfg.schedule.betas_at(engine.steps_taken()));
    model.zero_loss();
    const std::vector<float> loss_scales = micro_batch_loss_scales(
        *data.train, sample, batch.micro, batch.accumulation, groups.dp_size, groups.dp_rank, cfg.loss_normalization);
    const int64_t supervised = data.train->supervised_tokens(sample, global_batch);
    // Data-parallel ranks read disjoint samples: each global micro-batch is dp_size x micro_batch
    // consecutive samples, this rank taking its share; sequence-parallel ranks take their slice
    // of every sequence of that share.
    for (int64_t micro = 0; micro < batch.accumulation; ++micro) {
      const TokenBatch mine = slice_sequences(data.train->batch_at(sample + groups.dp_rank * batch.micro),
                                              cfg.data.seq_len, groups.sp_size, groups.sp_rank);
      model.forward_backward(mine, engine, engine, loss_scales[micro], true);
      sample += groups.dp_size * batch.micro;
    }
    double loss_sum = model.read_loss();
    comm.all_reduce_sum(&loss_sum, 1);
    const float loss = static_cast<float>(loss_sum);
    if (pending) emit(*pending);
    const StepResult r = engine.end_step();
    if (step == opts.profile_last) backend->profile_range(false);

    StepMetrics m;
    m.step = step;
    m.loss = loss;
    m.lr = lr;
    m.grad_norm = r.grad_norm;
    m.supervised_tokens = supervised;
    if (data.validation && ((cfg.eval_every > 0 && step % cfg.eval_every == 0) || step == run.steps)) {
      engine.settle_weights();
      const Evaluation e = evaluate(model, engine, engine, *data.validation, eval_share, comm);
      m.evaluated = true, m.eval_loss = e.loss, m.eval_perplexity = e.perplexity, m.eval_tokens = e.supervised_tokens;
    }
    m.skipped = r.skipped;
    const MemoryStats mem = backend->memory_stats();
    m.mem_mib = mib(mem.in_use);
    m.peak_mem_mib = mib(mem.peak);
    pending = m;

    summary.clipped_steps += !r.skipped && r.clip_coef < 1.0f;
    summary.skipped_steps += r.skipped;
    state.iteration = step;
    if (summary.losses.empty()) summary.first_loss = loss;
    summary.last_loss = loss;
    summary.losses.push_back(loss_sum);
    summary.steps = step;
    monitor.step_events(samples_before, loss_sum, sample, cfg.schedule.lr_at(engine.steps_taken()));
    const StepGuard::Verdict verdict = guard.observe(step, loss_sum, r.skipped);
    if (lead && !verdict.warning.empty()) log_warn(verdict.warning);
    if (!verdict.stop.empty()) stop_diverged(verdict.stop);

    if (opts.save_dir.empty()) continue;
    // Every rank learns of a signal, and of every writer being done, at the same step boundary,
    // so all commit, save and stop together.
    double flags[2] = {g_stop_signal != 0 ? 1.0 : 0.0, in_flight && in_flight->written() ? 1.0 : 0.0};
    comm.all_reduce_sum(flags, 2);
    const bool stop = flags[0] > 0;
    if (in_flight && flags[1] == comm.size()) commit();
    // On a signal: the save in flight first, then the final one, synchronously.
    if ((opts.save_every > 0 && step % opts.save_every == 0) || stop) save(opts.async_save && !stop);
    if (stop) {
      if (lead) log_info(str_cat("stopping after step ", step, " on a termination signal; resume with --resume ", opts.save_dir));
      summary.stopped_by_signal = true;
      break;
    }
  }
  if (opts.save_at_end && !summary.stopped_by_signal && state.iteration == run.steps &&
      (opts.save_every == 0 || run.steps % opts.save_every != 0))
    save(false);
  if (in_flight) commit();
  engine.finish();
  if (opts.at_end) opts.at_end(engine);
  if (pending) emit(*pending);
  engine.timeline().write_trace();
  // Every rank's measured peak against its plan (rank 0 says the largest of each).
  std::vector<double> peaks(2 * static_cast<size_t>(comm.size()), 0.0);
  peaks[2 * comm.rank()] = mib(backend->memory_stats().peak);
  peaks[2 * comm.rank() + 1] = mib(plan.device_peak);
  comm.all_reduce_sum(peaks.data(), static_cast<int>(peaks.size()));
  double measured = 0, planned = 0;
  for (int r = 0; r < comm.size(); ++r) measured = std::max(measured, peaks[2 * r]), planned = std::max(planned, peaks[2 * r + 1]);
  if (lead) log_info(str_cat("device peak ", measured, " MiB measured, ", planned, " MiB planned (largest over the ranks)"));
  const int64_t ran = static_cast<int64_t>(summary.losses.size());
  summary.mean_tokens_per_s = tokens_per_s_sum / std::max<int64_t>(1, ran);
  summary.mean_step_s = step_sum / std::max<int64_t>(1, ran - 1);
  summary.mean_exposed_optimizer_s = exposed_sum / std::max<int64_t>(1, ran - 1);
  summary.mean_optimizer_busy_s = busy_sum / std::max<int64_t>(1, ran - 1);
  return summary;
}

}  // namespace so
