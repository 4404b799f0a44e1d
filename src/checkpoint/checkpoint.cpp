#include "so/checkpoint/checkpoint.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "checkpoint_file.h"
#include "so/core/error.h"
#include "so/core/json_reader.h"
#include "so/core/log.h"
#include "so/io/atomic_file.h"
#include "so/io/crc32c.h"
#include "so/io/direct_io_file.h"

namespace so {

namespace fs = std::filesystem;

namespace {

constexpr const char* kLatest = "latest";

std::string step_file_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08lld.h5", static_cast<long long>(step));
  return buf;
}

// Agreement over the job: each rank passes its own failure (empty: none); every rank throws when
// any failed, the failing ranks with their own message.
void agree(Communicator& comm, const std::string& error, const std::string& what) {
  double failed = error.empty() ? 0.0 : 1.0;
  comm.all_reduce_sum(&failed, 1);
  if (!error.empty()) throw Error(error);
  if (failed > 0) throw Error(str_cat(what, " failed on ", failed, " other rank(s); see their messages"));
}

// Old checkpoints are deleted on a thread of their own, after the new one is committed: freeing a
// large file's blocks can take longer than writing them (file systems mounted with online discard,
// Lustre), and nothing needs to wait for it. A deletion a crash cuts short is redone by the next
// commit, which lists the directory. The next save waits for pending deletions before it checks
// the free space.
class OldCheckpointRemover {
 public:
  static OldCheckpointRemover& instance() {
    static OldCheckpointRemover remover;
    return remover;
  }
  void remove(std::vector<fs::path> files) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.insert(pending_.end(), files.begin(), files.end());
      if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    }
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return pending_.empty() && !busy_; });
  }
  ~OldCheckpointRemover() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();  // what is queued is removed first
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
      if (pending_.empty()) return;
      const fs::path file = pending_.front();
      pending_.erase(pending_.begin());
      busy_ = true;
      lock.unlock();
      std::error_code ec;
      fs::remove(file, ec);
      if (ec)
        log_warn(str_cat("checkpoint: could not remove the old checkpoint '", file.string(), "': ", ec.message()));
      lock.lock();
      busy_ = false;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<fs::path> pending_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace

// ---- saving ------------------------------------------------------------------------------------

struct CheckpointSave::Impl {
  Engine& engine;
  Communicator& comm;
  int keep;
  fs::path folder, partial, final_path;
  // Per manifest tensor: its segments (all ranks'), and where this rank writes in each group.
  std::vector<std::vector<ckpt::Segment>> segments;
  std::map<std::string, uint64_t> offsets;
  std::unique_ptr<DirectIoFile> file;  // this rank's writes
  std::thread writer;
  std::atomic<bool> written{false};
  std::string error;  // of this rank's writer; read after `written`
  bool committed = false;

  Impl(Engine& e, Communicator& c, int k) : engine(e), comm(c), keep(k) {}
  void write_all();
};

