// The communicator under mpirun (registered for 2 and 4 ranks): every buffer collective in fp32
// and bf16 on awkward counts, in place and not, against the expected values of
// parallel/collective_check.h; stream ordering; the (dp, sp) process-group mesh; the errors.
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

namespace so {
namespace {

class MpiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    backend_ = create_backend(BackendOptions{});
    world_ = make_mpi_world_communicator();
    world_->attach(*backend_);
  }
  static void TearDownTestSuite() {
    world_.reset();
    backend_.reset();
  }

  static Stream& comm_stream() { return backend_->stream(StreamKind::Comm); }
  static DeviceBuffer alloc(int64_t elements, DType dt) { return backend_->alloc(elements * dtype_size(dt), "test"); }
  // Element `i` of a device buffer of dtype dt (device memory is host memory on the CPU backend).
  static char* at(const DeviceBuffer& b, int64_t i, DType dt) { return b.as<char>() + i * dtype_size(dt); }

  // Waits for the comm stream, then expects rank's output `recv` of collective c to be exact.
  static void expect_exact(Collective c, ReduceOp op, DType dt, int64_t count, const void* recv, int root = 0) {
    backend_->synchronize(comm_stream());
    const CheckSpec spec{c, op, dt, count, world_->size(), world_->rank(), root};
    EXPECT_EQ(count_wrong(spec, recv), 0) << collective_name(c) << " of " << count << " " << dtype_name(dt);
  }

  static std::unique_ptr<Backend> backend_;
  static std::unique_ptr<Communicator> world_;
};
std::unique_ptr<Backend> MpiTest::backend_;
std::unique_ptr<Communicator> MpiTest::world_;

struct Case {
  DType dt;
  int64_t count;
};

class Collectives : public MpiTest, public ::testing::WithParamInterface<Case> {
 protected:
  DType dt() const { return GetParam().dt; }
  int64_t count() const { return GetParam().count; }
  int ranks() const { return world_->size(); }
  int rank() const { return world_->rank(); }
};

TEST_P(Collectives, AllReduceSumAndAvg) {
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    DeviceBuffer buf = alloc(count(), dt());
    fill_check_input(buf.data(), count(), dt(), rank());
    world_->all_reduce(comm_stream(), buf.data(), count(), dt(), op);
    expect_exact(Collective::AllReduce, op, dt(), count(), buf.data());
  }
}

TEST_P(Collectives, ReduceScatter) {
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    DeviceBuffer send = alloc(ranks() * count(), dt()), recv = alloc(count(), dt());
    fill_check_input(send.data(), ranks() * count(), dt(), rank());
    world_->reduce_scatter(comm_stream(), recv.data(), send.data(), count(), dt(), op);
    expect_exact(Collective::ReduceScatter, op, dt(), count(), recv.data());
  }
}

TEST_P(Collectives, ReduceScatterIntoOwnBlockOfSend) {
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    DeviceBuffer buf = alloc(ranks() * count(), dt());
    fill_check_input(buf.data(), ranks() * count(), dt(), rank());
    char* own = at(buf, rank() * count(), dt());
    world_->reduce_scatter(comm_stream(), own, buf.data(), count(), dt(), op);
    expect_exact(Collective::ReduceScatter, op, dt(), count(), own);
  }
}

TEST_P(Collectives, AllGather) {
  DeviceBuffer send = alloc(count(), dt()), recv = alloc(ranks() * count(), dt());
  fill_check_input(send.data(), count(), dt(), rank());
  world_->all_gather(comm_stream(), recv.data(), send.data(), count(), dt());
  expect_exact(Collective::AllGather, ReduceOp::Sum, dt(), count(), recv.data());
}

TEST_P(Collectives, AllGatherFromOwnBlockOfRecv) {
  DeviceBuffer recv = alloc(ranks() * count(), dt());
  char* own = at(recv, rank() * count(), dt());
  fill_check_input(own, count(), dt(), rank());
  world_->all_gather(comm_stream(), recv.data(), own, count(), dt());
  expect_exact(Collective::AllGather, ReduceOp::Sum, dt(), count(), recv.data());
}

TEST_P(Collectives, AllToAll) {
  DeviceBuffer send = alloc(ranks() * count(), dt()), recv = alloc(ranks() * count(), dt());
  fill_check_input(send.data(), ranks() * count(), dt(), rank());
  world_->all_to_all(comm_stream(), recv.data(), send.data(), count(), dt());
  expect_exact(Collective::AllToAll, ReduceOp::Sum, dt(), count(), recv.data());
}

TEST_P(Collectives, AllToAllInPlace) {
  DeviceBuffer buf = alloc(ranks() * count(), dt());
  fill_check_input(buf.data(), ranks() * count(), dt(), rank());
  world_->all_to_all(comm_stream(), buf.data(), buf.data(), count(), dt());
  expect_exact(Collective::AllToAll, ReduceOp::Sum, dt(), count(), buf.data());
}

