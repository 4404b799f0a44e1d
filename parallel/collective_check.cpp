#include "parallel/collective_check.h"

#include <cstring>

#include "so/core/error.h"
#include "so/core/random.h"

namespace so {

namespace {

constexpr uint64_t kCheckSeed = 0x636f6c6c;

// Every rank's value of element i of its input, reduced as the collective does.
float reduced(const CheckSpec& s, int64_t i) {
  float sum = 0.0f;
  for (int r = 0; r < s.ranks; ++r) sum += check_input(r, i);
  return s.op == ReduceOp::Avg ? sum / static_cast<float>(s.ranks) : sum;
}

float expected(const CheckSpec& s, int64_t j) {
  const int64_t block = j / s.count, within = j % s.count;  // j exists only when count > 0
  switch (s.collective) {
    case Collective::AllReduce: return reduced(s, j);
    case Collective::ReduceScatter: return reduced(s, s.rank * s.count + j);
    case Collective::AllGather: return check_input(static_cast<int>(block), within);
    case Collective::AllToAll: return check_input(static_cast<int>(block), s.rank * s.count + within);
    case Collective::Broadcast: return check_input(s.root, j);
  }
  SO_FAIL("unknown collective");
}

}  // namespace

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::AllReduce: return "all_reduce";
    case Collective::AllGather: return "all_gather";
    case Collective::ReduceScatter: return "reduce_scatter";
    case Collective::AllToAll: return "all_to_all";
    case Collective::Broadcast: return "broadcast";
  }
  return "?";
}

Collective parse_collective(const std::string& name) {
  std::string known;
  for (Collective c : kAllCollectives) {
    if (name == collective_name(c)) return c;
    known += str_cat(known.empty() ? "" : ", ", collective_name(c));
  }
  SO_FAIL("unknown collective '", name, "' (known: ", known, ")");
}

bool is_reduction(Collective c) { return c == Collective::AllReduce || c == Collective::ReduceScatter; }

int64_t send_elements(Collective c, int64_t count, int ranks) {
  return c == Collective::ReduceScatter || c == Collective::AllToAll ? count * ranks : count;
}

int64_t recv_elements(Collective c, int64_t count, int ranks) {
  return c == Collective::AllGather || c == Collective::AllToAll ? count * ranks : count;
}

float check_input(int rank, int64_t i) {
  // k/64 with 1 <= |k| <= 255: 8 significant bits (exact in bf16), and any sum over fewer than
  // 2^16 ranks stays within fp32's 24 bits.
  const uint64_t u = random_u64(kCheckSeed, static_cast<uint64_t>(rank), static_cast<uint64_t>(i));
  const float k = static_cast<float>(1 + u % 255);
  return (u >> 32 & 1 ? -k : k) / 64.0f;
}

void fill_check_input(void* dst, int64_t n, DType dt, int rank) {
  for (int64_t i = 0; i < n; ++i) {
    if (dt == DType::F32)
      static_cast<float*>(dst)[i] = check_input(rank, i);
    else
      static_cast<bf16*>(dst)[i] = f32_to_bf16(check_input(rank, i));
  }
}

int64_t count_wrong(const CheckSpec& spec, const void* recv) {
  const int64_t n = recv_elements(spec.collective, spec.count, spec.ranks);
  int64_t wrong = 0;
  for (int64_t j = 0; j < n; ++j) {
    const float want = expected(spec, j);
    if (spec.dt == DType::F32) {
      wrong += std::memcmp(&want, static_cast<const float*>(recv) + j, 4) != 0;
    } else {
      wrong += static_cast<const bf16*>(recv)[j].bits != f32_to_bf16(want).bits;
    }
  }
  return wrong;
}

}  // namespace so
