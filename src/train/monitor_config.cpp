#include "so/train/monitor_config.h"

#include <filesystem>

#include "so/core/error.h"

namespace so {

std::string make_monitor_directory(const MonitorConfig& cfg, const char* monitor) {
  const std::string dir = (std::filesystem::path(cfg.output_path) / cfg.job_name).string();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  SO_CHECK(!ec && std::filesystem::is_directory(dir), monitor, ": cannot create the directory '", dir, "'",
           ec ? str_cat(": ", ec.message()) : "");
  return dir;
}

}  // namespace so
