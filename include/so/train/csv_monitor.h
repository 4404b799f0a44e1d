#pragma once
// DeepSpeed's csv_monitor: the training events of rank 0 as CSV files, laid out as DeepSpeed's
// csvMonitor writes them (deepspeed/monitor/csv_monitor.py), so tools that read those read these:
// one file per event in <output_path>/<job_name>/, named after the event with '/' and ' ' turned
// into '_' ("Train/Samples/train_loss" -> Train_Samples_train_loss.csv), appended to, with the
// header "step,<last part of the name>" written the first time this process writes the file, then
// one "<global samples>,<value>" row per event. A directory that cannot be made is an error at
// start-up; a write that fails later (a full disk) is reported once, the monitor stops and training
// goes on.
#include <cstdint>
#include <set>
#include <string>

#include "so/train/monitor_config.h"

namespace so {

class CsvMonitor {
 public:
  // writer: this process writes (rank 0); the directory is made now, so a bad path fails at start.
  CsvMonitor(const MonitorConfig& cfg, bool writer);
  // The events DeepSpeed's engine writes per optimizer step, with its x values: the step's loss at
  // the samples seen before it (written in backward), and after the step the learning rate the
  // scheduler has set for the next one, at the samples seen after it.
  void step_events(int64_t samples_before, double train_loss, int64_t samples_after, double next_lr);
  const std::string& directory() const { return dir_; }

 private:
  bool write(const std::string& log_name, double value, int64_t step);  // false: the write failed
  bool on_ = false;
  std::string dir_;
  std::set<std::string> started_;  // files whose header this process has written
};

}  // namespace so
