#pragma once
// Byte counts as the logs, the memory plan and the metrics print them.
#include <cstddef>

namespace so {

constexpr double mib(size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

}  // namespace so
