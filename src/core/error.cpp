#include "so/core/error.h"

#include <atomic>

namespace so {

static std::atomic<int> g_rank{-1};

void set_error_rank(int rank) { g_rank.store(rank); }
int error_rank() { return g_rank.load(); }

void throw_error(const char* file, int line, const std::string& msg) {
  const char* base = file;
  for (const char* p = file; *p; ++p)
    if (*p == '/') base = p + 1;
  const int rank = g_rank.load();
  std::string where = rank >= 0 ? str_cat("[rank ", rank, "] ") : std::string();
  throw Error(str_cat(where, msg, " (", base, ":", line, ")"));
}

}  // namespace so
