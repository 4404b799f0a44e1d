#pragma once
// What DeepSpeed's monitors share (deepspeed/monitor/config.py): on or off, and the directory
// <output_path>/<job_name>/ their files go to.
#include <string>

namespace so {

struct MonitorConfig {
  bool enabled = false;
  std::string output_path;                    // DeepSpeed's default "": job_name relative to the cwd
  std::string job_name = "DeepSpeedJobName";  // DeepSpeed's default
};

// DeepSpeed's wandb section (deepspeed/monitor/config.py). so_train (C++) writes no wandb run
// itself: scripts/wandb_log.py logs the --metrics file through the official client, with these.
struct WandbConfig {
  bool enabled = false;
  std::string group, team;            // team: wandb's entity
  std::string project = "deepspeed";  // DeepSpeed's default
};

// Creates <output_path>/<job_name>/ and returns it; an error naming `monitor` and the path when it
// cannot be made (so a bad path fails before training starts).
std::string make_monitor_directory(const MonitorConfig& cfg, const char* monitor);

}  // namespace so
