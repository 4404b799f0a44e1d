#pragma once
// Checkpoints (layout: docs/checkpoints.md). One HDF5 file per checkpoint: every tensor at its
// global shape (fp32 master weights under /model, Adam moments under /optim/exp_avg and
// /optim/exp_avg_sq), contiguous and unfiltered, each with a table of CRC32C checksums of its
// segments (4 Mi-element chunks, cut where a rank's slice begins) under /checksums; the training
// state, the resolved config, the model's HF config and the manifest in a CRC32C-checked /metadata
// document. Rank 0 creates the file with every dataset allocated; every rank then writes its own
// slices (and their checksums) with pwrite at the datasets' offsets, independently, at disk speed:
// no collective I/O, no fill, each byte written once. A commit is atomic (fsync, rename, then the
// `latest` pointer) and keeps the last K. Loads verify every segment they read and reshard to any
// world size or (dp, sp) split; nothing is trusted before it is checked (docs/checkpoints.md).
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "so/engine/engine.h"
#include "so/model/model_config.h"

namespace so {

// Everything besides tensors that an exact resume needs. The sampler and the initialisation are
// counter-based, so the data position is the only "RNG state".
struct TrainState {
  int64_t iteration = 0;          // training-loop steps done, skipped ones included
  int64_t steps_taken = 0;        // optimizer steps applied (the LR schedule's position)
  int64_t data_position = 0;      // index of the next global sample
  bool last_step_redone = false;  // SuperOffload's adaptive speculation looks at the previous step
};

constexpr int kCheckpointFormatVersion = 2;

// One save. Construction is collective: the state is frozen as it is now (engine.freeze_state:
// host state is put aside only if the optimizer must change it before the writer has it; device
// state is read in place, or for an `async` save staged to host memory behind the saving step),
// rank 0 creates the file, and a thread on every rank starts writing this rank's slices. Training
// may go on meanwhile (when `async`). commit() is collective: it waits for every rank's writes to
// be durable, then publishes the checkpoint. Destroyed without a commit (an error, a crash), the
// save leaves only its temporary file; `latest` still names the last committed checkpoint.
class CheckpointSave {
 public:
  // `model` and `run_config` (the run's resolved config) are recorded in the metadata.
  CheckpointSave(Engine& engine, Communicator& comm, const ModelConfig& model, const nlohmann::json& run_config,
                 const TrainState& state, const std::string& dir, int keep, bool async);
  ~CheckpointSave();
  CheckpointSave(const CheckpointSave&) = delete;
  CheckpointSave& operator=(const CheckpointSave&) = delete;

  // This rank's writes have finished (successfully or not): commit() will not wait for them.
  bool written() const;
  // Collective. Throws naming the rank and the failure when any rank's writes failed (the
  // temporary file is then removed, nothing is published). Returns the committed file's path.
  std::string commit();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Commits hand the deletion of checkpoints beyond `keep` to a background thread (freeing a large
// file can take longer than writing it); this waits until it is done. The next save waits too.
void wait_for_old_checkpoint_removal();

// A synchronous save: CheckpointSave(...).commit().
std::string save_checkpoint(Engine& engine, Communicator& comm, const ModelConfig& model,
                            const nlohmann::json& run_config, const TrainState& state, const std::string& dir,
                            int keep);
// A checkpoint file, or a directory whose `latest` pointer names one.
std::string resolve_checkpoint(const std::string& file_or_dir);
// Loads this rank's part of every tensor into the engine (verified) and returns the state; a
// checkpoint of another model than `model` is refused. Every rank reads on its own: no collective,
// any world size.
TrainState load_checkpoint(Engine& engine, Communicator& comm, const ModelConfig& model,
                           const std::string& file_or_dir);

// Serial access for tools (so_ckpt), one process, no communicator.
struct CheckpointSummary {
  std::string path;
  int64_t format_version = 0, world_size = 0, zero_stage = 0;
  TrainState state;
  nlohmann::json config, model_config, manifest;
};
CheckpointSummary read_checkpoint_summary(const std::string& file_or_dir);
namespace ckpt {
class CheckpointFile;
}
// A checkpoint opened once and checked (its metadata, manifest, datasets and checksum tables).
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& file_or_dir);
  ~CheckpointReader();
  const CheckpointSummary& summary() const;
  // A whole tensor, e.g. "/model/model.norm.weight"; every segment's checksum verified.
  std::vector<float> tensor(const std::string& dataset) const;

 private:
  std::unique_ptr<ckpt::CheckpointFile> file_;
};
// Reads every segment of every tensor and checks it against its checksum, and the file against its
// manifest and model; returns one line per problem found (empty: intact).
std::vector<std::string> verify_checkpoint(const std::string& file_or_dir);

}  // namespace so
