#include "so/train/rank_agreement.h"

#include <cstdint>
#include <string>
#include <vector>

#include "so/core/error.h"
#include "so/core/json_reader.h"

namespace so {

namespace {

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace

void check_ranks_agree(const nlohmann::json& sections, Communicator& comm) {
  SO_CHECK(sections.is_object(), "check_ranks_agree: the sections must be a JSON object");
  if (comm.size() == 1) return;
  // Each hash as four 16-bit digits d; all_reduce_sum gives sum(d) and sum(d^2) over the ranks,
  // exact in double up to 2^20 ranks. Every rank holds the same d iff sum = n d and sum2 = n d^2
  // (zero variance), a test each rank can make about its own digits.
  constexpr int kDigits = 4;
  std::vector<std::string> names;
  std::vector<double> sums;
  for (const auto& [name, value] : sections.items()) {
    names.push_back(name);
    const uint64_t h = fnv1a64(value.dump());
    for (int k = 0; k < kDigits; ++k) {
      const double d = static_cast<double>((h >> (16 * k)) & 0xffff);
      sums.push_back(d);
      sums.push_back(d * d);
    }
  }
  std::vector<double> own = sums;
  comm.all_reduce_sum(sums.data(), static_cast<int>(sums.size()));
  const double n = comm.size();
  for (size_t i = 0; i < names.size(); ++i)
    for (int k = 0; k < kDigits; ++k) {
      const size_t j = 2 * (i * kDigits + k);
      if (sums[j] != n * own[j] || sums[j + 1] != n * own[j + 1])
        SO_FAIL("the ranks of this job were started with different run configs: '", names[i], "' differs (rank ",
                comm.rank(), " of ", comm.size(), " has ", brief_json(sections[names[i]]),
                "); every rank must run the same config, model and command-line overrides");
    }
}

}  // namespace so
