#include <mpi.h>

#include "parallel/communicator.h"
#include "so/core/error.h"

// Every MPI call is checked; the error string names the call and the rank.
#define SO_MPI_CHECK(call)                                                                 \
  do {                                                                                     \
    int so_mpi_rc_ = (call);                                                               \
    if (so_mpi_rc_ != MPI_SUCCESS) {                                                       \
      char so_mpi_msg_[MPI_MAX_ERROR_STRING];                                              \
      int so_mpi_len_ = 0;                                                                 \
      MPI_Error_string(so_mpi_rc_, so_mpi_msg_, &so_mpi_len_);                             \
      SO_FAIL("MPI call failed: ", #call, ": ", std::string(so_mpi_msg_, so_mpi_len_));    \
    }                                                                                      \
  } while (0)

namespace so {

namespace {

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm parent) {
    SO_MPI_CHECK(MPI_Comm_dup(parent, &comm_));
    SO_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    SO_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    SO_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }
  void all_reduce_sum(double* values, int count) override {
    SO_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values, count, MPI_DOUBLE, MPI_SUM, comm_));
  }
  void barrier() override { SO_MPI_CHECK(MPI_Barrier(comm_)); }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

MpiSession::MpiSession(int* argc, char*** argv) {
  int provided = 0;
  // Collectives are issued from the comm stream's worker thread, not only from main().
  SO_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  SO_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  SO_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  SO_CHECK(provided >= MPI_THREAD_SERIALIZED, "the MPI library provides thread level ", provided,
           "; so_train needs at least MPI_THREAD_SERIALIZED");
  if (size_ > 1) set_error_rank(rank_);
}

MpiSession::~MpiSession() { MPI_Finalize(); }

void MpiSession::abort_job(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

std::unique_ptr<Communicator> make_mpi_world_communicator() {
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
}

}  // namespace so
