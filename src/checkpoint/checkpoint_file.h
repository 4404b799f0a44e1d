#pragma once
// The on-disk format of a checkpoint (docs/checkpoints.md), shared by the writer (checkpoint.cpp)
// and every reader: dataset names, segments and their checksum tables, the metadata document, the
// HDF5 structure, and a reader that checks all of it before any tensor data is believed.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "so/checkpoint/checkpoint.h"
#include "so/engine/engine.h"
#include "so/io/direct_io_file.h"
#include "so/model/param_layout.h"

namespace so::ckpt {

constexpr char kFormat[] = "so_train checkpoint";
constexpr int64_t kChunkElements = int64_t{1} << 20;  // checksum granularity: 4 MiB of fp32

// Elements [first, first + count) of a flattened tensor.
struct Segment {
  int64_t first = 0, count = 0;
};
// The segments the saving ranks write: each rank's slice cut at chunk boundaries, in order. The
// slices must tile [0, numel) (one per writing rank; empty ones are skipped).
std::vector<Segment> cut_segments(std::vector<Segment> slices, int64_t numel);

struct TensorGroup {
  OptimState which;
  const char* path;  // "/model", "/optim/exp_avg", "/optim/exp_avg_sq"
};
extern const TensorGroup kGroups[3];
std::string data_name(const TensorGroup& g, const std::string& param);      // "/model/<param>"
std::string checksum_name(const TensorGroup& g, const std::string& param);  // "/checksums/model/<param>"

// Every tensor the model has, in the form the metadata stores it.
nlohmann::json manifest_of(const ParamLayout& layout);
// The metadata document (the training state, where it came from, the model and its tensors).
nlohmann::json make_metadata(const TrainState& state, int world_size, int zero_stage, const nlohmann::json& config,
                             const nlohmann::json& model_config, const ParamLayout& layout);

// Rank 0: the file with its metadata and every dataset allocated (contiguous, no fill), so that
// each rank can then pwrite its part at the dataset's offset. tables[i] is the number of segments
// of manifest tensor i (the same for the three groups). The checksum tables come first, then the
// data in the order the writers go (`write_order`: every tensor id once, each with its three
// groups), so that a save is one stream forward through the file: a virtual disk measured here
// wrote three interleaved streams (the groups in turn) at 0.8 of its sequential rate.
// First it checks that the file fits (check_room): HDF5 1.10 crashes at exit after a failed write
// of its own (HDFGroup/hdf5#2496), so a full disk or a file-size limit must be found before it writes.
void create_file(const std::string& path, const nlohmann::json& metadata, const ParamLayout& layout,
                 const std::vector<int64_t>& segments_per_tensor, const std::vector<int>& write_order);
// Fails, naming both numbers, when `bytes` more do not fit in the filesystem holding `dir` (space
// available to this user) or exceed the process's file-size limit (ulimit -f).
void check_room(const std::string& dir, uint64_t bytes);
// The byte offsets of the named datasets in a file create_file made.
std::map<std::string, uint64_t> dataset_offsets(const std::string& path, const std::vector<std::string>& datasets);

// The /metadata document (after its checksum passed), every field checked: the training state
// within its bounds, the format, the model config, and the manifest equal to that model's tensors.
// `where` names the file in errors.
void parse_metadata(std::string_view text, const std::string& where, CheckpointSummary& summary, ParamLayout& layout);

// A checkpoint file opened and checked: its metadata's checksum and fields, the manifest against
// the model it names, every dataset's type, layout, shape and extent against the file, and every
// checksum table's coverage. Reads are served from the file by DirectIoFile (around the page
// cache), each segment verified; one reader at a time (the bounce buffer is shared).
class CheckpointFile {
 public:
  explicit CheckpointFile(const std::string& path);
  ~CheckpointFile();
  CheckpointFile(const CheckpointFile&) = delete;
  CheckpointFile& operator=(const CheckpointFile&) = delete;

  const std::string& path() const { return path_; }
  const CheckpointSummary& summary() const { return summary_; }
  const ParamLayout& layout() const { return layout_; }
  int64_t numel(const std::string& dataset) const { return tensor(dataset).numel; }
  // Elements [first, first + count) of a tensor handed to deliver(values, element, n) in order,
  // straight from the I/O buffers; every segment they touch is read whole, and its checksum
  // checked once its last byte has passed. A failing segment throws, naming the dataset and the
  // elements — after values of it may have been delivered: a caller whose read throws discards
  // what it got (a failed load is fatal to the run).
  using Deliver = std::function<void(const float* values, int64_t element, int64_t n)>;
  void read_to(const std::string& dataset, int64_t first, int64_t count, const Deliver& deliver) const;
  // The order to read these slices in (indices into `slices`: the file's order, whatever order
  // the datasets were written in), and the file told to read ahead their bytes in that order and
  // no others (a rank reads no other rank's slices).
  struct Slice {
    std::string dataset;
    int64_t first, count;
  };
  std::vector<size_t> plan_reads(const std::vector<Slice>& slices) const;
  // The same into memory: out[0, count).
  void read_into(const std::string& dataset, int64_t first, int64_t count, float* out) const;
  std::vector<float> read(const std::string& dataset, int64_t first, int64_t count) const;
  // Every segment of every tensor checked; one line per problem.
  std::vector<std::string> verify_all() const;

 private:
  struct Tensor {
    int64_t numel = 0;
    uint64_t data_offset = 0;
    std::vector<Segment> segments;
    std::vector<uint32_t> crcs;
  };
  const Tensor& tensor(const std::string& dataset) const;
  const Tensor& checked_slice(const std::string& dataset, int64_t first, int64_t count) const;
  // The segments holding elements [first, first + count), count > 0: the first one's index, and
  // the elements [lo, hi) they cover.
  struct SegmentSpan {
    size_t seg = 0;
    int64_t lo = 0, hi = 0;
  };
  static SegmentSpan segments_of(const Tensor& t, int64_t first, int64_t count);

  std::string path_;
  std::unique_ptr<DirectIoFile> file_;
  CheckpointSummary summary_;
  ParamLayout layout_;
  std::map<std::string, Tensor> tensors_;
};

}  // namespace so::ckpt
