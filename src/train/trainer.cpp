// The training loop, top to bottom: set up the run (ranks, backend, data, memory plan, model,
// engine, weights), announce it, then per step: take the step, log it (evaluating on the
// validation split when due), check its health, save; finally report. Each feature lives in its own file: the step log
// and monitors (step_log.h, csv_monitor.h, tensorboard_monitor.h), the NaN policy (nan_policy.h), checkpoints
// (so/checkpoint/run_saves.h, checkpoint.h).
#include "so/train/trainer.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <string_view>

#include "parallel/collective_watchdog.h"
#include "so/checkpoint/checkpoint.h"
#include "so/checkpoint/run_saves.h"
#include "so/core/cpu_affinity.h"
#include "so/core/error.h"
#include "so/core/log.h"
#include "so/core/units.h"
#include "so/data/batch_sampler.h"
#include "so/engine/engine.h"
#include "so/model/hf_model.h"
#include "so/model/decoder_model.h"
#include "so/train/comm_sequence_parallel.h"
#include "so/train/csv_monitor.h"
#include "so/train/decay_groups.h"
#include "so/train/evaluation.h"
#include "so/train/loss_normalization.h"
#include "so/train/memory_plan.h"
#include "so/train/nan_policy.h"
#include "so/train/rank_agreement.h"
#include "so/train/step_log.h"
#include "so/train/tensorboard_monitor.h"
#include "so/train/training_data.h"

namespace so {

namespace {

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

// Everything a run is made of, in the order set_up builds it (members are destroyed in reverse:
// the engine before the model, the model before the backend).
struct Run {
  explicit Run(const RunConfig& c) : cfg(c), planned(c) {}
  const RunConfig& cfg;  // as given
  RunConfig planned;     // with the memory planner's "auto" choices resolved
  std::string auto_choice;
  CoreSplit cores;  // with offload, the optimizer pool and the compute stream get disjoint cores
  std::unique_ptr<Backend> backend;
  ProcessGroups groups;
  BatchSizes batch;
  std::optional<CastPlan> cast;  // measured before the plan (offloaded optimizer)
  MemoryPlan plan;
  std::unique_ptr<CommSequenceParallel> ulysses;
  std::unique_ptr<DecoderModel> model;
  DecayGroups decay;
  std::unique_ptr<Engine> engine;
  TrainState state;
  TrainingData data;  // the training samples and, when given, the validation split
  int64_t steps = 0;  // train.steps, or as many as train.num_train_epochs takes
  ThroughputBasis throughput;

