#include "parallel/nccl_communicator.h"

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <exception>
#include <string>
#include <utility>

#include "parallel/mpi_check.h"
#include "parallel/mpi_comm.h"
#include "parallel/nccl_check.h"
#include "so/backend/backend.h"
#include "so/core/error.h"
#include "so/core/log.h"
#include "src/backend/cuda/cuda_check.h"
#include "src/backend/cuda/cuda_stream.h"

namespace so {

namespace {

int current_device() {
  int device = -1;
  SO_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

bool overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto* pa = static_cast<const char*>(a);
  const auto* pb = static_cast<const char*>(b);
  return a_bytes && b_bytes && pa < pb + b_bytes && pb < pa + a_bytes;
}

ncclDataType_t nccl_type(DType dt) { return dt == DType::F32 ? ncclFloat32 : ncclBfloat16; }

// ncclAvg on floats multiplies each input by 1/n before summing: the same bits as sum / n when n
// is a power of two (1/n is exact), within an ulp or two of it otherwise.
ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Avg ? ncclAvg : ncclSum; }

// RAII owner of one ncclComm_t, bootstrapped over the MPI communicator `mpi` of the same group
// (same ranks, same order). Blocking mode: every call returns when done, never ncclInProgress.
class NcclComm {
 public:
  // `group` names the group and this rank in it in every message.
  NcclComm(MPI_Comm mpi, std::string group) : group_(std::move(group)) {
    int rank = 0, size = 0;
    SO_MPI_CHECK(MPI_Comm_rank(mpi, &rank), group_);
    SO_MPI_CHECK(MPI_Comm_size(mpi, &size), group_);
    // Rank 0's id travels with whether it could make one, so a failure there (no network
    // interface NCCL can use) fails every rank here instead of leaving them in ncclCommInitRank.
    struct {
      ncclUniqueId id;
      int ok;
    } root{};
    std::string root_error;
    if (rank == 0) {
      const ncclResult_t rc = ncclGetUniqueId(&root.id);
      root.ok = rc == ncclSuccess;
      if (!root.ok) root_error = nccl_error_string(rc);
    }
    SO_MPI_CHECK(MPI_Bcast(&root, sizeof root, MPI_BYTE, 0, mpi), "NCCL unique id for ", group_);
    SO_CHECK(root.ok, "ncclGetUniqueId failed on rank 0 of ", group_, root_error.empty() ? "" : ": ", root_error);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;
    SO_NCCL_CHECK(ncclCommInitRankConfig(&comm_, size, root.id, rank, &config), "NCCL init of ", group_,
                  " on CUDA device ", current_device());
  }
  // Destroy waits for the collectives already enqueued, which needs every peer; after an error
  // (NCCL's asynchronous one, or an exception unwinding this rank) they may never come, so the
  // communicator is aborted instead, which does not wait. Never throws: failures are logged.
  ~NcclComm() {
    ncclResult_t async = ncclSuccess;
    const bool broken = failed_ || std::uncaught_exceptions() > 0 ||
                        ncclCommGetAsyncError(comm_, &async) != ncclSuccess || async != ncclSuccess;
    const ncclResult_t rc = broken ? ncclCommAbort(comm_) : ncclCommDestroy(comm_);
    if (rc != ncclSuccess)
      log(LogLevel::Error, str_cat(broken ? "ncclCommAbort" : "ncclCommDestroy", " of ", group_,
                                   " failed (ignored during cleanup): ", nccl_error_string(rc)));
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  ncclComm_t get() const { return comm_; }

  // Throws when NCCL has recorded an asynchronous error (a peer or the network failed).
  void check_async() {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm_, &async);
    if (rc == ncclSuccess && async == ncclSuccess) return;
    failed_ = true;
    SO_FAIL("NCCL communicator of ", group_, " failed: ", nccl_error_string(rc != ncclSuccess ? rc : async));
  }