CheckpointSave::CheckpointSave(Engine& engine, Communicator& comm, const ModelConfig& model,
                               const nlohmann::json& run_config, const TrainState& state, const std::string& dir,
                               int keep, bool async)
    : impl_(std::make_unique<Impl>(engine, comm, keep)) {
  SO_CHECK(keep >= 1, "checkpoint: keep must be at least 1, is ", keep);
  Impl& s = *impl_;
  s.folder = dir;
  s.final_path = s.folder / step_file_name(state.steps_taken);
  s.partial = s.folder / str_cat(".", step_file_name(state.steps_taken), ".partial");
  const ParamLayout& layout = engine.layout();
  // The state as of now, whatever the optimizer does next.
  engine.freeze_state(async ? Engine::DeviceSnapshot::Staged : Engine::DeviceSnapshot::InPlace);

  std::vector<int64_t> counts;
  std::vector<int> write_order;  // the writer's: bucket by bucket
  for (const Bucket& b : engine.buckets()) write_order.insert(write_order.end(), b.params.begin(), b.params.end());
  for (size_t id = 0; id < layout.params.size(); ++id) {
    std::vector<ckpt::Segment> slices;
    for (int r = 0; r < comm.size(); ++r) {
      const ParamSlice sl = engine.saved_slice(static_cast<int>(id), r);
      slices.push_back({sl.first, sl.count});
    }
    s.segments.push_back(ckpt::cut_segments(slices, layout.params[id].numel));
    counts.push_back(static_cast<int64_t>(s.segments.back().size()));
  }

  // A save that fails before its writer starts releases the snapshot and leaves no file behind.
  const auto abandon = [&] {
    for (size_t b = 0; b < engine.buckets().size(); ++b) engine.with_frozen(b, [](const Engine::FrozenBucket&) {});
    s.file.reset();
    std::error_code ec;
    if (comm.rank() == 0) fs::remove(s.partial, ec);
  };
  std::string error;
  if (comm.rank() == 0) {
    try {
      OldCheckpointRemover::instance().wait();
      std::error_code ec;
      fs::create_directories(s.folder, ec);
      SO_CHECK(!ec, "cannot create checkpoint directory '", dir, "': ", ec.message());
      // Temporary files of saves that never committed (a crash, a full disk) go first.
      for (const auto& entry : fs::directory_iterator(s.folder)) {
        const std::string n = entry.path().filename().string();
        if (n.rfind(".step-", 0) == 0 && n.size() > 8 && n.substr(n.size() - 8) == ".partial") fs::remove(entry.path());
      }
      ckpt::create_file(
          s.partial.string(),
          ckpt::make_metadata(state, comm.size(), engine.zero_stage(), run_config, model.to_hf_json(), layout), layout,
          counts, write_order);
    } catch (const std::exception& e) {
      error = str_cat("checkpoint save to '", dir, "': ", e.what());
    }
  }
  try {
    agree(comm, error, "checkpoint save");
  } catch (...) {
    abandon();
    throw;
  }

  // Every rank: where its datasets lie, then its slices on a thread of their own.
  std::vector<std::string> names;
  for (const ckpt::TensorGroup& g : ckpt::kGroups)
    for (const ParamInfo& p : layout.params) {
      names.push_back(ckpt::data_name(g, p.name));
      names.push_back(ckpt::checksum_name(g, p.name));
    }
  try {
    s.offsets = ckpt::dataset_offsets(s.partial.string(), names);
    s.file = std::make_unique<DirectIoFile>(s.partial.string(), DirectIoFile::Mode::Write);
  } catch (const std::exception& e) {
    error = e.what();
  }
  try {
    agree(comm, error, "checkpoint save");
  } catch (...) {
    abandon();
    throw;
  }
  s.writer = std::thread([&s] { s.write_all(); });
}

