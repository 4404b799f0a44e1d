#include "so/optim/adam_prefetch.h"

#include <cstdlib>

#include "so/core/error.h"

namespace so {

namespace {

std::string cpu_vendor() {
#if defined(__x86_64__)
  if (__builtin_cpu_is("amd")) return "amd";
  if (__builtin_cpu_is("intel")) return "intel";
#endif
  return "";
}

}  // namespace

int64_t default_adam_prefetch_ahead(const std::string& vendor) { return vendor == "amd" ? 0 : 512; }

int64_t adam_prefetch_ahead() {
  static const int64_t ahead = [] {
    const char* env = std::getenv("SO_ADAM_PREFETCH");
    if (env == nullptr || *env == '\0') return default_adam_prefetch_ahead(cpu_vendor());
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    SO_CHECK(*end == '\0' && v >= 0 && v <= (1 << 20), "SO_ADAM_PREFETCH='", env,
             "': expected elements to prefetch ahead, 0 to 1048576 (0: no software prefetch)");
    return static_cast<int64_t>(v);
  }();
  return ahead;
}

}  // namespace so