  Communicator& comm() { return *groups.world; }
  bool lead() { return comm().rank() == 0; }
  int64_t tokens_per_step() const { return batch.global * cfg.data.seq_len; }
};

// Ranks that disagree on the config would issue collectives of different sizes: checked before
// anything is sized from it. The model by its content (a config file may differ between nodes).
void check_ranks_agree_on(const RunConfig& cfg, const TrainOptions& opts, Communicator& job) {
  nlohmann::json agreed = cfg.resolved.is_object() ? cfg.resolved : nlohmann::json::object();
  agreed["model"] = cfg.model.to_hf_json();
  agreed["command line"] = {{"save_dir", opts.save_dir},
                            {"save_every", opts.save_every},
                            {"async_save", opts.async_save},
                            {"resume", opts.resume}};
  CollectiveWatchdog::set_timeout(cfg.collective_timeout_s);
  check_ranks_agree(agreed, job);
}

// Backend, process groups, memory plan, model, engine, weights (initial, HF or resumed), data.
void set_up(Run& run, Communicator& job, const TrainOptions& opts) {
  const RunConfig& cfg = run.cfg;
  check_ranks_agree_on(cfg, opts, job);
  BackendOptions bo = cfg.backend;
  if (cfg.offload.mode != OffloadMode::None) {
    run.cores = split_cores(process_cores(), cfg.offload.cpu_cores_fraction);
    bo.compute_cores = run.cores.compute;
  }
  // The backend first: the CUDA backend selects this rank's GPU, which NCCL then binds to.
  run.backend = create_backend(bo);
  run.groups = make_process_groups(communicator_for(*run.backend, job.split(0, job.rank(), "world")),
                                   cfg.sequence_parallel_size);
  Communicator& comm = run.comm();
  SO_CHECK(cfg.data.seq_len % run.groups.sp_size == 0, "data.seq_len (", cfg.data.seq_len,
           ") is not divisible by sequence_parallel_size (", run.groups.sp_size, ")");
  run.batch = resolve_batch_sizes(cfg, run.groups.dp_size);

  // The weights' names, shapes, dtypes and MXFP4 scales, before anything is allocated.
  if (!cfg.init_hf_dir.empty()) check_hf_weights(cfg.init_hf_dir, ParamLayout::for_model(cfg.model));
  // The memory plan, before anything is allocated: "auto" settings resolved from it, and a run that
  // cannot fit refused with the table rather than failing at some allocation later.
  run.data = open_training_data(cfg, run.batch.micro);
  run.steps = cfg.steps > 0
                  ? cfg.steps
                  : steps_for_epochs(cfg.num_train_epochs, run.data.train->samples_per_epoch(), run.batch.global);
  run.planned.steps = run.steps;
  MachineProfile machine = machine_profile_of(*run.backend);
  run.cast = measure_offload_link(machine, cfg, comm.size(), comm.rank(), run.cores.optimizer);
  run.auto_choice = resolve_auto_memory(run.planned, comm.size(), machine);
  if (run.cast && run.planned.offload.cast_grads != cfg.offload.cast_grads) {  // the host's memory decided
    run.cast->grads = run.planned.offload.cast_grads;
    run.cast->report += "\n  -> gradients cast on the host instead: fp32 gradients would not fit the host memory";
  }
  run.plan = plan_memory(run.planned, comm.size(), comm.rank(), machine, !opts.save_dir.empty() && opts.async_save);
  if (const std::optional<std::string> over = first_term_over(run.plan, machine))
    throw Error(str_cat("the run does not fit: ", *over, "\n", format_plan(run.planned, comm.size(), run.plan, machine),
                        "(train.activation_offload and train.mlp_tile_tokens \"auto\" offload and tile as needed; "
                        "so_train --plan shows this table without starting)"));

  ModelOptions mo = model_options(run.planned, run.batch.micro, run.groups.sp_size);
  if (run.groups.sp_size > 1) {
    run.groups.sp->attach(*run.backend);
    run.ulysses = std::make_unique<CommSequenceParallel>(*run.groups.sp);
    mo.sequence_parallel = run.ulysses.get();
  }
  run.model = std::make_unique<DecoderModel>(*run.backend, cfg.model, mo);
  const ParamLayout& layout = run.model->layout();

  EngineOptions eo;
  eo.dtype = cfg.dtype;
  eo.bucket_size = cfg.bucket_size;
  eo.grad_clip = cfg.grad_clip;
  eo.adam = cfg.adam;
  run.decay = decay_groups(layout, cfg.decay, cfg.adam.weight_decay);
  eo.no_decay = run.decay.no_decay;
  eo.offload = run.planned.offload;
  eo.zero_stage = cfg.zero_stage;
  eo.optimizer_cores = run.cores.optimizer;
  eo.accumulation = static_cast<int>(run.batch.accumulation);
  eo.grad_ring_depth = run.plan.grad_ring_depth;
  eo.cast = run.cast;
  // One trace per rank: rank r of a multi-rank job writes FILE.rank<r>.
  eo.trace_path =
      opts.trace_path.empty() || comm.size() == 1 ? opts.trace_path : str_cat(opts.trace_path, ".rank", comm.rank());
  eo.rank = comm.rank();
  run.engine = std::make_unique<Engine>(*run.backend, layout, eo, comm);
  Engine& engine = *run.engine;
  if (comm.size() > 1)
    log_info(str_cat(
        "rank ", comm.rank(), " of ", comm.size(), ": data-parallel ", run.groups.dp_rank, "/", run.groups.dp_size,
        ", sequence-parallel ", run.groups.sp_rank, "/", run.groups.sp_size, "; ZeRO stage ", engine.zero_stage(), " (",
        zero_stage_summary(engine.zero_stage()), "): optimizer shard of ", engine.shards().total, " elements (",
        layout_total_note(layout.total, engine.shards().total), "); weights + gradients + optimizer state ",
        mib(engine.state_bytes()), " MiB on the device, ", mib(engine.host_state_bytes()), " MiB on the host"));

  engine.init_weights(cfg.seed, cfg.model.initializer_range);
  if (!cfg.init_hf_dir.empty()) {
    load_hf_weights(cfg.init_hf_dir, layout,
                    [&](int id, std::vector<float> values) { engine.load_weight(id, values); });
    if (comm.rank() == 0)
      log_info(str_cat("weights loaded from the Hugging Face model in ", cfg.init_hf_dir,
                       cfg.model.moe.mxfp4 ? " (MXFP4 experts dequantised to fp32; checkpoints and exports hold them "
                                             "unquantised: bf16 or fp32, no quantization_config)"
                                           : ""));
  }
  if (!opts.resume.empty()) {
    run.state = load_checkpoint(engine, comm, cfg.model, opts.resume);
    if (comm.rank() == 0)
      log_info(str_cat("resumed from ", resolve_checkpoint(opts.resume), " at step ", run.state.iteration,
                       " (optimizer step ", run.state.steps_taken, ", sample ", run.state.data_position, ")"));
  }

  run.throughput.tokens_per_step = run.tokens_per_step();
  run.throughput.flops_per_token = train_flops_per_token(cfg.model, cfg.data.seq_len);
  run.throughput.flops_per_token_noncausal = train_flops_per_token(cfg.model, cfg.data.seq_len, false);
  run.throughput.peak_tflops = cfg.peak_tflops > 0 ? cfg.peak_tflops : run.backend->peak_tflops(cfg.dtype);
  run.throughput.gemm_tflops = run.backend->measured_gemm_tflops(cfg.dtype);
}

// s as one word of a POSIX shell command, as Python's shlex.quote writes it: bare when it holds
// only characters no shell treats specially, else in single quotes (a quote in it as '"'"').
std::string shell_word(const std::string& s) {
  const bool bare = !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) {
    return std::isalnum(c) || std::string_view("@%+=:,./-_").find(static_cast<char>(c)) != std::string_view::npos;
  });
  if (bare) return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\"'\"'") : std::string(1, c);
  return out + "'";
}

