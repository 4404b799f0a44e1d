// so_bench ckpt: save and load time of an HDF5 checkpoint for a model built from random weights,
// through the same CheckpointSave / load_checkpoint the trainer uses (all ranks of the job writing
// their ZeRO-3 shards), with file size and bytes per second against the disk's own bounds
// (sequential write made durable, and sequential read from the disk, of the same bytes in the same
// directory, each the faster of through and around the page cache), and the stall an asynchronous save costs the
// training step that follows it: the save call itself, plus what the next optimizer step (which changes every bucket
// while the writer runs) takes beyond the same step without a save in flight. With
// --train-steps, also what saves cost real training (the trainer on configs/runs/bench-step.json
// with this model): per save, the extra time of the steps from the saving one to the next save,
// synchronous and asynchronous, against the median step of the same training without saves.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "bench/bench_commands.h"
#include "so/core/error.h"
#include "so/engine/engine.h"
#include "so/io/atomic_file.h"
#include "bench/device_timing.h"
#include "so/io/direct_io_file.h"
#include "so/model/param_layout.h"
#include "so/checkpoint/checkpoint.h"
#include "so/train/trainer.h"

namespace so::bench {

namespace po = boost::program_options;

namespace {

// The trainer three times on the same data: no saves, synchronous saves and asynchronous ones every
// `every` steps. A save's cost is the time the steps from the saving one to the next save (or the
// end) take beyond as many steps of the run without saves (its median step); the last save of the
// asynchronous run has steps after it, so its writer finishes within them.
void train_with_saves(const std::string& model, const std::string& dtype, const std::string& dir, int steps, int every,
                      Communicator& comm) {
  nlohmann::json doc = load_json_file("configs/runs/bench-step.json");
  apply_override(doc, "model.config=" + model);
  apply_override(doc, std::string("bf16.enabled=") + (dtype == "bf16" ? "true" : "false"));
  apply_override(doc, str_cat("train.steps=", steps));
  apply_override(doc, "steps_per_print=1000000");
  const RunConfig cfg = parse_run_config(doc, "so_bench ckpt --train-steps");
  auto run = [&](const std::string& name, bool save, bool async) {
    TrainOptions opts;
    if (save) {
      opts.save_dir = dir + "/train-" + name;
      opts.save_every = every;
      opts.keep = 2;
      opts.async_save = async;
      if (comm.rank() == 0) std::filesystem::remove_all(opts.save_dir);
      comm.barrier();
    }
    return train(cfg, comm, opts).step_seconds;
  };
  const std::vector<double> none = run("none", false, false), sync = run("sync", true, false),
                            async = run("async", true, true);
  // Step 1 pays start-up effects; the steps of the run without saves give the typical step.
  const double typical = median(std::vector<double>(none.begin() + 1, none.end()));
  auto per_save = [&](const std::vector<double>& t) {
    double extra = 0;
    int saves = 0;
    for (int s = every; s < steps; s += every, ++saves)  // steps are 1-based: t[s - 1] is step s
      for (int k = s; k < std::min(s + every, steps + 1); ++k) extra += t[k - 1] - typical;
    return extra / saves;
  };
  const double sync_cost = per_save(sync), async_cost = per_save(async);
  if (comm.rank() == 0) {
    std::printf(
        "# in training (%s, %d steps, a save every %d; step %.3f s without saves): a synchronous save "
        "costs %.3f s of training, an asynchronous one %.3f s: %.3f of the synchronous\n",
        model.c_str(), steps, every, typical, sync_cost, async_cost, async_cost / sync_cost);
  }
}

}  // namespace

int ckpt_bench(int argc, char** argv, Communicator& comm) {
  po::options_description desc("so_bench ckpt options");
  std::string model = "configs/models/tiny.json", dir = "build/ckpt-bench";
  std::string dtype = "fp32";
  int reps = 3, train_steps = 0, train_save_every = 4;
  bool async = true;
  desc.add_options()("help,h", "show this help")("model", po::value<std::string>(&model)->default_value(model),
                                                 "HF config.json of the model")(
      "dir", po::value<std::string>(&dir)->default_value(dir), "checkpoint directory (overwritten)")(
      "reps", po::value<int>(&reps)->default_value(reps), "saves and loads timed, at least 2 (the best is reported)")(
      "dtype", po::value<std::string>(&dtype)->default_value(dtype),
      "training dtype: fp32 or bf16 (bf16 needs 16 instead of 20 bytes of engine state per parameter)")(
      "async", po::value<bool>(&async)->default_value(async),
      "also time an asynchronous save and the step it stalls (its copies aside can need as much host memory "
      "again as the optimizer state)")(
      "train-steps", po::value<int>(&train_steps)->default_value(train_steps),
      "also train this many steps three times (no saves, synchronous and asynchronous saves every "
      "--train-save-every steps) and report what a save costs the training; 0: do not")(
      "train-save-every", po::value<int>(&train_save_every)->default_value(train_save_every),
      "steps between the saves of --train-steps");
  po::variables_map vm;
  if (!parse_command_line(desc, argc, argv, vm)) return 0;
  SO_CHECK(reps >= 2, "--reps must be at least 2 (the first save sizes the disk-bound probe)");
  SO_CHECK(train_steps == 0 || (train_save_every >= 2 && train_steps / 2 >= train_save_every), "--train-steps ",
           train_steps, " with --train-save-every ", train_save_every,
           ": saves need at least 2 steps between them and the run at least two saves");

  nlohmann::json doc = {{"model", {{"config", model}}},
                        {"data", {{"type", "synthetic"}, {"seq_len", 16}}},
                        {"zero_optimization", {{"stage", 3}}},
                        {"train", {{"steps", 1}}}};
  const RunConfig cfg = parse_run_config(doc, "so_bench ckpt");
  auto backend = create_backend(BackendOptions{});
  const ParamLayout layout = ParamLayout::for_model(cfg.model);
  SO_CHECK(dtype == "fp32" || dtype == "bf16", "--dtype is '", dtype, "'; choose fp32 or bf16");
  EngineOptions eo;
  eo.dtype = dtype == "bf16" ? DType::BF16 : DType::F32;
  Engine engine(*backend, layout, eo, comm);
  engine.init_weights(cfg.seed, cfg.model.initializer_range);
  if (async) engine.reserve_snapshot_space();  // as the trainer does when it saves asynchronously
  const double params = static_cast<double>(cfg.model.num_parameters());

  auto clock = [] { return std::chrono::steady_clock::now(); };
  auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  // Pages of `file` out of the page cache, so the next read comes from the disk.
  auto evict = [](const std::string& file) {
    const int fd = ::open(file.c_str(), O_RDONLY);
    SO_CHECK(fd >= 0, "cannot open ", file);
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  };
  // Deletions done and their blocks released (the journal commit, and on file systems mounted with
  // online discard the discards, which syncfs waits for), so they do not slow the next timed part.
  auto settle = [&] {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    SO_CHECK(fd >= 0, "cannot open ", dir);
    ::syncfs(fd);
    ::close(fd);
  };
  // The bounds: the checkpoint's bytes written sequentially into a new file in the same directory
  // and made durable, then read back from the disk — each both ways, through the page cache
  // (write + fsync; read after eviction) and around it (DirectIoFile, as the checkpoint does),
  // the faster way counting. Measured just before each save, while the previous checkpoint is
  // still there: both land on blocks the file system picks for a new file (on thin-provisioned
  // disks never-used blocks can be several times slower than freed ones, docs/perf.md).
  auto disk_probe = [&](double bytes) {
    const std::string probe = dir + "/.disk-bound-probe";
    const size_t total = static_cast<size_t>(bytes);
    std::vector<char> block(size_t{64} << 20, 1);
    auto t0 = clock();
    {
      AtomicFileWriter out(probe);
      for (size_t at = 0; at < total; at += block.size()) out.write(block.data(), std::min(block.size(), total - at));
      out.commit();
    }
    const double buffered_write = secs(t0, clock());
    evict(probe);
    t0 = clock();
    {
      const int fd = ::open(probe.c_str(), O_RDONLY);
      while (::read(fd, block.data(), block.size()) > 0) {
      }
      ::close(fd);
    }
    const double buffered_read = secs(t0, clock());
    std::filesystem::remove(probe);
    settle();
    t0 = clock();
    {
      const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      SO_CHECK(fd >= 0 && ::ftruncate(fd, static_cast<off_t>(total)) == 0, "cannot create ", probe);
      ::close(fd);
      DirectIoFile out(probe, DirectIoFile::Mode::Write);
      for (size_t at = 0; at < total; at += block.size())
        out.write_at(block.data(), std::min(block.size(), total - at), at, "disk-bound probe");
      out.sync("disk-bound probe");
    }
    const double direct_write = secs(t0, clock());
    evict(probe);
    t0 = clock();
    {
      DirectIoFile in(probe, DirectIoFile::Mode::Read);
      for (size_t at = 0; at < total; at += block.size())
        in.read_at(block.data(), std::min(block.size(), total - at), at, "disk-bound probe");
    }
    const double direct_read = secs(t0, clock());
    std::filesystem::remove(probe);
    settle();
    return std::pair{std::min(buffered_write, direct_write), std::min(buffered_read, direct_read)};
  };
  // One optimizer step that changes every bucket (zero gradients: AdamW still decays and moves
  // the moments), on the engine's own path; its time is what a save in flight may lengthen.
  auto optimizer_step = [&] {
    const auto t0 = clock();
    engine.begin_step(1e-4);
    for (int u = layout.num_units - 1; u >= 0; --u) engine.after_backward(u);
    engine.end_step();
    engine.finish();
    return secs(t0, clock());
  };
  double best_save = 1e30, best_load = 1e30, best_write = 1e30, best_read = 1e30, bytes = 0;
  double best_step = 1e30, best_stall = 1e30, best_async = 1e30, removal = 0, stall_call = 0, stall_step = 0,
         stall_alone = 0;
  std::string path;
  TrainState state;
  for (int r = 0; r < reps; ++r) {
    if (r > 0 && comm.rank() == 0) {  // the first save tells the size
      const auto [w, rd] = disk_probe(bytes);
      best_write = std::min(best_write, w);
      best_read = std::min(best_read, rd);
    }
    comm.barrier();
    auto t0 = clock();
    state.iteration = state.steps_taken = 2 * r + 1;
    path = save_checkpoint(engine, comm, cfg.model, cfg.resolved, state, dir, 1);
    best_save = std::min(best_save, secs(t0, clock()));
    t0 = clock();
    wait_for_old_checkpoint_removal();  // in training it runs beside the next steps
    settle();
    removal = std::max(removal, secs(t0, clock()));
    bytes = static_cast<double>(std::filesystem::file_size(path));
    if (comm.rank() == 0) evict(path);
    comm.barrier();
    t0 = clock();
    load_checkpoint(engine, comm, cfg.model, path);
    comm.barrier();
    best_load = std::min(best_load, secs(t0, clock()));
    if (!async) continue;
    // Asynchronous: the save call, then a step changing every bucket while the writer runs.
    best_step = std::min(best_step, optimizer_step());
    comm.barrier();
    t0 = clock();
    state.iteration = state.steps_taken = 2 * r + 2;
    CheckpointSave save(engine, comm, cfg.model, cfg.resolved, state, dir, 1, true);
    const double call = secs(t0, clock());
    const double step = optimizer_step();
    save.commit();
    best_async = std::min(best_async, secs(t0, clock()));
    wait_for_old_checkpoint_removal();
    settle();
    if (call + std::max(0.0, step - best_step) < best_stall) {
      best_stall = call + std::max(0.0, step - best_step);
      stall_call = call;
      stall_step = step;
      stall_alone = best_step;
    }
  }
  if (comm.rank() == 0) {
    const double write_bound = bytes / best_write / 1e9, read_bound = bytes / best_read / 1e9;
    std::printf("# so_bench ckpt: %s, %.3fM parameters, %s training, %d ranks, best of %d\n", model.c_str(),
                params / 1e6, dtype.c_str(), comm.size(), reps);
    std::printf("# %10s %12s %9s %9s %10s %10s %12s %12s %10s %10s\n", "file MiB", "B/parameter", "save s", "load s",
                "save GB/s", "load GB/s", "write bound", "read bound", "save/bound", "load/bound");
    std::printf("  %10.1f %12.2f %9.3f %9.3f %10.3f %10.3f %12.3f %12.3f %10.2f %10.2f\n", bytes / (1 << 20),
                bytes / params, best_save, best_load, bytes / best_save / 1e9, bytes / best_load / 1e9, write_bound,
                read_bound, bytes / best_save / 1e9 / write_bound, bytes / best_load / 1e9 / read_bound);
    if (async)
      std::printf(
          "# async save: stall %.3f s (the call %.3f s + the next optimizer step's extra time: %.3f s against "
          "%.3f s alone), %.3f of the synchronous save; save to commit %.3f s\n",
          best_stall, stall_call, stall_step, stall_alone, best_stall / best_save, best_async);
    std::printf("# the previous checkpoint's deletion after a commit, in the background: up to %.3f s\n", removal);
  }
  if (train_steps > 0) train_with_saves(model, dtype, dir, train_steps, train_save_every, comm);
  return 0;
}

}  // namespace so::bench