// This rank's slices, bucket by bucket in the order the optimizer changes them (backward order),
// each segment copied from wherever the state lives straight into the I/O buffers and checksummed
// there as it goes (the bytes are in the cache), then fdatasync. Every bucket is taken even after
// a failure, so the optimizer stops copying them aside.
void CheckpointSave::Impl::write_all() {
  const ParamLayout& layout = engine.layout();
  const int rank = comm.rank();
  // Tests slow the writer down after each bucket, so that the steps after the save overtake it and
  // copy buckets aside (the first bucket is read at once, while the optimizer may still finish it).
  const char* delay = std::getenv("SO_CKPT_TEST_WRITER_DELAY");
  for (size_t b = 0; b < engine.buckets().size(); ++b)
    engine.with_frozen(b, [&](const Engine::FrozenBucket& frozen) {
      if (!error.empty()) return;
      try {
        for (int id : engine.buckets()[b].params) {
          const ParamSlice mine = engine.saved_slice(id, rank);
          if (mine.count == 0) continue;
          const ParamInfo& p = layout.params[id];
          const std::optional<OwnedPart> part = owned_part(engine.shards(), engine.buckets()[b], b, p.offset, p.numel);
          SO_CHECK(part && part->src == mine.first && part->n == mine.count, "checkpoint: slice of ", p.name);
          const int64_t at = part->dst - engine.bucket_shard_begin(b);  // in the bucket's shard
          const std::vector<ckpt::Segment>& segs = segments[id];
          for (const ckpt::TensorGroup& g : ckpt::kGroups) {
            const std::string name = ckpt::data_name(g, p.name);
            const uint64_t data_at = offsets.at(name), table_at = offsets.at(ckpt::checksum_name(g, p.name));
            for (size_t i = 0; i < segs.size(); ++i) {
              if (segs[i].first < mine.first || segs[i].first >= mine.first + mine.count) continue;
              const size_t src = static_cast<size_t>(at + segs[i].first - mine.first) * 4;
              uint32_t crc = 0;
              file->write_from(
                  static_cast<size_t>(segs[i].count) * 4, data_at + static_cast<uint64_t>(segs[i].first) * 4,
                  [&](char* dst, size_t from, size_t n) {
                    frozen.copy(g.which, src + from, n, dst);
                    crc = crc32c(dst, n, crc);
                  },
                  str_cat("checkpoint save: ", name));
              const uint64_t entry[3] = {static_cast<uint64_t>(segs[i].first), static_cast<uint64_t>(segs[i].count),
                                         crc};
              file->write_at(entry, sizeof entry, table_at + i * sizeof entry,
                             str_cat("checkpoint save: checksums of ", name));
            }
          }
        }
      } catch (const std::exception& e) {
        error = str_cat("checkpoint save: ", e.what());
      }
      if (delay) std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(delay)));
    });
  if (error.empty()) {
    try {
      file->sync("checkpoint save");
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  written = true;
}

CheckpointSave::~CheckpointSave() {
  Impl& s = *impl_;
  if (s.writer.joinable()) s.writer.join();
  s.file.reset();
  if (!s.committed && s.comm.rank() == 0) {  // never published: only the temporary file goes
    std::error_code ec;
    fs::remove(s.partial, ec);
  }
}

bool CheckpointSave::written() const { return impl_->written.load(); }

std::string CheckpointSave::commit() {
  Impl& s = *impl_;
  SO_CHECK(!s.committed, "checkpoint: committed twice");
  s.writer.join();
  agree(s.comm, s.error, "checkpoint save");
  // Crash-safety tests kill the job here: everything written, nothing committed yet.
  if (const char* pause = std::getenv("SO_CKPT_TEST_PAUSE_BEFORE_COMMIT"); pause && s.comm.rank() == 0) {
    std::fprintf(stderr, "checkpoint: paused before committing %s\n", s.final_path.c_str());
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(pause)));
  }
  std::string error;
  if (s.comm.rank() == 0) {
    try {
      publish_file(s.partial.string(), s.final_path.string());
      write_file_atomically((s.folder / kLatest).string(), s.final_path.filename().string() + "\n");
      // Keep the newest `keep` checkpoints; never the one `latest` names.
      std::vector<fs::path> old;
      for (const auto& e : fs::directory_iterator(s.folder)) {
        const std::string n = e.path().filename().string();
        if (n.rfind("step-", 0) == 0 && e.path().extension() == ".h5") old.push_back(e.path());
      }
      std::sort(old.begin(), old.end());
      std::vector<fs::path> retired;
      for (size_t i = 0; i + static_cast<size_t>(s.keep) < old.size(); ++i)
        if (old[i] != s.final_path) retired.push_back(old[i]);
      OldCheckpointRemover::instance().remove(std::move(retired));
    } catch (const std::exception& e) {
      error = str_cat("checkpoint commit of '", s.final_path.string(), "': ", e.what());
    }
  }
  agree(s.comm, error, "checkpoint commit");
  s.committed = true;
  return s.final_path.string();
}

void wait_for_old_checkpoint_removal() { OldCheckpointRemover::instance().wait(); }

std::string save_checkpoint(Engine& engine, Communicator& comm, const ModelConfig& model,
                            const nlohmann::json& run_config, const TrainState& state, const std::string& dir,
                            int keep) {
  return CheckpointSave(engine, comm, model, run_config, state, dir, keep, false).commit();
}

// ---- loading -----------------------------------------------------------------------------------