// The start-up notes (rank 0): batch, model, decay groups, attention, memory, cores, engine, and
// what is done with DeepSpeed's wandb and flops_profiler sections.
void announce(Run& run, const TrainOptions& opts) {
  const RunConfig& cfg = run.cfg;
  const std::string attention = run.model->attention_implementation();  // every rank builds its plans now
  if (!run.lead()) return;
  const BatchSizes& batch = run.batch;
  Engine& engine = *run.engine;
  Backend& backend = *run.backend;
  log_info(str_cat("batch: ", batch.global, " sequences of ", cfg.data.seq_len, " tokens per step = micro-batch ",
                   batch.micro, " x gradient accumulation ", batch.accumulation, " x data-parallel size ",
                   run.groups.dp_size, batch.derived.empty() ? "" : str_cat(" (derived: ", batch.derived, ")")));
  log_info(str_cat("model ", cfg.model_source, ": ", cfg.model.model_type, ", ", cfg.model.num_parameters() / 1e6,
                   "M parameters, ", cfg.model.num_layers, " layers, ", engine.buckets().size(), " buckets, ",
                   dtype_name(cfg.dtype)));
  log_info(run.decay.description);
  if (!run.auto_choice.empty()) log_info(run.auto_choice);
  log_info(str_cat("attention: ", attention));
  log_info(str_cat(
      "backend ", backend.name(), ": ", mib(backend.memory_stats().in_use), " MiB allocated (",
      mib(engine.state_bytes()), " MiB parameter/optimizer state; planned device peak ", mib(run.plan.device_peak),
      " MiB on rank 0), peak ", run.throughput.peak_tflops,
      " TFLOP/s for MFU (attention counted causally; the non-causal figure beside it), ", run.throughput.gemm_tflops,
      " TFLOP/s measured GEMM; data ", run.data.train->describe(), " (", run.data.tokens_count, " tokens",
      run.data.train->samples_per_epoch() > 0
          ? str_cat(", ", run.steps * batch.global / static_cast<double>(run.data.train->samples_per_epoch()),
                    " epochs in ", run.steps, " steps")
          : "",
      "); ", run.tokens_per_step(), " tokens/step, ", run.throughput.flops_per_token / 1e6, " MFLOP/token"));
  if (cfg.offload.mode != OffloadMode::None)
    log_info(str_cat("cores: compute stream on ", format_core_list(run.cores.compute), ", optimizer pool on ",
                     format_core_list(run.cores.optimizer)));
  log_info(engine.describe());
  if (cfg.wandb.enabled)
    log_info(str_cat(
        "wandb: so_train writes no wandb run itself; scripts/wandb_log.py logs this run's --metrics file "
        "through the official client, after the run: WANDB_MODE=offline $SO_PYTHON scripts/wandb_log.py "
        "--metrics ",
        shell_word(opts.metrics_path), " --config ", shell_word(cfg.source), " --project ",
        shell_word(cfg.wandb.project), cfg.wandb.group.empty() ? "" : str_cat(" --group ", shell_word(cfg.wandb.group)),
        cfg.wandb.team.empty() ? "" : str_cat(" --team ", shell_word(cfg.wandb.team)),
        ", then `wandb sync wandb/offline-run-*` where there is a network"));
  if (cfg.flops_profiler)
    log_info(
        str_cat("flops_profiler: DeepSpeed's per-module profile is not written; every step line and --metrics record "
                "carry the model's TFLOP/s and MFU (",
                run.throughput.flops_per_token / 1e6,
                " MFLOP/token, forward and backward, attention counted causally; the non-causal MFU beside it)"));
}

