#pragma once
// DeepSpeed's tensorboard monitor: rank 0 writes TensorBoard event files (what
// torch.utils.tensorboard.SummaryWriter writes, read by TensorBoard and its EventAccumulator) to
// <output_path>/<job_name>/ (deepspeed/monitor/tensorboard.py lays it out so): the run's config as
// text at the start, then every step's metrics as scalars "train/<metric>" at that step, the same
// names and values as the JSONL metrics file (as 32-bit floats, as TensorBoard holds scalars).
// The file is TFRecord-framed (length, masked CRC32C, payload, masked CRC32C), each record one
// serialized tensorflow.Event (src/train/tensorboard_event.proto).
// A directory or file that cannot be made is an error at start-up; a write that fails later (a
// full disk) is reported once and the monitor stops, training goes on.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "so/train/monitor_config.h"

namespace so {

class TensorBoardMonitor {
 public:
  // writer: this process writes (rank 0). The event file is created now, its first records the
  // file version and `config_text` (tag "config"), so a bad path fails before training starts.
  TensorBoardMonitor(const MonitorConfig& cfg, bool writer, const std::string& config_text);
  ~TensorBoardMonitor();
  TensorBoardMonitor(const TensorBoardMonitor&) = delete;
  TensorBoardMonitor& operator=(const TensorBoardMonitor&) = delete;

  // One event with these scalars at `step`.
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  bool on() const { return file_ != nullptr; }
  const std::string& path() const { return path_; }  // the event file; empty when off

 private:
  bool append(const std::string& payload);  // false: the write failed (errno says why)
  std::FILE* file_ = nullptr;
  std::string path_;
};

}  // namespace so
