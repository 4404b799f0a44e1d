#include "so/train/csv_monitor.h"

#include <algorithm>
#include <charconv>
#include <fstream>

#include "so/core/error.h"
#include "so/core/log.h"

namespace so {

CsvMonitor::CsvMonitor(const MonitorConfig& cfg, bool writer) : on_(cfg.enabled && writer) {
  if (on_) dir_ = make_monitor_directory(cfg, "csv_monitor");
}

void CsvMonitor::step_events(int64_t samples_before, double train_loss, int64_t samples_after, double next_lr) {
  if (!on_) return;
  // A failed write (a full disk) is reported once; the monitor then stops and training goes on.
  if (write("Train/Samples/train_loss", train_loss, samples_before) &&
      write("Train/Samples/lr", next_lr, samples_after))
    return;
  log_warn(str_cat("csv_monitor: writing to '", dir_, "' failed; no more CSV rows are written, training goes on"));
  on_ = false;
}

bool CsvMonitor::write(const std::string& log_name, double value, int64_t step) {
  const std::string header = log_name.substr(log_name.rfind('/') + 1);
  std::string file = log_name;
  std::replace(file.begin(), file.end(), '/', '_');
  std::replace(file.begin(), file.end(), ' ', '_');
  const std::string path = dir_ + "/" + file + ".csv";
  std::ofstream out(path, std::ios::app);
  if (started_.insert(file).second) out << "step," << header << "\r\n";
  // The shortest text that reads back as the same double, as Python's csv module writes a float.
  char text[64];
  const std::to_chars_result r = std::to_chars(text, text + sizeof(text), value);
  out << step << ',' << std::string(text, r.ptr) << "\r\n";
  out.flush();
  return out.good();
}

}  // namespace so
