// A communicator: every buffer collective in fp32 and bf16 on awkward counts, in place and not,
// against the expected values of parallel/collective_check.h; bf16 sums rounded once; stream
// ordering; the (dp, sp) process-group mesh; the errors. Built twice: as test_collectives, the
// MPI communicator on the CPU backend (under mpirun, 2 and 4 ranks); with SO_TEST_NCCL as
// test_nccl_collectives, the NCCL communicator on the CUDA backend, one GPU per rank (1 rank, and
// 2 and 4 under mpirun; skipped on every rank when a node has fewer GPUs than ranks).
#include <gtest/gtest.h>

#include <chrono>
#include <climits>
#include <string>
#include <thread>
#include <vector>

#include "parallel/collective_check.h"
#include "parallel/communicator.h"
#include "so/backend/backend.h"
#include "tests/test_util.h"

#if SO_TEST_NCCL
#include <mpi.h>

#include "parallel/mpi_check.h"
#include "parallel/nccl_communicator.h"
#include "src/backend/cuda/cuda_cast.h"
#endif

namespace so {
namespace {

struct Placement {
  std::string skip;  // why the suite cannot run (the same on every rank); empty when it can
  int local_rank = 0;
};

#if SO_TEST_NCCL
// NCCL refuses two ranks on one GPU: each rank of a node takes the GPU of its local rank. Checked
// with device_count() (which never throws) before any backend is made.
Placement placement() {
  MPI_Comm node = MPI_COMM_NULL;
  SO_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int local_rank = 0, local_ranks = 1;
  SO_MPI_CHECK(MPI_Comm_rank(node, &local_rank));
  SO_MPI_CHECK(MPI_Comm_size(node, &local_ranks));
  SO_MPI_CHECK(MPI_Comm_free(&node));
  const int gpus = cuda::device_count();
  int enough = gpus >= local_ranks;
  SO_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &enough, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (enough) return {"", local_rank};
  return {str_cat("NCCL test skipped: one CUDA device per rank needed; this node has ", gpus, " for ", local_ranks,
                  " ranks"),
          local_rank};
}
std::unique_ptr<Backend> make_test_backend(int local_rank) {
  BackendOptions opts;  // (not designated initializers: GCC warns about the members left out)
  opts.type = "cuda";
  opts.device = local_rank;
  return create_backend(opts);
}
std::unique_ptr<Communicator> make_world() { return make_nccl_communicator(make_mpi_world_communicator()); }
#else
Placement placement() { return {}; }
std::unique_ptr<Backend> make_test_backend(int) { return create_backend(test::cpu_backend_options()); }
std::unique_ptr<Communicator> make_world() { return make_mpi_world_communicator(); }
#endif

class CommunicatorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const Placement p = placement();
    skip_ = p.skip;
    if (!skip_.empty()) return;
    backend_ = make_test_backend(p.local_rank);
    world_ = make_world();
    world_->attach(*backend_);
  }
  static void TearDownTestSuite() {
    world_.reset();
    backend_.reset();
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_TRUE(world_) << "the suite's set-up failed (see above)";
  }

  static Stream& comm_stream() { return backend_->stream(StreamKind::Comm); }
  static DeviceBuffer alloc(int64_t elements, DType dt) { return backend_->alloc(elements * dtype_size(dt), "test"); }
  // Address of element `i` of a device buffer of dtype dt.
  static char* at(const DeviceBuffer& b, int64_t i, DType dt) { return b.as<char>() + i * dtype_size(dt); }

  // Device memory is written and read through copies (it is host memory only on the CPU backend).
  static void put(void* dst, const void* host, size_t bytes) {
    backend_->copy_h2d(dst, host, bytes, comm_stream());
    backend_->synchronize(comm_stream());
  }
  template <typename T>
  static std::vector<T> get(const void* src, int64_t n) {
    std::vector<T> host(n);
    backend_->copy_d2h(host.data(), src, n * sizeof(T), comm_stream());
    backend_->synchronize(comm_stream());
    return host;
  }
  // dst[0..n) = rank's check input (parallel/collective_check.h).
  static void fill(void* dst, int64_t n, DType dt, int rank) {
    std::vector<char> host(n * dtype_size(dt));
    fill_check_input(host.data(), n, dt, rank);
    put(dst, host.data(), host.size());
  }

