#include "so/core/log.h"

#include <cstdio>
#include <mutex>

#include "so/core/error.h"

namespace so {

static LogLevel g_level = LogLevel::Info;
static std::mutex g_log_mutex;

void set_log_level(LogLevel level) { g_level = level; }

void log(LogLevel level, const std::string& msg) {
  if (level < g_level) return;
  static const char* names[] = {"debug", "info", "warn", "error"};
  std::lock_guard<std::mutex> lock(g_log_mutex);
  const int rank = error_rank();
  if (rank >= 0)
    std::fprintf(stderr, "[so_train %s rank %d] %s\n", names[static_cast<int>(level)], rank, msg.c_str());
  else
    std::fprintf(stderr, "[so_train %s] %s\n", names[static_cast<int>(level)], msg.c_str());
}

}  // namespace so
