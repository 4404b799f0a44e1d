#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "parallel/collective_watchdog.h"
#include "parallel/communicator.h"
#include "parallel/fatal_signals.h"
#include "parallel/mpi_check.h"
#include "parallel/mpi_comm.h"
#include "so/backend/backend.h"
#include "so/core/error.h"

namespace so {

namespace {

bool overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto* pa = static_cast<const char*>(a);
  const auto* pb = static_cast<const char*>(b);
  return a_bytes && b_bytes && pa < pb + b_bytes && pb < pa + a_bytes;
}

// Non-reducing collectives move elements as opaque 2- or 4-byte words.
MPI_Datatype raw_type(DType dt) { return dt == DType::F32 ? MPI_FLOAT : MPI_UINT16_T; }

// MPI counts are ints. An all-to-all of more elements per rank (a million-token Ulysses exchange
// reaches 2^31) moves words of `group` elements instead: the smallest divisor of the count that
// brings it within the limit (SO_MPI_MAX_COUNT lowers the limit, to test this path). 0: none.
int64_t mpi_count_limit() {
  const char* env = std::getenv("SO_MPI_MAX_COUNT");
  const long long v = env ? std::atoll(env) : 0;
  return v > 0 && v < INT_MAX ? v : INT_MAX;
}
int64_t word_elements(int64_t count, int64_t limit) {
  const int64_t least = (count + limit - 1) / limit;
  for (int64_t g = std::max<int64_t>(1, least); g <= limit && g < least + (int64_t{1} << 20); ++g)
    if (count % g == 0 && count / g <= limit) return g;
  return 0;
}
// The MPI type of one word, freed with it.
class MpiWord {
 public:
  MpiWord(int64_t elements, MPI_Datatype element) : type_(element) {
    if (elements == 1) return;
    SO_MPI_CHECK(MPI_Type_contiguous(static_cast<int>(elements), element, &type_), "MPI_Type_contiguous");
    SO_MPI_CHECK(MPI_Type_commit(&type_), "MPI_Type_commit");
    owned_ = true;
  }
  ~MpiWord() {
    if (owned_) MPI_Type_free(&type_);
  }
  MpiWord(const MpiWord&) = delete;
  MpiWord& operator=(const MpiWord&) = delete;
  MPI_Datatype type() const { return type_; }