 private:
  std::string group_;
  ncclComm_t comm_ = nullptr;
  bool failed_ = false;
};

// Device scratch for work enqueued on `s`: handed back to the backend stream-ordered, also when
// enqueueing throws half-way (freeing it at once would pull it from under kernels already queued).
class StreamScratch {
 public:
  StreamScratch(Backend& backend, Stream& s, size_t bytes, const char* tag)
      : backend_(backend), s_(s), buf_(backend.alloc(bytes, tag)) {}
  ~StreamScratch() {
    try {
      backend_.release_after(std::move(buf_), s_);
    } catch (const std::exception&) {
      // The stream cannot take the release: it has failed and the failure surfaces at its next
      // synchronize; the buffer is freed here.
    }
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  float* f32() const { return buf_.as<float>(); }
  void* data() const { return buf_.data(); }

 private:
  Backend& backend_;
  Stream& s_;
  DeviceBuffer buf_;
};

// bf16 reductions (all_reduce, reduce_scatter) widen into an fp32 scratch on the stream, reduce
// as fp32 and narrow once: NCCL's own ncclBfloat16 reductions round to bf16 at every step of the
// ring or tree, so a sum over n ranks would carry up to n - 1 roundings that depend on NCCL's
// algorithm, where the interface promises fp32 accumulation and one rounding.
class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::unique_ptr<Communicator> mpi, Backend* backend)
      : mpi_(std::move(mpi)), backend_(backend), device_(current_device()), comm_(mpi_comm_of(*mpi_), group()) {}

  int rank() const override { return mpi_->rank(); }
  int size() const override { return mpi_->size(); }
  std::string name() const override { return mpi_->name(); }
  const Communicator& host() const override { return *mpi_; }