  // Waits for the comm stream, then expects rank's output `recv` of collective c to be exact.
  static void expect_exact(Collective c, ReduceOp op, DType dt, int64_t count, const void* recv, int root = 0) {
    const CheckSpec spec{c, op, dt, count, world_->size(), world_->rank(), root};
    const auto out = get<char>(recv, recv_elements(c, count, world_->size()) * dtype_size(dt));
    EXPECT_EQ(count_wrong(spec, out.data()), 0) << collective_name(c) << " of " << count << " " << dtype_name(dt);
  }

  static void expect_members(Communicator& group, int world_rank, const std::vector<int>& members);

  static std::string skip_;
  static std::unique_ptr<Backend> backend_;
  static std::unique_ptr<Communicator> world_;
};
std::string CommunicatorTest::skip_;
std::unique_ptr<Backend> CommunicatorTest::backend_;
std::unique_ptr<Communicator> CommunicatorTest::world_;

struct Case {
  DType dt;
  int64_t count;
};

class Collectives : public CommunicatorTest, public ::testing::WithParamInterface<Case> {
 protected:
  DType dt() const { return GetParam().dt; }
  int64_t count() const { return GetParam().count; }
  int ranks() const { return world_->size(); }
  int rank() const { return world_->rank(); }
};

TEST_P(Collectives, AllReduceSumAndAvg) {
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    DeviceBuffer buf = alloc(count(), dt());
    fill(buf.data(), count(), dt(), rank());
    world_->all_reduce(comm_stream(), buf.data(), count(), dt(), op);
    expect_exact(Collective::AllReduce, op, dt(), count(), buf.data());
  }
}

TEST_P(Collectives, ReduceScatter) {
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    DeviceBuffer send = alloc(ranks() * count(), dt()), recv = alloc(count(), dt());
    fill(send.data(), ranks() * count(), dt(), rank());
    world_->reduce_scatter(comm_stream(), recv.data(), send.data(), count(), dt(), op);
    expect_exact(Collective::ReduceScatter, op, dt(), count(), recv.data());
  }
}

TEST_P(Collectives, ReduceScatterIntoOwnBlockOfSend) {
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    DeviceBuffer buf = alloc(ranks() * count(), dt());
    fill(buf.data(), ranks() * count(), dt(), rank());
    char* own = at(buf, rank() * count(), dt());
    world_->reduce_scatter(comm_stream(), own, buf.data(), count(), dt(), op);
    expect_exact(Collective::ReduceScatter, op, dt(), count(), own);
  }
}

TEST_P(Collectives, AllGather) {
  DeviceBuffer send = alloc(count(), dt()), recv = alloc(ranks() * count(), dt());
  fill(send.data(), count(), dt(), rank());
  world_->all_gather(comm_stream(), recv.data(), send.data(), count(), dt());
  expect_exact(Collective::AllGather, ReduceOp::Sum, dt(), count(), recv.data());
}

TEST_P(Collectives, AllGatherFromOwnBlockOfRecv) {
  DeviceBuffer recv = alloc(ranks() * count(), dt());
  char* own = at(recv, rank() * count(), dt());
  fill(own, count(), dt(), rank());
  world_->all_gather(comm_stream(), recv.data(), own, count(), dt());
  expect_exact(Collective::AllGather, ReduceOp::Sum, dt(), count(), recv.data());
}

TEST_P(Collectives, AllToAll) {
  DeviceBuffer send = alloc(ranks() * count(), dt()), recv = alloc(ranks() * count(), dt());
  fill(send.data(), ranks() * count(), dt(), rank());
  world_->all_to_all(comm_stream(), recv.data(), send.data(), count(), dt());
  expect_exact(Collective::AllToAll, ReduceOp::Sum, dt(), count(), recv.data());
}

TEST_P(Collectives, AllToAllInPlace) {
  DeviceBuffer buf = alloc(ranks() * count(), dt());
  fill(buf.data(), ranks() * count(), dt(), rank());
  world_->all_to_all(comm_stream(), buf.data(), buf.data(), count(), dt());
  expect_exact(Collective::AllToAll, ReduceOp::Sum, dt(), count(), buf.data());
}

TEST_P(Collectives, BroadcastFromLastRank) {
  const int root = ranks() - 1;
  DeviceBuffer buf = alloc(count(), dt());
  fill(buf.data(), count(), dt(), rank());
  world_->broadcast(comm_stream(), buf.data(), count(), dt(), root);
  expect_exact(Collective::Broadcast, ReduceOp::Sum, dt(), count(), buf.data(), root);
}

INSTANTIATE_TEST_SUITE_P(DtypesAndCounts, Collectives,
                         ::testing::Values(Case{DType::F32, 1}, Case{DType::F32, 7}, Case{DType::F32, 1003},
                                           Case{DType::BF16, 1}, Case{DType::BF16, 7}, Case{DType::BF16, 1003}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return str_cat(dtype_name(info.param.dt), "_", info.param.count);
                         });

