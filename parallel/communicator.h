#pragma once
// The collectives the engine needs, over one process group. The MPI implementation serves the
// CPU backend (and bootstraps NCCL); a NCCL one implements the same interface for CUDA.
//
// Host-side calls (all_reduce_sum, barrier, split) block the calling thread. Buffer collectives
// are enqueued in order on a backend stream (normally StreamKind::Comm) and run when the stream
// reaches them; their buffers are backend ("device") memory. They need attach(backend) first;
// argument errors (not attached, bad count, root or aliasing) throw at the call, failures of the
// collective itself surface at the stream's next synchronize. Every rank of a group must issue
// the group's buffer collectives in the same order on one stream (or streams ordered by events),
// as with NCCL; host-side calls may overlap them. The communicator must outlive enqueued work.
// Element types are fp32 or bf16; bf16 reductions accumulate in fp32 and round once at the end.
// Buffers must not overlap except as each collective allows below.
#include <cstdint>
#include <memory>
#include <string>

#include "so/core/dtype.h"

namespace so {

class Backend;
class Stream;

enum class ReduceOp { Sum, Avg };  // Avg = Sum / group size

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "world", "dp", "sp": named in every error
  // The communicator serving this one's host-side calls: itself, or the MPI communicator a NCCL
  // one wraps. MPI-aware libraries (parallel HDF5) are handed its MPI communicator.
  virtual const Communicator& host() const { return *this; }

  // Blocking, host-side: used for scalars (gradient norm, finite flags, loss).
  virtual void all_reduce_sum(double* values, int count) = 0;
  virtual void barrier() = 0;
  // The ranks of this group with the same `color`, ordered by `key` (MPI_Comm_split). Collective
  // over this group. The child is attached to the same backend as this one.
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name) = 0;

  // Buffer collectives enqueue on streams of this backend.
  virtual void attach(Backend& backend) = 0;
  // recv[size * count] = every rank's send[count], in rank order. In place: send == recv +
  // rank * count (ZeRO-3 gathering around its own shard).
  virtual void all_gather(Stream& s, void* recv, const void* send, int64_t count, DType dt) = 0;
  // recv[count] = op over ranks of send[rank * count .. (rank + 1) * count). In place: recv ==
  // send + rank * count (ZeRO-3 keeping its gradient shard); the rest of send is then clobbered.
  virtual void reduce_scatter(Stream& s, void* recv, const void* send, int64_t count, DType dt, ReduceOp op) = 0;
  virtual void all_reduce(Stream& s, void* buf, int64_t count, DType dt, ReduceOp op) = 0;
  // Block j of send (count elements) goes to rank j; block i of recv came from rank i. In place:
  // recv == send.
  virtual void all_to_all(Stream& s, void* recv, const void* send, int64_t count, DType dt) = 0;
  virtual void broadcast(Stream& s, void* buf, int64_t count, DType dt, int root) = 0;
};

// The 2-D mesh of ZeRO-3 data parallelism x Ulysses sequence parallelism. World rank
// r = dp_rank * sp_size + sp_rank: the ranks of one sequence-parallel group are neighbours (on
// one node whenever sp_size divides the ranks per node), and a data-parallel group takes one rank
// from each.
struct ProcessGroups {
  std::unique_ptr<Communicator> world, dp, sp;
  int dp_size = 1, sp_size = 1, dp_rank = 0, sp_rank = 0;
};
// Fails, naming both numbers, when sp_size does not divide the world size.
ProcessGroups make_process_groups(std::unique_ptr<Communicator> world, int sp_size);

// RAII MPI_Init_thread/MPI_Finalize for a program's main(). Aborts the whole job when an
// exception escapes on any rank so that no rank waits forever on one that failed.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  int world_rank() const { return rank_; }
  int world_size() const { return size_; }
  // Ends every rank of the job with `code` after this rank's message has been printed.
  [[noreturn]] static void abort_job(int code);

 private:
  int rank_ = 0;
  int size_ = 1;
};

// The communicator whose collectives move `backend`'s memory, built over `mpi` (an MPI-backed
// communicator of the group): `mpi` itself for host memory (the CPU backend), NCCL bootstrapped
// over it for device memory (the CUDA backend). Collective over the group.
std::unique_ptr<Communicator> communicator_for(const Backend& backend, std::unique_ptr<Communicator> mpi);

// Communicator over MPI_COMM_WORLD (a duplicate, so library traffic never mixes with ours).
std::unique_ptr<Communicator> make_mpi_world_communicator();

}  // namespace so