  void all_reduce_sum(double* values, int count) override {
    mpi_->all_reduce_sum(values, count);
    comm_.check_async();
  }
  void barrier() override {
    mpi_->barrier();
    comm_.check_async();
  }
  // A fresh NCCL communicator bootstrapped over the MPI child, not ncclCommSplit: every group is
  // then made by the one init path, membership and order are MPI's by construction, and the
  // parent's NCCL communicator is not involved (a host-side call may overlap its collectives).
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    std::unique_ptr<Communicator> child = mpi_->split(color, key, name);
    comm_.check_async();
    return std::make_unique<NcclCommunicator>(std::move(child), backend_);
  }

  void attach(Backend& backend) override {
    // NCCL reads and writes device memory on CUDA streams (raw() below assumes CUDA streams).
    SO_CHECK(backend.name() == "cuda", "the NCCL communicator of ", group(), " needs the cuda backend; got the ",
             backend.name(), " backend");
    const int device = current_device();
    SO_CHECK(device == device_, "the NCCL communicator of ", group(), " was made on CUDA device ", device_,
             " but the backend attached to it runs on device ", device,
             ": create the backend (which selects this rank's GPU) before the communicator");
    backend_ = &backend;
  }

  void all_gather(Stream& s, void* recv, const void* send, int64_t count, DType dt) override {
    check_args("all_gather", count, dt);
    const size_t block = count * dtype_size(dt);
    const bool in_place = send == static_cast<char*>(recv) + rank() * block;  // NCCL's in-place form too
    SO_CHECK(in_place || !overlap(send, block, recv, size() * block), context("all_gather", count, dt),
             ": send overlaps recv other than as this rank's block");
    if (count == 0) return;
    SO_NCCL_CHECK(ncclAllGather(send, recv, count, nccl_type(dt), comm_.get(), cuda::raw(s)),
                  context("all_gather", count, dt));
  }

  void reduce_scatter(Stream& s, void* recv, const void* send, int64_t count, DType dt, ReduceOp op) override {
    check_args("reduce_scatter", count, dt);
    const size_t block = count * dtype_size(dt);
    const bool in_place = recv == static_cast<const char*>(send) + rank() * block;  // NCCL's in-place form too
    SO_CHECK(in_place || !overlap(send, size() * block, recv, block), context("reduce_scatter", count, dt),
             ": recv overlaps send other than as this rank's block");
    if (count == 0) return;
    if (dt == DType::F32) {
      SO_NCCL_CHECK(ncclReduceScatter(send, recv, count, ncclFloat32, nccl_op(op), comm_.get(), cuda::raw(s)),
                    context("reduce_scatter", count, dt));
      return;
    }
    // bf16 (see above): the whole send widened, reduced in place into this rank's fp32 block.
    const int64_t total = count * size();
    StreamScratch wide(*backend_, s, total * sizeof(float), "nccl bf16 widening");
    backend_->ops().cast(s, wide.data(), DType::F32, send, DType::BF16, total);
    float* own = wide.f32() + rank() * count;
    SO_NCCL_CHECK(ncclReduceScatter(wide.f32(), own, count, ncclFloat32, nccl_op(op), comm_.get(), cuda::raw(s)),
                  context("reduce_scatter", count, dt));
    backend_->ops().cast(s, recv, DType::BF16, own, DType::F32, count);
  }

  void all_reduce(Stream& s, void* buf, int64_t count, DType dt, ReduceOp op) override {
    check_args("all_reduce", count, dt);
    if (count == 0) return;
    if (dt == DType::F32) {
      SO_NCCL_CHECK(ncclAllReduce(buf, buf, count, ncclFloat32, nccl_op(op), comm_.get(), cuda::raw(s)),
                    context("all_reduce", count, dt));
      return;
    }
    StreamScratch wide(*backend_, s, count * sizeof(float), "nccl bf16 widening");  // bf16: see above
    backend_->ops().cast(s, wide.data(), DType::F32, buf, DType::BF16, count);
    SO_NCCL_CHECK(ncclAllReduce(wide.f32(), wide.f32(), count, ncclFloat32, nccl_op(op), comm_.get(), cuda::raw(s)),
                  context("all_reduce", count, dt));
    backend_->ops().cast(s, buf, DType::BF16, wide.data(), DType::F32, count);
  }

  void all_to_all(Stream& s, void* recv, const void* send, int64_t count, DType dt) override {
    check_args("all_to_all", count, dt);
    const size_t block = count * dtype_size(dt), bytes = size() * block;
    const bool in_place = send == recv;
    SO_CHECK(in_place || !overlap(send, bytes, recv, bytes), context("all_to_all", count, dt),
             ": send and recv overlap without being the same buffer");
    if (count == 0) return;
    // NCCL's point-to-point calls read send while recv is being written: in place, the blocks to
    // send are copied aside first.
    std::unique_ptr<StreamScratch> staging;
    if (in_place) {
      staging = std::make_unique<StreamScratch>(*backend_, s, bytes, "nccl all_to_all staging");
      backend_->copy_d2d(staging->data(), send, bytes, s);
      send = staging->data();
    }
    // One send and one receive per peer (self included), fused into one launch by the group.
    SO_NCCL_CHECK(ncclGroupStart(), context("all_to_all", count, dt));
    try {
      for (int peer = 0; peer < size(); ++peer) {
        SO_NCCL_CHECK(ncclSend(static_cast<const char*>(send) + peer * block, count, nccl_type(dt), peer, comm_.get(),
                               cuda::raw(s)),
                      context("all_to_all", count, dt), " to rank ", peer);
        SO_NCCL_CHECK(
            ncclRecv(static_cast<char*>(recv) + peer * block, count, nccl_type(dt), peer, comm_.get(), cuda::raw(s)),
            context("all_to_all", count, dt), " from rank ", peer);
      }
    } catch (...) {
      (void)ncclGroupEnd();  // close the group, or this thread's later NCCL calls would join it
      throw;
    }
    SO_NCCL_CHECK(ncclGroupEnd(), context("all_to_all", count, dt));
  }

  void broadcast(Stream& s, void* buf, int64_t count, DType dt, int root) override {
    check_args("broadcast", count, dt);
    SO_CHECK(root >= 0 && root < size(), context("broadcast", count, dt), ": root ", root, " is outside the group");
    if (count == 0) return;
    SO_NCCL_CHECK(ncclBroadcast(buf, buf, count, nccl_type(dt), root, comm_.get(), cuda::raw(s)),
                  context("broadcast", count, dt), " from root ", root);
  }

 private:
  // "group 'dp' (rank 1 of 2)"
  std::string group() const { return str_cat("group '", name(), "' (rank ", rank(), " of ", size(), ")"); }
  // "all_gather of 1003 bf16 on group 'dp' (rank 1 of 2)": what a collective's errors say.
  std::string context(const char* op, int64_t count, DType dt) const {
    return str_cat(op, " of ", count, " ", dtype_name(dt), " on ", group());
  }
  // What a buffer collective checks on the caller's thread, so the error reaches the caller.
  void check_args(const char* op, int64_t count, DType dt) const {
    SO_CHECK(backend_, context(op, count, dt), ": the communicator is not attached to a backend (attach() first)");
    SO_CHECK(count >= 0, context(op, count, dt), ": count must not be negative");
  }

  std::unique_ptr<Communicator> mpi_;  // declared first: outlives the NCCL communicator it bootstrapped
  Backend* backend_ = nullptr;
  int device_ = -1;  // the CUDA device NCCL bound this rank to
  NcclComm comm_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> mpi) {
  SO_CHECK(mpi, "make_nccl_communicator needs the MPI communicator of the group");
  return std::make_unique<NcclCommunicator>(std::move(mpi), nullptr);
}

}  // namespace so