 private:
  MPI_Datatype type_;
  bool owned_ = false;
};

// The fp32 buffer an MPI reduction runs on: fp32 data itself, or bf16 widened into a scratch
// buffer (MPI has no bf16 type, and bf16 must accumulate in fp32). The scratch is per thread
// (each CPU stream has its own worker, so collectives on different streams never share it) and
// kept at its largest size, so steady-state collectives do not allocate.
float* reducible(const void* data, int64_t n, DType dt) {
  if (dt == DType::F32) return static_cast<float*>(const_cast<void*>(data));
  thread_local std::vector<float> scratch;
  if (scratch.size() < static_cast<size_t>(n)) scratch.resize(n);
  const bf16* src = static_cast<const bf16*>(data);
  for (int64_t i = 0; i < n; ++i) scratch[i] = bf16_to_f32(src[i]);
  return scratch.data();
}

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm`. Host-side calls and stream collectives use separate duplicates:
  // the engine's host all-reduces (gradient norm) may run while the comm stream is inside a
  // reduce-scatter, and MPI requires each communicator's collectives in one order on all ranks.
  MpiCommunicator(MPI_Comm comm, std::string name, Backend* backend)
      : host_comm_(comm), name_(std::move(name)), backend_(backend) {
    SO_MPI_CHECK(MPI_Comm_set_errhandler(host_comm_, MPI_ERRORS_RETURN), "group '", name_, "'");
    SO_MPI_CHECK(MPI_Comm_rank(host_comm_, &rank_), "group '", name_, "'");
    SO_MPI_CHECK(MPI_Comm_size(host_comm_, &size_), "group '", name_, "'");
    SO_MPI_CHECK(MPI_Comm_dup(host_comm_, &stream_comm_), group());
    SO_MPI_CHECK(MPI_Comm_set_errhandler(stream_comm_, MPI_ERRORS_RETURN), group());
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    MPI_Comm_free(&stream_comm_);
    MPI_Comm_free(&host_comm_);
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  MPI_Comm host_comm() const { return host_comm_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }

  void all_reduce_sum(double* values, int count) override {
    const CollectiveWatchdog::Watch watch(str_cat("all_reduce_sum of ", count, " doubles on ", group()));
    SO_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values, count, MPI_DOUBLE, MPI_SUM, host_comm_), "all_reduce_sum of ",
                 count, " doubles on ", group());
  }
  void barrier() override {
    const CollectiveWatchdog::Watch watch(str_cat("barrier on ", group()));
    SO_MPI_CHECK(MPI_Barrier(host_comm_), group());
  }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    SO_CHECK(color >= 0, "split of ", group(), " into '", name, "': color ", color, " must be >= 0");
    MPI_Comm child = MPI_COMM_NULL;
    const CollectiveWatchdog::Watch watch(str_cat("split of ", group(), " into '", name, "'"));
    SO_MPI_CHECK(MPI_Comm_split(host_comm_, color, key, &child), "split of ", group(), " into '", name, "', color ",
                 color, ", key ", key);
    return std::make_unique<MpiCommunicator>(child, name, backend_);
  }

  void attach(Backend& backend) override {
    // MPI reads and writes the buffers directly; device memory elsewhere is NCCL's business.
    SO_CHECK(backend.device_is_host(), "the MPI communicator of ", group(),
             " needs host-addressable device memory; the ", backend.name(), " backend's is not");
    backend_ = &backend;
  }

  void all_gather(Stream& s, void* recv, const void* send, int64_t count, DType dt) override {
    const int n = checked("all_gather", count, dt);
    const size_t block = count * dtype_size(dt);
    // In place when this rank's block of recv is the input (ZeRO-3 gathering its shard).
    const bool in_place = send == static_cast<char*>(recv) + rank_ * block;
    SO_CHECK(in_place || !overlap(send, block, recv, size_ * block), context("all_gather", count, dt),
             ": send overlaps recv other than as this rank's block");
    backend_->host_func(s, [=, this] {
      const CollectiveWatchdog::Watch watch(context("all_gather", count, dt));
      SO_MPI_CHECK(MPI_Allgather(in_place ? MPI_IN_PLACE : send, n, raw_type(dt), recv, n, raw_type(dt), stream_comm_),
                   context("all_gather", count, dt));
    });
  }

  void reduce_scatter(Stream& s, void* recv, const void* send, int64_t count, DType dt, ReduceOp op) override {
    const int n = checked("reduce_scatter", count, dt);
    const size_t block = count * dtype_size(dt);
    // In place when recv is this rank's block of send (ZeRO-3 keeping its gradient shard).
    const bool in_place = recv == static_cast<const char*>(send) + rank_ * block;
    SO_CHECK(in_place || !overlap(send, size_ * block, recv, block), context("reduce_scatter", count, dt),
             ": recv overlaps send other than as this rank's block");
    backend_->host_func(s, [=, this] {
      const CollectiveWatchdog::Watch watch(context("reduce_scatter", count, dt));
      float* in = reducible(send, int64_t{n} * size_, dt);
      // MPI's in-place variant leaves the result at the start of the buffer, which must then be
      // writable: the widened scratch, or send itself when recv aliases it.
      const bool mpi_in_place = in_place || dt != DType::F32;
      SO_MPI_CHECK(MPI_Reduce_scatter_block(mpi_in_place ? MPI_IN_PLACE : in, mpi_in_place ? in : recv, n, MPI_FLOAT,
                                            MPI_SUM, stream_comm_),
                   context("reduce_scatter", count, dt));
      store_reduced(mpi_in_place ? in : static_cast<float*>(recv), recv, n, dt, op);
    });
  }

  void all_reduce(Stream& s, void* buf, int64_t count, DType dt, ReduceOp op) override {
    const int n = checked("all_reduce", count, dt);
    backend_->host_func(s, [=, this] {
      const CollectiveWatchdog::Watch watch(context("all_reduce", count, dt));
      float* data = reducible(buf, n, dt);
      SO_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, n, MPI_FLOAT, MPI_SUM, stream_comm_),
                   context("all_reduce", count, dt));
      store_reduced(data, buf, n, dt, op);
    });
  }

  void all_to_all(Stream& s, void* recv, const void* send, int64_t count, DType dt) override {
    SO_CHECK(backend_, context("all_to_all", count, dt),
             ": the communicator is not attached to a backend (attach() first)");
    const int64_t word = word_elements(count, mpi_count_limit());
    SO_CHECK(count >= 0 && word > 0, context("all_to_all", count, dt),
             ": the count has no divisor that brings it within ",
             "MPI's int counts; choose a sequence length with more factors of two");
    const int n = static_cast<int>(count / word);
    const size_t bytes = size_ * count * dtype_size(dt);
    const bool in_place = send == recv;
    SO_CHECK(in_place || !overlap(send, bytes, recv, bytes), context("all_to_all", count, dt),
             ": send and recv overlap without being the same buffer");
    backend_->host_func(s, [=, this] {
      const CollectiveWatchdog::Watch watch(context("all_to_all", count, dt));
      const MpiWord w(word, raw_type(dt));
      SO_MPI_CHECK(MPI_Alltoall(in_place ? MPI_IN_PLACE : send, n, w.type(), recv, n, w.type(), stream_comm_),
                   context("all_to_all", count, dt), word > 1 ? str_cat(" (as ", n, " words of ", word, ")") : "");
    });
  }

  void broadcast(Stream& s, void* buf, int64_t count, DType dt, int root) override {
    const int n = checked("broadcast", count, dt);
    SO_CHECK(root >= 0 && root < size_, context("broadcast", count, dt), ": root ", root, " is outside the group");
    backend_->host_func(s, [=, this] {
      const CollectiveWatchdog::Watch watch(context("broadcast", count, dt));
      SO_MPI_CHECK(MPI_Bcast(buf, n, raw_type(dt), root, stream_comm_), context("broadcast", count, dt), " from root ",
                   root);
    });
  }

 private:
  // "group 'dp' (rank 1 of 2)"
  std::string group() const { return str_cat("group '", name_, "' (rank ", rank_, " of ", size_, ")"); }
  // "all_gather of 1003 bf16 on group 'dp' (rank 1 of 2)": what a collective's errors say.
  std::string context(const char* op, int64_t count, DType dt) const {
    return str_cat(op, " of ", count, " ", dtype_name(dt), " on ", group());
  }

  // What a buffer collective can check on the caller's thread (so the error reaches the caller,
  // not the stream): attached, and a count MPI takes (int; ZeRO buckets are far smaller).
  int checked(const char* op, int64_t count, DType dt) const {
    SO_CHECK(backend_, context(op, count, dt), ": the communicator is not attached to a backend (attach() first)");
    SO_CHECK(count >= 0 && count <= INT_MAX, context(op, count, dt), ": count must be in [0, ", INT_MAX,
             "], MPI's int");
    return static_cast<int>(count);
  }

  // Writes a fp32 sum to dst in dtype dt: divided by the group size for Avg (in fp32), rounded
  // to bf16 when dt is bf16. `sum` and dst are the same fp32 buffer or disjoint.
  void store_reduced(const float* sum, void* dst, int64_t n, DType dt, ReduceOp op) const {
    if (dt == DType::F32 && op == ReduceOp::Sum && sum == dst) return;
    const float div = op == ReduceOp::Avg ? static_cast<float>(size_) : 1.0f;
    if (dt == DType::F32) {
      float* out = static_cast<float*>(dst);
      for (int64_t i = 0; i < n; ++i) out[i] = sum[i] / div;
    } else {
      bf16* out = static_cast<bf16*>(dst);
      for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(sum[i] / div);
    }
  }

  MPI_Comm host_comm_ = MPI_COMM_NULL;
  MPI_Comm stream_comm_ = MPI_COMM_NULL;
  std::string name_;
  Backend* backend_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

MpiSession::MpiSession(int* argc, char*** argv) {
  int provided = 0;
  remember_fatal_signal_handlers();
  // Collectives run on the comm stream's worker thread while the main thread may make host-side
  // calls on other communicators at the same time.
  SO_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  SO_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  SO_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  SO_CHECK(provided >= MPI_THREAD_MULTIPLE, "the MPI library provides thread level ", provided,
           "; so_train needs MPI_THREAD_MULTIPLE (", MPI_THREAD_MULTIPLE, ")");
  if (size_ > 1) set_error_rank(rank_);
  install_fatal_signal_handlers(rank_);  // after MPI_Init, which installs MPI's own
}

MpiSession::~MpiSession() { MPI_Finalize(); }

void MpiSession::abort_job(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

MPI_Comm mpi_comm_of(const Communicator& comm) {
  const auto* mpi = dynamic_cast<const MpiCommunicator*>(&comm.host());
  SO_CHECK(mpi, "communicator '", comm.name(), "' is not MPI-backed");
  return mpi->host_comm();
}

std::unique_ptr<Communicator> make_mpi_world_communicator() {
  MPI_Comm world = MPI_COMM_NULL;
  SO_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world));
  return std::make_unique<MpiCommunicator>(world, "world", nullptr);
}

}  // namespace so
