#pragma once
// Every rank of a job must train the same run: the same model, batch, optimizer, parallel layout
// and data. Ranks started with different configs (MPMD, a stale file on one node, a different
// --set) would otherwise issue collectives of different sizes and corrupt memory, or train to the
// end with silently different hyper-parameters.
#include <nlohmann/json.hpp>

#include "parallel/communicator.h"

namespace so {

// Collective over `comm`: compares each top-level entry of `sections` across ranks (a 64-bit hash
// of its compact JSON, reduced as exact small integers) and throws on every rank, naming the first
// entry that differs and this rank's value of it, when any rank's differs.
void check_ranks_agree(const nlohmann::json& sections, Communicator& comm);

}  // namespace so