// What one step did. What the device computed (the loss, the expert counts, the optimizer's
// result) is read by read_figures, normally after the next step's work is enqueued (figures_due).
struct StepOutcome {
  int64_t step = 0;
  double loss = 0.0;  // the global mean over the step's supervised tokens (train.loss_normalization)
  int64_t supervised_tokens = 0;
  StepResult result;
  int64_t samples_before = 0, samples_after = 0;
  std::vector<std::vector<double>> expert_tokens;  // [layer][expert], summed over ranks (StepMetrics::moe)
  StepMetrics metrics;  // what was known as the step ended: its evaluation (when due) and memory
};

// StepMetrics' expert figures from tokens per [layer][expert] (a dense layer's list empty).
void expert_token_metrics(const std::vector<std::vector<double>>& tokens, StepMetrics& m) {
  for (const std::vector<double>& layer : tokens) {
    if (layer.empty()) continue;
    const auto [lo, hi] = std::minmax_element(layer.begin(), layer.end());
    const double mean = std::accumulate(layer.begin(), layer.end(), 0.0) / static_cast<double>(layer.size());
    m.expert_tokens_min = m.moe ? std::min(m.expert_tokens_min, *lo) : *lo;
    m.expert_tokens_max = m.moe ? std::max(m.expert_tokens_max, *hi) : *hi;
    m.expert_imbalance = std::max(m.expert_imbalance, mean > 0 ? *hi / mean : 0.0);
    m.moe = true;
  }
}