TEST_P(Collectives, BroadcastFromLastRank) {
  const int root = ranks() - 1;
  DeviceBuffer buf = alloc(count(), dt());
  fill_check_input(buf.data(), count(), dt(), rank());
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
TEST_F(MpiTest, BackToBackCollectivesRunInOrder) {
  const int64_t shard = 1003, total = shard * world_->size();
  for (DType dt : {DType::F32, DType::BF16}) {
    DeviceBuffer buf = alloc(total, dt);
    fill_check_input(buf.data(), total, dt, world_->rank());
    char* own = at(buf, world_->rank() * shard, dt);
    world_->reduce_scatter(comm_stream(), own, buf.data(), shard, dt, ReduceOp::Sum);
    world_->all_gather(comm_stream(), buf.data(), own, shard, dt);
    expect_exact(Collective::AllReduce, ReduceOp::Sum, dt, total, buf.data());
  }
}

// The input is written late on the compute stream; the comm stream waits for it by an event.
TEST_F(MpiTest, CollectiveWaitsForComputeEvent) {
  constexpr int64_t count = 1000 + 3;
  DeviceBuffer send = alloc(count, DType::F32), recv = alloc(world_->size() * count, DType::F32);
  const int rank = world_->rank();
  backend_->host_func(backend_->stream(StreamKind::Compute), [&send, rank] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    fill_check_input(send.data(), count, DType::F32, rank);
  });
  auto ready = backend_->create_event();
  backend_->record(*ready, backend_->stream(StreamKind::Compute));
  backend_->wait(comm_stream(), *ready);
  world_->all_gather(comm_stream(), recv.data(), send.data(), count, DType::F32);
  expect_exact(Collective::AllGather, ReduceOp::Sum, DType::F32, count, recv.data());
}

// Inside `group`: the world ranks of its members in group-rank order (all_gather) and their sum
// (all_reduce) — results only the right membership gives.
void expect_members(Communicator& group, Stream& s, Backend& backend, int world_rank, const std::vector<int>& members) {
  const int n = group.size();
  DeviceBuffer mine = backend.alloc(sizeof(float), "rank"), all = backend.alloc(n * sizeof(float), "ranks"),
               sum = backend.alloc(sizeof(float), "sum");
  *mine.as<float>() = static_cast<float>(world_rank);
  *sum.as<float>() = static_cast<float>(world_rank);
  group.all_gather(s, all.data(), mine.data(), 1, DType::F32);
  group.all_reduce(s, sum.data(), 1, DType::F32, ReduceOp::Sum);
  backend.synchronize(s);
  float want_sum = 0;
  for (int j = 0; j < n; ++j) {
    EXPECT_EQ(all.as<float>()[j], static_cast<float>(members[j])) << group.name() << " member " << j;
    want_sum += static_cast<float>(members[j]);
  }
  EXPECT_EQ(*sum.as<float>(), want_sum) << group.name();
}

// (dp, sp) = (1, n), (n, 1) and, on 4 ranks, (2, 2): world rank r = dp_rank * sp + sp_rank.
TEST_F(MpiTest, ProcessGroupMesh) {
  const int n = world_->size();
  std::vector<int> sp_sizes = {n, 1};
  if (n == 4) sp_sizes.push_back(2);
  for (int sp : sp_sizes) {
    SCOPED_TRACE(str_cat("sp_size ", sp, " of ", n, " ranks"));
    auto world = make_mpi_world_communicator();
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
    expect_members(*g.sp, comm_stream(), *backend_, r, sp_members);
    expect_members(*g.dp, comm_stream(), *backend_, r, dp_members);
  }
}

TEST_F(MpiTest, SequenceParallelSizeMustDivideTheRanks) {
  const int n = world_->size();
  EXPECT_NE(test::error_message([&] { make_process_groups(make_mpi_world_communicator(), n + 1); })
                .find(str_cat("sequence_parallel_size ", n + 1, " does not divide the ", n, " ranks of the job")),
            std::string::npos);
  EXPECT_NE(test::error_message([&] { make_process_groups(make_mpi_world_communicator(), 0); })
                .find("sequence_parallel_size must be at least 1, got 0"),
            std::string::npos);
}

TEST_F(MpiTest, BufferCollectivesNeedAnAttachedBackend) {
  auto unattached = make_mpi_world_communicator();
  DeviceBuffer buf = alloc(4, DType::F32);
  const std::string msg = test::error_message(
      [&] { unattached->all_reduce(comm_stream(), buf.data(), 4, DType::F32, ReduceOp::Sum); });
  EXPECT_NE(msg.find("all_reduce of 4 fp32 on group 'world'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not attached to a backend"), std::string::npos) << msg;
}

TEST_F(MpiTest, CountsBeyondMpiIntAreRefused) {
  const int64_t count = int64_t{INT_MAX} + 1;
  const std::string msg =
      test::error_message([&] { world_->all_gather(comm_stream(), nullptr, nullptr, count, DType::BF16); });
  EXPECT_NE(msg.find(str_cat("all_gather of ", count, " bf16")), std::string::npos) << msg;
  EXPECT_NE(msg.find("MPI's int"), std::string::npos) << msg;
}

TEST_F(MpiTest, PartlyOverlappingBuffersAreRefused) {
  DeviceBuffer buf = alloc(4 * world_->size(), DType::F32);
  const std::string msg = test::error_message(
      [&] { world_->all_to_all(comm_stream(), buf.data(), at(buf, 1, DType::F32), 2, DType::F32); });
  EXPECT_NE(msg.find("overlap"), std::string::npos) << msg;
}

}  // namespace
}  // namespace so