// ZeRO-3's pattern, both enqueued before the stream runs either: reduce-scatter into the own
// shard, then all-gather around it, equals an all-reduce of the whole buffer.
TEST_F(CommunicatorTest, BackToBackCollectivesRunInOrder) {
  const int64_t shard = 1003, total = shard * world_->size();
  for (DType dt : {DType::F32, DType::BF16}) {
    DeviceBuffer buf = alloc(total, dt);
    fill(buf.data(), total, dt, world_->rank());
    char* own = at(buf, world_->rank() * shard, dt);
    world_->reduce_scatter(comm_stream(), own, buf.data(), shard, dt, ReduceOp::Sum);
    world_->all_gather(comm_stream(), buf.data(), own, shard, dt);
    expect_exact(Collective::AllReduce, ReduceOp::Sum, dt, total, buf.data());
  }
}

// The input is written late on the compute stream; the comm stream waits for it by an event.
TEST_F(CommunicatorTest, CollectiveWaitsForComputeEvent) {
  constexpr int64_t count = 1000 + 3;
  DeviceBuffer send = alloc(count, DType::F32), recv = alloc(world_->size() * count, DType::F32);
  std::vector<float> input(count);
  fill_check_input(input.data(), count, DType::F32, world_->rank());
  Stream& compute = backend_->stream(StreamKind::Compute);
  backend_->host_func(compute, [] { std::this_thread::sleep_for(std::chrono::milliseconds(100)); });
  backend_->copy_h2d(send.data(), input.data(), count * sizeof(float), compute);
  auto ready = backend_->create_event();
  backend_->record(*ready, compute);
  backend_->wait(comm_stream(), *ready);
  world_->all_gather(comm_stream(), recv.data(), send.data(), count, DType::F32);
  expect_exact(Collective::AllGather, ReduceOp::Sum, DType::F32, count, recv.data());
}

// bf16 sums are rounded once: 1 on rank 0 and 2^-8 on the others sum to 1 + (n-1)/256 in fp32,
// whose bf16 rounding is 1.015625 on 4 ranks, where rounding at each step of a ring that starts
// from 1 gives 1 (1 + 2^-8 is a tie that rounds back to 1). Many elements: a ring starts its chunks
// at different ranks.
TEST_F(CommunicatorTest, Bf16SumsAreRoundedOnce) {
  const int n = world_->size();
  const int64_t count = 4096;
  const bf16 want = f32_to_bf16(1.0f + static_cast<float>(n - 1) / 256.0f);
  const std::vector<bf16> input(n * count, f32_to_bf16(world_->rank() == 0 ? 1.0f : 1.0f / 256.0f));
  DeviceBuffer buf = alloc(n * count, DType::BF16), shard = alloc(count, DType::BF16);
  put(buf.data(), input.data(), input.size() * sizeof(bf16));
  world_->reduce_scatter(comm_stream(), shard.data(), buf.data(), count, DType::BF16, ReduceOp::Sum);
  world_->all_reduce(comm_stream(), buf.data(), n * count, DType::BF16, ReduceOp::Sum);
  auto wrong = [&](const DeviceBuffer& out, int64_t elements) {
    int64_t k = 0;
    for (bf16 x : get<bf16>(out.data(), elements)) k += x.bits != want.bits;
    return k;
  };
  EXPECT_EQ(wrong(shard, count), 0) << "reduce_scatter";
  EXPECT_EQ(wrong(buf, n * count), 0) << "all_reduce";
}

// Inside `group`: the world ranks of its members in group-rank order (all_gather) and their sum
// (all_reduce) — results only the right membership gives.
void CommunicatorTest::expect_members(Communicator& group, int world_rank, const std::vector<int>& members) {
  const int n = group.size();
  DeviceBuffer mine = alloc(1, DType::F32), all = alloc(n, DType::F32), sum = alloc(1, DType::F32);
  const float me = static_cast<float>(world_rank);
  put(mine.data(), &me, sizeof me);
  put(sum.data(), &me, sizeof me);
  group.all_gather(comm_stream(), all.data(), mine.data(), 1, DType::F32);
  group.all_reduce(comm_stream(), sum.data(), 1, DType::F32, ReduceOp::Sum);
  const std::vector<float> got = get<float>(all.data(), n), got_sum = get<float>(sum.data(), 1);
  float want_sum = 0;
  for (int j = 0; j < n; ++j) {
    EXPECT_EQ(got[j], static_cast<float>(members[j])) << group.name() << " member " << j;
    want_sum += static_cast<float>(members[j]);
  }
  EXPECT_EQ(got_sum[0], want_sum) << group.name();
}