// Forward and backward over every micro-batch, then the optimizer step, all enqueued without
// waiting for the device; `before_log` runs once they are (it reads the previous step's figures
// when those were left for later). The previous step's log line is written then: its timing is
// complete once this step's forward has run.
StepOutcome take_step(Run& run, int64_t step, const TrainOptions& opts, StepLog& log,
                      const std::function<void()>& before_log) {
  Engine& engine = *run.engine;
  StepOutcome out;
  out.step = step;
  if (step == opts.profile_first) run.backend->profile_range(true);
  out.samples_before = run.state.data_position;
  // The step's learning rate follows the optimizer steps applied before it, which the engine knows
  // by the time it launches this step's optimizer (the previous step may still be validating now).
  const LrSchedule& schedule = run.cfg.schedule;
  engine.begin_step(
      [&schedule](int64_t taken) {
        return StepHyperparameters{schedule.lr_at(taken), schedule.betas_at(taken)};
      },
      static_cast<int>(run.batch.accumulation));
  run.model->zero_loss();
  run.model->zero_expert_tokens();
  // Every rank's loss is scaled by the step's supervised tokens (train.loss_normalization) and
  // gradients are summed over ranks, so the step sees the mean over the global batch.
  int64_t& sample = run.state.data_position;  // index of the next global sample
  const SampleStream& data = *run.data.train;
  const std::vector<float> loss_scales =
      micro_batch_loss_scales(data, sample, run.batch.micro, run.batch.accumulation, run.groups.dp_size,
                              run.groups.dp_rank, run.cfg.loss_normalization);
  out.supervised_tokens = data.supervised_tokens(sample, run.batch.global);
  // Data-parallel ranks read disjoint samples: each global micro-batch is dp_size x micro_batch
  // consecutive samples, this rank taking its share; sequence-parallel ranks take their slice
  // of every sequence of that share.
  for (int64_t micro = 0; micro < run.batch.accumulation; ++micro) {
    const TokenBatch mine = slice_sequences(data.batch_at(sample + run.groups.dp_rank * run.batch.micro),
                                            run.cfg.data.seq_len, run.groups.sp_size, run.groups.sp_rank);
    run.model->forward_backward(mine, engine, engine, loss_scales[micro], true);
    sample += run.groups.dp_size * run.batch.micro;
  }
  out.samples_after = sample;
  engine.end_step();
  if (step == opts.profile_last) run.backend->profile_range(false);
  run.state.iteration = step;
  // Between steps again: the previous step's figures are read (a failure there saves this step's
  // state), then this step's are queued (one host copy at a time), before anything else touches
  // the loss and the expert counts.
  before_log();
  run.model->queue_step_figures();
  log.write_held(engine.timeline());
  return out;
}

// Reads what the device computed for the step (waiting for those copies only): the loss and the
// expert counts, summed over the ranks, and the optimizer's result.
void read_figures(Run& run, StepOutcome& out) {
  DecoderModel::StepFigures f = run.model->step_figures();
  out.loss = f.loss;
  run.comm().all_reduce_sum(&out.loss, 1);
  for (const std::vector<int64_t>& layer : f.expert_tokens) {
    out.expert_tokens.emplace_back(layer.begin(), layer.end());
    // Every rank reduces the same layers (its model is the same): one sum per MoE layer.
    if (!layer.empty()) run.comm().all_reduce_sum(out.expert_tokens.back().data(), static_cast<int>(layer.size()));
  }
  out.result = run.engine->step_result(out.step);
}

