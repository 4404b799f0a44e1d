#pragma once
// Minimal rank-aware logging to stderr; training progress goes to stdout through train/metrics.
#include <string>

namespace so {

enum class LogLevel { Debug, Info, Warn, Error };
void set_log_level(LogLevel level);
void log(LogLevel level, const std::string& msg);
inline void log_info(const std::string& msg) { log(LogLevel::Info, msg); }
inline void log_warn(const std::string& msg) { log(LogLevel::Warn, msg); }

}  // namespace so