// (dp, sp) = (1, n), (n, 1) and, on 4 ranks, (2, 2): world rank r = dp_rank * sp + sp_rank.
TEST_F(CommunicatorTest, ProcessGroupMesh) {
  const int n = world_->size();
  std::vector<int> sp_sizes = {n, 1};
  if (n == 4) sp_sizes.push_back(2);
  for (int sp : sp_sizes) {
    SCOPED_TRACE(str_cat("sp_size ", sp, " of ", n, " ranks"));
    auto world = make_world();
    world->attach(*backend_);
    const int r = world->rank();
    ProcessGroups g = make_process_groups(std::move(world), sp);
    EXPECT_EQ(g.world->size(), n);
    EXPECT_EQ(g.sp_size, sp);
    EXPECT_EQ(g.dp_size, n / sp);
    EXPECT_EQ(g.dp_rank, r / sp);
    EXPECT_EQ(g.sp_rank, r % sp);
    EXPECT_EQ(g.sp->name(), "sp");
    EXPECT_EQ(g.sp->size(), sp);
    EXPECT_EQ(g.sp->rank(), g.sp_rank);
    EXPECT_EQ(g.dp->name(), "dp");
    EXPECT_EQ(g.dp->size(), n / sp);
    EXPECT_EQ(g.dp->rank(), g.dp_rank);
    std::vector<int> sp_members, dp_members;
    for (int j = 0; j < sp; ++j) sp_members.push_back(g.dp_rank * sp + j);
    for (int j = 0; j < n / sp; ++j) dp_members.push_back(j * sp + g.sp_rank);
    // The groups were never attached: they inherit the world's backend.
    expect_members(*g.sp, r, sp_members);
    expect_members(*g.dp, r, dp_members);
  }
}

TEST_F(CommunicatorTest, SequenceParallelSizeMustDivideTheRanks) {
  const int n = world_->size();
  EXPECT_NE(test::error_message([&] {
              make_process_groups(make_mpi_world_communicator(), n + 1);
            }).find(str_cat("sequence_parallel_size ", n + 1, " does not divide the ", n, " ranks of the job")),
            std::string::npos);
  EXPECT_NE(test::error_message([&] {
              make_process_groups(make_mpi_world_communicator(), 0);
            }).find("sequence_parallel_size must be at least 1, got 0"),
            std::string::npos);
}

TEST_F(CommunicatorTest, BufferCollectivesNeedAnAttachedBackend) {
  auto unattached = make_world();
  DeviceBuffer buf = alloc(4, DType::F32);
  const std::string msg =
      test::error_message([&] { unattached->all_reduce(comm_stream(), buf.data(), 4, DType::F32, ReduceOp::Sum); });
  EXPECT_NE(msg.find("all_reduce of 4 fp32 on group 'world'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not attached to a backend"), std::string::npos) << msg;
}

#if SO_TEST_NCCL
TEST_F(CommunicatorTest, AttachRefusesABackendWithoutCudaStreams) {
  BackendOptions opts;
  opts.type = "cpu";
  auto cpu = create_backend(opts);
  const std::string msg = test::error_message([&] { world_->attach(*cpu); });
  EXPECT_NE(msg.find("the NCCL communicator of group 'world'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("needs the cuda backend; got the cpu backend"), std::string::npos) << msg;
}
#else
TEST_F(CommunicatorTest, CountsBeyondMpiIntAreRefused) {
  const int64_t count = int64_t{INT_MAX} + 1;
  const std::string msg =
      test::error_message([&] { world_->all_gather(comm_stream(), nullptr, nullptr, count, DType::BF16); });
  EXPECT_NE(msg.find(str_cat("all_gather of ", count, " bf16")), std::string::npos) << msg;
  EXPECT_NE(msg.find("MPI's int"), std::string::npos) << msg;
}
#endif

TEST_F(CommunicatorTest, PartlyOverlappingBuffersAreRefused) {
  DeviceBuffer buf = alloc(4 * world_->size(), DType::F32);
  const std::string msg = test::error_message(
      [&] { world_->all_to_all(comm_stream(), buf.data(), at(buf, 1, DType::F32), 2, DType::F32); });
  EXPECT_NE(msg.find("overlap"), std::string::npos) << msg;
}

}  // namespace
}  // namespace so