// Whether a step's figures are read as it ends rather than after the next step's work is enqueued:
// a checkpoint is due (its log follows the step's warnings, as always), the run ends, or the step
// could stop the run (the loop's health check then stops it at this step, before another is applied).
bool figures_due(const Run& run, int64_t step, const TrainOptions& opts, const StepGuard& guard) {
  return step == run.steps || (!opts.save_dir.empty() && opts.save_every > 0 && step % opts.save_every == 0) ||
         guard.stops_if_skipped();
}

// Evaluation on the validation split every train.eval_every steps and at the last step, into m.
void evaluate_if_due(Run& run, int64_t step, StepMetrics& m) {
  const int64_t every = run.cfg.eval_every;
  if (!run.data.validation || !((every > 0 && step % every == 0) || step == run.steps)) return;
  run.engine->settle_weights();  // the device optimizer may still be writing this step's weights
  const EvaluationShare share{run.batch.micro,    run.cfg.data.seq_len, run.groups.dp_size,
                              run.groups.dp_rank, run.groups.sp_size,   run.groups.sp_rank};
  const Evaluation e = evaluate(*run.model, *run.engine, *run.engine, *run.data.validation, share, run.comm());
  m.evaluated = true, m.eval_loss = e.loss, m.eval_perplexity = e.perplexity, m.eval_tokens = e.supervised_tokens;
}

// As the step ends, before the next one changes anything: its evaluation when due, and memory.
void close_step(Run& run, StepOutcome& out) {
  evaluate_if_due(run, out.step, out.metrics);
  const MemoryStats mem = run.backend->memory_stats();
  out.metrics.mem_mib = mib(mem.in_use);
  out.metrics.peak_mem_mib = mib(mem.peak);
}

// The step into the log (held until its timing is known), the CSV monitor and the run's summary.
void record_step(Run& run, const StepOutcome& out, StepLog& log, CsvMonitor& csv, TrainSummary& summary) {
  StepMetrics m = out.metrics;
  m.step = out.step;
  m.loss = static_cast<float>(out.loss);
  m.lr = out.result.lr;
  m.grad_norm = out.result.grad_norm;
  m.skipped = out.result.skipped;
  m.supervised_tokens = out.supervised_tokens;
  expert_token_metrics(out.expert_tokens, m);
  log.hold(m);

  summary.clipped_steps += !out.result.skipped && out.result.clip_coef < 1.0f;
  summary.skipped_steps += out.result.skipped;
  if (summary.losses.empty()) summary.first_loss = static_cast<float>(out.loss);
  summary.last_loss = static_cast<float>(out.loss);
  summary.losses.push_back(out.loss);
  summary.steps = out.step;
  csv.step_events(out.samples_before, out.loss, out.samples_after, run.cfg.schedule.lr_at(out.result.steps_taken));
}

// A run that diverged or whose evaluation failed stops with an error, its state saved first when
// saving is on (a diverged run's skipped steps changed nothing, so that state is the last good one).
[[noreturn]] void stop_saving(Run& run, RunSaves& saves, StepLog& log, const std::string& why) {
  std::string saved;
  if (saves.on()) saves.save_now(run.state), saved = str_cat("; saved to ", saves.directory());
  run.engine->finish();
  log.write_held(run.engine->timeline());
  throw Error(str_cat(why, saved));
}

// Every rank's measured device peak against its plan (rank 0 says the largest of each).
void report_peak_memory(Run& run) {
  Communicator& comm = run.comm();
  std::vector<double> peaks(2 * static_cast<size_t>(comm.size()), 0.0);
  peaks[2 * comm.rank()] = mib(run.backend->memory_stats().peak);
  peaks[2 * comm.rank() + 1] = mib(run.plan.device_peak);
  comm.all_reduce_sum(peaks.data(), static_cast<int>(peaks.size()));
  double measured = 0, planned = 0;
  for (int r = 0; r < comm.size(); ++r)
    measured = std::max(measured, peaks[2 * r]), planned = std::max(planned, peaks[2 * r + 1]);
  if (run.lead())
    log_info(str_cat("device peak ", measured, " MiB measured, ", planned, " MiB planned (largest over the ranks)"));
}

}  // namespace