std::string resolve_checkpoint(const std::string& file_or_dir) {
  const fs::path p(file_or_dir);
  std::error_code ec;
  const fs::file_status st = fs::status(p, ec);
  // Only a missing path "does not exist": a symlink loop or a denied directory says what it is.
  SO_CHECK(!ec || ec == std::errc::no_such_file_or_directory, "checkpoint '", file_or_dir, "' cannot be opened: ",
           ec == std::errc::too_many_symbolic_link_levels ? "a loop of symbolic links" : ec.message());
  SO_CHECK(fs::exists(st), "checkpoint '", file_or_dir, "' does not exist");
  if (!fs::is_directory(st)) return file_or_dir;
  const fs::path latest = p / kLatest;
  SO_CHECK(fs::is_regular_file(latest, ec), "checkpoint directory '", file_or_dir, "' has no '", kLatest, "' pointer");
  std::ifstream in(latest);
  std::string name;
  std::getline(in, name);
  SO_CHECK(
      !name.empty() && name.size() < 256 && name.find('/') == std::string::npos && fs::is_regular_file(p / name, ec),
      "'", latest.string(), "' names '", name.substr(0, 256), "', which is not a checkpoint file in that directory");
  return (p / name).string();
}

TrainState load_checkpoint(Engine& engine, Communicator& comm, const ModelConfig& model,
                           const std::string& file_or_dir) {
  (void)comm;  // every rank reads its own part: nothing to agree on
  const ckpt::CheckpointFile file(resolve_checkpoint(file_or_dir));
  SO_CHECK(file.summary().model_config == model.to_hf_json(), "checkpoint '", file.path(),
           "' holds a different model: ", brief_json(file.summary().model_config), " vs the config's ",
           brief_json(model.to_hf_json()));
  const ParamLayout& layout = engine.layout();
  SO_CHECK(ckpt::manifest_of(file.layout()) == ckpt::manifest_of(layout), "checkpoint '", file.path(),
           "': its tensors differ from the model's");
  // Straight from the I/O buffers into the engine: no buffer of our own, no fresh pages per tensor;
  // only this rank's slices read from the disk.
  std::vector<ckpt::CheckpointFile::Slice> slices;
  for (const ckpt::TensorGroup& g : ckpt::kGroups)
    for (size_t id = 0; id < layout.params.size(); ++id) {
      const ParamSlice mine = engine.owned_slice(static_cast<int>(id));
      slices.push_back({ckpt::data_name(g, layout.params[id].name), mine.first, mine.count});
    }
  for (const size_t i : file.plan_reads(slices)) {
    const ckpt::CheckpointFile::Slice& sl = slices[i];
    const int id = static_cast<int>(i % layout.params.size());
    const ckpt::TensorGroup& g = ckpt::kGroups[i / layout.params.size()];
    file.read_to(sl.dataset, sl.first, sl.count, [&](const float* values, int64_t element, int64_t n) {
      engine.write_owned(id, g.which, element - sl.first, values, n);
    });
  }
  const TrainState s = file.summary().state;
  engine.restore_counters(s.iteration, s.steps_taken, s.last_step_redone);
  return s;
}

CheckpointSummary read_checkpoint_summary(const std::string& file_or_dir) {
  return ckpt::CheckpointFile(resolve_checkpoint(file_or_dir)).summary();
}

CheckpointReader::CheckpointReader(const std::string& file_or_dir)
    : file_(std::make_unique<ckpt::CheckpointFile>(resolve_checkpoint(file_or_dir))) {}
CheckpointReader::~CheckpointReader() = default;
const CheckpointSummary& CheckpointReader::summary() const { return file_->summary(); }
std::vector<float> CheckpointReader::tensor(const std::string& dataset) const {
  return file_->read(dataset, 0, file_->numel(dataset));
}

std::vector<std::string> verify_checkpoint(const std::string& file_or_dir) {
  try {
    return ckpt::CheckpointFile(resolve_checkpoint(file_or_dir)).verify_all();
  } catch (const Error& e) {
    return {e.what()};
  }
}

}  // namespace so
