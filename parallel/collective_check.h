#pragma once
// Verifiable data for collectives, shared by the tests and so_bench comm's "#wrong" column (as in
// nccl-tests): deterministic per-rank inputs whose sums over ranks are exact in fp32 in any
// order, so every collective's expected output is known bit for bit on every rank, whichever
// order the library reduces in.
#include <cstdint>
#include <string>

#include "parallel/communicator.h"

namespace so {

enum class Collective { AllReduce, AllGather, ReduceScatter, AllToAll, Broadcast };
constexpr Collective kAllCollectives[] = {Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter,
                                          Collective::AllToAll, Collective::Broadcast};
const char* collective_name(Collective c);  // "all_reduce", "all_gather", ...
// Fails naming the known collectives when `name` is none of them.
Collective parse_collective(const std::string& name);
bool is_reduction(Collective c);

// Elements of the send and recv buffers of collective c on `ranks` ranks, `count` being the
// interface's count argument (all_reduce and broadcast have one buffer: both are `count`).
int64_t send_elements(Collective c, int64_t count, int ranks);
int64_t recv_elements(Collective c, int64_t count, int ranks);

// Input element i of `rank`: a random non-zero multiple of 1/64 in (-4, 4), exact in bf16.
float check_input(int rank, int64_t i);
// dst[0..n) = check_input(rank, 0..n) in dtype dt; dst is host-addressable.
void fill_check_input(void* dst, int64_t n, DType dt, int rank);

struct CheckSpec {
  Collective collective;
  ReduceOp op;  // reductions only
  DType dt;
  int64_t count;  // as passed to the collective
  int ranks, rank;
  int root;  // broadcast only
};
// How many of the recv_elements() outputs `recv` of `spec.rank` differ from the expected bits,
// each rank's send buffer (for broadcast: its buffer) having been fill_check_input(.., rank).
int64_t count_wrong(const CheckSpec& spec, const void* recv);

}  // namespace so