TrainSummary train(const RunConfig& cfg, Communicator& job, const TrainOptions& opts) {
  // Set-up.
  Run run(cfg);
  set_up(run, job, opts);
  Engine& engine = *run.engine;
  RunSaves saves(engine, run.comm(), cfg.model, cfg.resolved, opts);
  announce(run, opts);
  const int64_t first_step = run.state.iteration + 1;
  CsvMonitor csv(cfg.csv_monitor, run.lead());
  if (!csv.directory().empty()) log_info(str_cat("csv_monitor: DeepSpeed's CSV files in ", csv.directory()));
  TensorBoardMonitor tensorboard(cfg.tensorboard, run.lead(), cfg.resolved.dump(2));
  if (tensorboard.on()) log_info(str_cat("tensorboard: event file ", tensorboard.path()));
  StepLog log({opts.metrics_path, opts.quiet, run.lead(), first_step, run.steps, cfg.log_every}, run.throughput,
              tensorboard);
  SO_CHECK(opts.profile_first == 0 || (opts.profile_first >= first_step && opts.profile_last <= run.steps),
           "--profile-steps ", opts.profile_first, ":", opts.profile_last, " is not within the steps this run takes (",
           first_step, " to ", run.steps, ")");
  StepGuard guard(cfg.nan_policy);
  TrainSummary summary;

  // A step's figures are read one step late (figures_due says when not): meanwhile the host
  // enqueues the next step, and the device never drains between steps. Read late, a failure to
  // record them stops the run after the next step, whose state is saved; the guard
  // never stops on a late step (figures_due), and a termination signal after a late step saves
  // first and reads that step's figures (its spike warning, if any) after.
  std::optional<StepOutcome> unread;
  auto conclude = [&](StepOutcome& out) {
    read_figures(run, out);
    // Log (a failure there costs none of the steps trained).
    try {
      record_step(run, out, log, csv, summary);
    } catch (const std::exception& e) {
      stop_saving(run, saves, log, str_cat("step ", out.step, " was trained, then: ", e.what()));
    }
    // Health: loss spikes reported, a diverged run stopped.
    const StepGuard::Verdict verdict = guard.observe(out.step, out.loss, out.result.skipped);
    if (run.lead() && !verdict.warning.empty()) log_warn(verdict.warning);
    if (!verdict.stop.empty()) stop_saving(run, saves, log, verdict.stop);
  };
  for (int64_t step = first_step; step <= run.steps; ++step) {
    // Step.
    StepOutcome out = take_step(run, step, opts, log, [&] {
      if (unread) conclude(*unread), unread.reset();
    });
    // Evaluate when due: a failure there costs none of the steps trained.
    try {
      close_step(run, out);
    } catch (const std::exception& e) {
      stop_saving(run, saves, log, str_cat("step ", step, " was trained, then: ", e.what()));
    }
    if (figures_due(run, step, opts, guard))
      conclude(out);
    else
      unread = std::move(out);
    // Save (and stop on a termination signal).
    if (saves.after_step(step, run.state)) {
      summary.stopped_by_signal = true;
      break;
    }
  }
  if (unread) conclude(*unread);  // stopped by a signal

  // Finish: the final state saved when asked (--save-at-end, unless the last step saved it), the
  // last save committed, the optimizer drained, the last step logged.
  if (opts.save_at_end && saves.on() && !summary.stopped_by_signal && run.state.iteration == run.steps &&
      (opts.save_every == 0 || run.steps % opts.save_every != 0))
    saves.save_now(run.state);
  saves.finish();
  engine.finish();
  if (opts.at_end) opts.at_end(engine);
  log.write_held(engine.timeline());
  engine.timeline().write_trace();
  report_peak_memory(run);
  log.summarize(summary);
  return summary;
}

}  // namespace so
