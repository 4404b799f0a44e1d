#pragma once
// The collectives the engine needs, over one process group. The MPI implementation serves the
// CPU backend (and bootstraps NCCL); a NCCL one implements the same interface for CUDA.
#include <cstdint>
#include <memory>
#include <string>

namespace so {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;
  // Blocking, host-side: used for scalars (gradient norm, finite flags, loss).
  virtual void all_reduce_sum(double* values, int count) = 0;
  virtual void barrier() = 0;
};

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

// Communicator over MPI_COMM_WORLD (a duplicate, so library traffic never mixes with ours).
std::unique_ptr<Communicator> make_mpi_world_communicator();

}  // namespace so
