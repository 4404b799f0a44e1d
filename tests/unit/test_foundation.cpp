// Unit tests of the foundation's small parts: bf16 rounding, CPU streams and events, the memory
// pool's capacity, config validation, data files and sampling, LR schedules, FLOP counting.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

#include "so/backend/backend.h"
#include "so/core/error.h"
#include "so/core/json_reader.h"
#include "so/data/batch_sampler.h"
#include "so/engine/bucket.h"
#include "so/io/crc32c.h"
#include "so/io/direct_io_file.h"
#include "so/io/hdf5_file.h"
#include "so/train/run_config.h"
#include "tests/test_util.h"

namespace so {
namespace {

TEST(Bf16, RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(f32_to_bf16(1.0f).bits, 0x3f80);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties go to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.00390625f).bits, 0x3f80);
  // 1 + 3*2^-8 is halfway between 1.0078125 (odd mantissa) and 1.015625: goes up to even.
  EXPECT_EQ(f32_to_bf16(1.01171875f).bits, 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  // A NaN whose payload sits only in the low bits must not truncate to Inf.
  uint32_t u = 0x7f800001u;
  float f;
  std::memcpy(&f, &u, 4);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
  EXPECT_TRUE(std::isinf(bf16_to_f32(f32_to_bf16(INFINITY))));
}

TEST(CpuStreams, EventsOrderWorkAcrossStreams) {
  auto be = create_backend(test::cpu_backend_options());
  Stream& a = be->stream(StreamKind::Compute);
  Stream& b = be->stream(StreamKind::D2H);
  std::atomic<int> value{0};
  int seen = -1;
  auto ev = be->create_event();
  be->host_func(a, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    value = 42;
  });
  be->record(*ev, a);
  be->wait(b, *ev);
  be->host_func(b, [&] { seen = value.load(); });
  be->synchronize(b);
  EXPECT_EQ(seen, 42);
}

TEST(CpuStreams, AnErrorReachesWaitersInsteadOfHangingThem) {
  auto be = create_backend(test::cpu_backend_options());
  Stream& a = be->stream(StreamKind::Compute);
  Stream& b = be->stream(StreamKind::H2D);
  bool ran = false;
  auto ev = be->create_event();
  be->host_func(a, [] { SO_FAIL("injected failure"); });
  be->record(*ev, a);
  be->wait(b, *ev);
  be->host_func(b, [&] { ran = true; });
  EXPECT_THROW(be->synchronize(b), Error);
  EXPECT_FALSE(ran);
  EXPECT_THROW(be->synchronize(a), Error);
}

TEST(CpuBackend, CapacityLimitNamesTheAllocation) {
  BackendOptions o = test::cpu_backend_options();
  o.device_memory_limit = 1 << 20;
  auto be = create_backend(o);
  auto a = be->alloc(600 << 10, "first");
  try {
    auto b = be->alloc(600 << 10, "activations of layer 7");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("activations of layer 7"), std::string::npos);
  }
  a.reset();
  EXPECT_EQ(be->memory_stats().in_use, 0u);
  EXPECT_NO_THROW(be->alloc(600 << 10, "after free"));
}

nlohmann::json demo_config() {
  return nlohmann::json::parse(R"({
    "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "model": {"config": "configs/models/tiny.json"},
    "data": {"type": "text", "path": "data/corpus/austen.txt", "seq_len": 32},
    "train": {"steps": 3}
  })");
}

std::string config_error(nlohmann::json doc) {
  try {
    parse_run_config(doc, "test.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Bit by bit, as the polynomial is defined: what the table, the instruction and the three-lane
// path must all agree with, at lengths around the lanes' edges.
uint32_t crc32c_bitwise(const unsigned char* p, size_t n) {
  uint32_t c = ~0u;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

TEST(Crc32c, MatchesTheDefinitionAtEveryLength) {
  EXPECT_EQ(so::crc32c("123456789", 9), 0xE3069283u);  // the check value of CRC-32C
  std::mt19937 rng(7);
  std::vector<unsigned char> buf(3 * 8192 * 4 + 100);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{3 * 8192 - 1}, size_t{3 * 8192},
                   size_t{3 * 8192 + 1}, size_t{3 * 8192 * 2 + 9}, buf.size()}) {
    SCOPED_TRACE(n);
    EXPECT_EQ(so::crc32c(buf.data() + 1, n - (n > 0)), crc32c_bitwise(buf.data() + 1, n - (n > 0)));
  }
  const size_t cut = 3 * 8192 + 5;  // continuation: crc(b, crc(a)) == crc(a || b)
  EXPECT_EQ(so::crc32c(buf.data() + cut, buf.size() - cut, so::crc32c(buf.data(), cut)),
            crc32c_bitwise(buf.data(), buf.size()));
}

// Direct and buffered transfers give the same file, at offsets and lengths that are and are not
// block-aligned and longer than one I/O piece; a read past the end names the truncation.
TEST(DirectIoFile, DirectAndBufferedAgree) {
  const so::test::ScratchDir scratch("direct_io");
  const std::string dir = scratch.path().string();
  const size_t size = so::DirectIoFile::kPieceBytes * 2 + 3 * 4096 + 123;
  std::mt19937 rng(3);
  std::vector<char> data(size);
  for (auto& c : data) c = static_cast<char>(rng());
  const std::vector<std::pair<size_t, size_t>> pieces = {
      {0, 100},
      {100, 4096 * 3 - 100},
      {4096 * 3, so::DirectIoFile::kPieceBytes + 77},
      {4096 * 3 + so::DirectIoFile::kPieceBytes + 77, size - (4096 * 3 + so::DirectIoFile::kPieceBytes + 77)}};
  std::vector<std::vector<char>> files;
  for (bool direct : {true, false}) {
    const std::string path = dir + (direct ? "/direct.bin" : "/buffered.bin");
    { std::ofstream(path, std::ios::binary).write(std::string(size, '\0').data(), static_cast<std::streamsize>(size)); }
    so::DirectIoFile out(path, so::DirectIoFile::Mode::Write, direct);
    if (direct && !out.direct()) std::printf("note: %s has no O_DIRECT; both runs are buffered\n", dir.c_str());
    for (auto it = pieces.rbegin(); it != pieces.rend(); ++it)
      out.write_at(data.data() + it->first, it->second, it->first, "test");
    out.sync("test");
    std::ifstream in(path, std::ios::binary);
    files.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    so::DirectIoFile reader(path, so::DirectIoFile::Mode::Read, direct);
    for (const auto& [at, n] : pieces) {
      std::vector<char> got(n);
      reader.read_at(got.data(), n, at, "test");
      EXPECT_EQ(0, std::memcmp(got.data(), data.data() + at, n)) << "direct " << direct << " at " << at;
    }
    std::vector<char> past(200);
    try {
      reader.read_at(past.data(), past.size(), size - 100, "test read");
      ADD_FAILURE() << "a read past the end succeeded";
    } catch (const so::Error& e) {
      EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(files[0], std::vector<char>(data.begin(), data.end()));
  EXPECT_EQ(files[1], files[0]);
}

// write_from's fills and read_to's sinks see every byte of the transfer once, in order, in pieces
// that split where the 4 MiB I/O pieces and the partial blocks do — the contract the checkpoint
// writer's running checksum and the loader's in-place checks rely on.
TEST(DirectIoFile, FillsAndSinksCoverEachByteOnceInOrder) {
  const so::test::ScratchDir scratch("direct_io_fill");
  const size_t size = so::DirectIoFile::kPieceBytes * 3;
  std::mt19937 rng(5);
  std::vector<char> data(size);
  for (auto& c : data) c = static_cast<char>(rng());
  for (bool direct : {true, false}) {
    const std::string path = scratch.path().string() + (direct ? "/d.bin" : "/b.bin");
    { std::ofstream(path, std::ios::binary).write(std::string(size, '\0').data(), static_cast<std::streamsize>(size)); }
    const uint64_t at = 1000;  // neither block- nor piece-aligned
    const size_t bytes = so::DirectIoFile::kPieceBytes * 2 + 5000;
    size_t next = 0, calls = 0;
    {
      so::DirectIoFile out(path, so::DirectIoFile::Mode::Write, direct);
      out.write_from(
          bytes, at,
          [&](char* dst, size_t from, size_t n) {
            EXPECT_EQ(from, next) << "fill out of order";
            EXPECT_GT(n, 0u);
            std::memcpy(dst, data.data() + from, n);
            next = from + n, ++calls;
          },
          "test");
      out.sync("test");
    }
    EXPECT_EQ(next, bytes);
    EXPECT_GE(calls, direct ? 4u : 3u) << "partial blocks and pieces come as separate fills";
    so::DirectIoFile in(path, so::DirectIoFile::Mode::Read, direct);
    std::vector<char> got(bytes);
    next = 0;
    in.read_to(
        bytes, at,
        [&](const char* src, size_t from, size_t n) {
          EXPECT_EQ(from, next) << "sink out of order";
          std::memcpy(got.data() + from, src, n);
          next = from + n;
        },
        "test");
    EXPECT_EQ(next, bytes);
    EXPECT_EQ(0, std::memcmp(got.data(), data.data(), bytes)) << "direct " << direct;
  }
}

// Read-ahead follows the planned ranges (a rank's own slices) and moves no other byte; a read off
// the plan is served too, and reading then goes on through the file from there.
TEST(DirectIoFile, ReadAheadFollowsThePlanAndNothingElse) {
  const so::test::ScratchDir scratch("direct_io_plan");
  const std::string path = scratch.path().string() + "/p.bin";
  const size_t piece = so::DirectIoFile::kPieceBytes, size = 8 * piece;
  std::vector<char> data(size);
  std::mt19937 rng(7);
  for (auto& c : data) c = static_cast<char>(rng());
  { std::ofstream(path, std::ios::binary).write(data.data(), static_cast<std::streamsize>(size)); }
  so::DirectIoFile in(path, so::DirectIoFile::Mode::Read);
  if (!in.direct()) GTEST_SKIP() << scratch.path() << " has no O_DIRECT: nothing is read ahead";
  // Two slices of 1 MiB + 100 bytes, unaligned, with a tensor's worth of other ranks' bytes between.
  const std::vector<so::DirectIoFile::Range> mine = {{1000, (1u << 20) + 100}, {5 * piece + 3000, (1u << 20) + 100}};
  in.will_read(mine);
  for (const auto& r : mine) {
    std::vector<char> got(r.bytes);
    in.read_at(got.data(), r.bytes, r.offset, "test");
    EXPECT_EQ(0, std::memcmp(got.data(), data.data() + r.offset, r.bytes)) << "at " << r.offset;
  }
  const uint64_t planned = in.direct_bytes_read();
  EXPECT_LE(planned, 2 * ((1u << 20) + 2 * 4096)) << "read ahead past the planned slices";
  EXPECT_GE(planned, 2 * ((1u << 20) + 100));
  // Off the plan: the bytes are right, and what follows is read ahead from there.
  std::vector<char> got(1u << 20);
  in.read_at(got.data(), got.size(), 2 * piece + 10, "test");
  EXPECT_EQ(0, std::memcmp(got.data(), data.data() + 2 * piece + 10, got.size()));
  EXPECT_GE(in.direct_bytes_read() - planned, 2 * piece) << "no read-ahead after leaving the plan";
}

// Partial blocks are held back while direct writes run (a buffered write would wait on the inode
// lock they hold) and land with sync() — or, unsynced, when the file closes.
TEST(DirectIoFile, PartialBlocksLandWithSync) {
  const so::test::ScratchDir scratch("direct_io_partial");
  const std::string path = scratch.path().string() + "/w.bin";
  const size_t size = 4 * 4096;
  { std::ofstream(path, std::ios::binary).write(std::string(size, '\0').data(), static_cast<std::streamsize>(size)); }
  const auto file = [&] {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  };
  const std::string bytes(2 * 4096 + 200, 'x');  // a partial block, a whole one, a partial one
  {
    so::DirectIoFile out(path, so::DirectIoFile::Mode::Write);
    if (!out.direct()) GTEST_SKIP() << scratch.path() << " has no O_DIRECT: every write is buffered";
    out.write_at(bytes.data(), bytes.size(), 4096 - 100, "test");
    out.write_at("ab", 2, 3 * 4096 + 1000, "test");
    EXPECT_EQ(file().substr(4096 - 100, 100), std::string(100, '\0')) << "a partial block was written before sync";
    out.sync("test");
    const std::string after = file();
    EXPECT_TRUE(after.substr(4096 - 100, bytes.size()) == bytes) << "the partial blocks are missing after sync";
    EXPECT_EQ(after.substr(3 * 4096 + 1000, 2), "ab");
    out.write_at("cd", 2, 100, "test");  // left for the destructor
  }
  EXPECT_EQ(file().substr(100, 2), "cd");
}

TEST(RunConfig, AcceptsTheDemoShape) {
  const RunConfig c = parse_run_config(demo_config(), "test.json");
  EXPECT_EQ(c.model.num_layers, 4);
  EXPECT_EQ(c.micro_batch, 2);
  EXPECT_FLOAT_EQ(c.schedule.base_lr, 1e-3f);
}

TEST(RunConfig, RejectsWithTheKeyPath) {
  auto doc = demo_config();
  doc["optimizer"]["params"]["lrr"] = 1;
  EXPECT_NE(config_error(doc).find("unknown key 'optimizer.params.lrr'"), std::string::npos) << config_error(doc);
  doc = demo_config();
  doc["train_micro_batch_size_per_gpu"] = "two";
  EXPECT_NE(config_error(doc).find("'train_micro_batch_size_per_gpu' must be an integer"), std::string::npos);
  doc = demo_config();
  doc["data"]["path"] = "no/such/file.txt";
  EXPECT_NE(config_error(doc).find("'data.path' names 'no/such/file.txt', which does not exist"), std::string::npos);
  doc = demo_config();
  doc["model"] = {{"inline",
                   {{"model_type", "llama"},
                    {"vocab_size", 256},
                    {"hidden_size", 64},
                    {"intermediate_size", 128},
                    {"num_hidden_layers", 1},
                    {"num_attention_heads", 6},
                    {"num_key_value_heads", 4},
                    {"head_dim", 16}}}};
  EXPECT_NE(config_error(doc).find("'num_attention_heads' (6) is not divisible by num_key_value_heads (4)"),
            std::string::npos)
      << config_error(doc);
  doc = demo_config();
  doc["fp16"] = {{"enabled", true}};
  EXPECT_NE(config_error(doc).find("fp16"), std::string::npos);
  doc = demo_config();
  doc["data"]["seq_len"] = 4096;
  EXPECT_NE(config_error(doc).find("max_position_embeddings"), std::string::npos);
  doc = demo_config();
  doc["backend"]["attention"] = "sdpa";
  EXPECT_NE(config_error(doc).find("'backend.attention' is 'sdpa'; supported: auto, cudnn, flash"), std::string::npos)
      << config_error(doc);
  doc = demo_config();
  doc["backend"]["deterministic_attention"] = "yes";
  EXPECT_NE(config_error(doc).find("'backend.deterministic_attention' must be"), std::string::npos)
      << config_error(doc);
}

// DeepSpeed's rules (deepspeed/runtime/config.py), the cases its own code was run on.
TEST(RunConfig, BatchSizesAreDerivedAsDeepSpeedDerivesThem) {
  struct Case {
    int64_t tb, mb, ga, dp;
    int64_t want_mb, want_ga, want_tb;  // 0: an error is expected
  };
  const Case cases[] = {
      {4, 0, 1, 1, 4, 1, 4},                           // the SuperOffload example: micro derived
      {4, 0, 0, 2, 2, 1, 4},                           // global only: micro = global / dp
      {0, 2, 0, 4, 2, 1, 8},                           // micro only: global = micro x dp
      {0, 2, 3, 2, 2, 3, 12},                          // micro and accumulation
      {16, 2, 0, 2, 2, 4, 16},                         // global and micro: accumulation derived
      {0, 0, 0, 3, 1, 1, 3},                           // none: so_train's micro-batch 1
      {10, 3, 0, 1, 0, 0, 0},                          // 10 / 3 does not divide
      {10, 0, 3, 1, 0, 0, 0},  {6, 0, 0, 4, 0, 0, 0},  // 6 / 4
      {8, 2, 3, 1, 0, 0, 0},                           // 2 x 3 x 1 != 8
  };
  for (const Case& c : cases) {
    RunConfig cfg;
    cfg.source = "test.json";
    cfg.train_batch_size = c.tb, cfg.micro_batch = c.mb, cfg.grad_accum = c.ga;
    SCOPED_TRACE(::testing::Message() << "tb " << c.tb << " mb " << c.mb << " ga " << c.ga << " dp " << c.dp);
    if (c.want_tb == 0) {
      try {
        resolve_batch_sizes(cfg, c.dp);
        ADD_FAILURE() << "no error";
      } catch (const Error& e) {
        // Every message names all three and the data-parallel size.
        EXPECT_NE(std::string(e.what()).find(str_cat("data-parallel size ", c.dp)), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("train_micro_batch_size_per_gpu"), std::string::npos) << e.what();
      }
      continue;
    }
    const BatchSizes b = resolve_batch_sizes(cfg, c.dp);
    EXPECT_EQ(b.micro, c.want_mb);
    EXPECT_EQ(b.accumulation, c.want_ga);
    EXPECT_EQ(b.global, c.want_tb);
  }
}

TEST(RunConfig, OverridesParseJsonOrStrings) {
  auto doc = demo_config();
  apply_override(doc, "optimizer.params.lr=3e-4");
  apply_override(doc, "data.type=synthetic");
  apply_override(doc, "bf16.enabled=true");
  EXPECT_DOUBLE_EQ(doc["optimizer"]["params"]["lr"].get<double>(), 3e-4);
  EXPECT_EQ(doc["data"]["type"], "synthetic");
  EXPECT_TRUE(doc["bf16"]["enabled"].get<bool>());
  EXPECT_THROW(apply_override(doc, "novalue"), Error);
  EXPECT_THROW(apply_override(doc, "data.type.x=1"), Error);
}

TEST(Data, TokenFileRoundTripAndCorruption) {
  const auto dir = std::filesystem::temp_directory_path() / ("so_test_data_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "t.bin").string();
  std::vector<int32_t> tokens(1000);
  for (int i = 0; i < 1000; ++i) tokens[i] = (i * 37) % 300;
  write_token_file(path, tokens, 2);
  {
    auto src = open_token_file(path);
    ASSERT_EQ(src->size(), 1000);
    std::vector<int32_t> got(1000);
    src->read(0, 1000, got.data());
    EXPECT_EQ(got, tokens);
  }
  std::filesystem::resize_file(path, 32 + 999 * 2);
  try {
    open_token_file(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  std::ofstream(path, std::ios::trunc) << "plain text, not tokens, but long enough for a header";
  EXPECT_THROW(open_token_file(path), Error);
  std::filesystem::remove_all(dir);
}

// Crafted and odd data files: refused with the file named, never read out of bounds, never waited on.
TEST(Data, CraftedAndOddFilesAreRefused) {
  const test::ScratchDir scratch("odd_data_files");
  const std::filesystem::path& dir = scratch.path();
  // A header whose token count times 4 bytes wraps around 64 bits to the 2000 bytes that follow.
  const std::string wrap = (dir / "wrap.bin").string();
  {
    char h[TokenFileFormat::kHeaderBytes] = {};
    const uint32_t version = TokenFileFormat::kVersion, bpt = 4;
    const uint64_t count = (uint64_t{1} << 62) + 500;
    std::memcpy(h, TokenFileFormat::kMagic, 8);
    std::memcpy(h + 8, &version, 4);
    std::memcpy(h + 12, &bpt, 4);
    std::memcpy(h + 16, &count, 8);
    std::ofstream f(wrap, std::ios::binary);
    f.write(h, sizeof(h));
    f << std::string(2000, '\0');
  }
  std::string msg = test::error_message([&] { open_token_file(wrap); });
  EXPECT_NE(msg.find("header promises 4611686018427388404 tokens"), std::string::npos) << msg;
  EXPECT_NE(msg.find("wrap.bin"), std::string::npos) << msg;
  // A FIFO is refused at once by every reader (opening one for reading would wait for a writer).
  const std::string fifo = (dir / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const auto& open : std::vector<std::function<void()>>{
           [&] { open_token_file(fifo); }, [&] { open_text_bytes(fifo); }, [&] { open_hdf5_tokens(fifo, "tokens"); }}) {
    msg = test::error_message(open);
    EXPECT_NE(msg.find("is not a regular file"), std::string::npos) << msg;
  }
  // Float token ids in an HDF5 dataset are refused, not truncated to integers.
  const std::string h5 = (dir / "float_tokens.h5").string();
  {
    const hid_t f = H5Fcreate(h5.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const hsize_t n = 8;
    const hid_t space = H5Screate_simple(1, &n, nullptr);
    const hid_t d = H5Dcreate2(f, "tokens", H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    const float values[8] = {1.5f, 2.5f, 3.9f, 4, 5, 6, 7, 8};
    ASSERT_GE(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values), 0);
    H5Dclose(d), H5Sclose(space), H5Fclose(f);
  }
  msg = test::error_message([&] { open_hdf5_tokens(h5, "tokens"); });
  EXPECT_NE(msg.find("holds 32-bit floats; token ids must be integers"), std::string::npos) << msg;
}

TEST(Data, SamplingIsDeterministicShiftedAndChecked) {
  auto src = make_synthetic_tokens(50, 10000, 7);
  BatchSampler a(*src, 16, 4, 50, 99), b(*src, 16, 4, 50, 99);
  const TokenBatch x = a.next(), y = a.next();
  EXPECT_EQ(x.inputs, b.batch_at(0).inputs);
  EXPECT_EQ(y.inputs, b.batch_at(4).inputs);
  EXPECT_NE(x.inputs, y.inputs);
  EXPECT_EQ(a.position(), 8);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(x.targets[i], x.inputs[i + 1]);
  EXPECT_EQ(x.positions[17], 1);
  BatchSampler small_vocab(*src, 16, 4, 10, 99);  // tokens up to 49 exceed vocab 10
  EXPECT_THROW(small_vocab.next(), Error);
  EXPECT_THROW(BatchSampler(*make_synthetic_tokens(50, 10, 1), 16, 1, 50, 1), Error);
}

TEST(LrSchedule, DeepSpeedWarmupCosineShape) {
  LrSchedule s;
  s.type = "WarmupCosineLR";
  s.base_lr = 1.0;
  s.warmup_steps = 10;
  s.warmup_type = "linear";
  s.total_steps = 110;
  s.cos_min_ratio = 0.1;
  // Step k runs at DeepSpeed's get_lr() after k - 1 scheduler steps (test_lr_schedules holds every
  // schedule to DeepSpeed's definitions step by step).
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.0);
  EXPECT_DOUBLE_EQ(s.lr_at(6), 0.5);
  EXPECT_NEAR(s.lr_at(60), 0.1 + 0.9 * 0.5, 1e-12);  // halfway through the cosine
  EXPECT_NEAR(s.lr_at(110), 0.1, 1e-12);
  s.warmup_type = "log";
  EXPECT_NEAR(s.lr_at(5), std::log(5.0) / std::log(10.0), 1e-12);
}

TEST(Model, FlopsAndBucketsFollowTheLayout) {
  const ModelConfig c = ModelConfig::from_hf_file("configs/models/tiny.json");
  const ParamLayout L = ParamLayout::for_model(c);
  int64_t matmul = 0, total = 0;
  for (const ParamInfo& p : L.params) {
    total += p.numel;
    if (p.shape.size() == 2) matmul += p.numel;  // tied: the embedding doubles as lm_head
  }
  EXPECT_EQ(total, c.num_parameters());
  const int64_t S = 128;
  const double attn = c.num_layers * 4.0 * c.head_dim * c.num_heads * (S + 1) / 2.0;
  EXPECT_DOUBLE_EQ(train_flops_per_token(c, S), 3.0 * (2.0 * matmul + attn));
  // Non-causal: every query against all S keys.
  const double attn_all = c.num_layers * 4.0 * c.head_dim * c.num_heads * S;
  EXPECT_DOUBLE_EQ(train_flops_per_token(c, S, false), 3.0 * (2.0 * matmul + attn_all));

  // Biases (Seed-OSS: q, k, v and o) are parameters of the layout and of the count, and cost 1
  // FLOP per element each way.
  ModelConfig b = c;
  b.qkv_bias = b.o_bias = true;
  int64_t bias = 0, with_bias = 0;
  for (const ParamInfo& p : ParamLayout::for_model(b).params) {
    with_bias += p.numel;
    if (p.is_bias) bias += p.numel;
  }
  EXPECT_EQ(bias, c.num_layers * (c.q_dim() + 2 * c.kv_dim() + c.hidden_size));
  EXPECT_EQ(with_bias, b.num_parameters());
  EXPECT_DOUBLE_EQ(train_flops_per_token(b, S) - train_flops_per_token(c, S), 2.0 * bias);

  const auto buckets = make_buckets(L, 20000);
  ASSERT_GT(buckets.size(), 3u);
  EXPECT_EQ(buckets.front().end, L.total);  // head first, in backward order
  EXPECT_EQ(buckets.back().begin, 0);
  for (size_t i = 1; i < buckets.size(); ++i) {
    EXPECT_EQ(buckets[i].end, buckets[i - 1].begin);
    EXPECT_LE(buckets[i].ready_unit, buckets[i - 1].ready_unit);
  }
  EXPECT_EQ(buckets.back().ready_unit, 0);  // tied embedding: final only after embedding backward
}

// The runs one GEMM reads as one matrix, a dense MLP's [W_gate; W_up], attention's [W_q; W_k; W_v]
// and [b_q; b_k; b_v], follow each other with no padding whatever their sizes, and no bucket size
// separates them; every other parameter stays aligned. With and without attention biases, with
// q dim != hidden (Seed-OSS) and GQA.
TEST(Model, JoinedProjectionsAreOneMatrixInOneBucket) {
  for (bool bias : {false, true}) {
    ModelConfig c = ModelConfig::from_hf_file("configs/models/tiny.json");
    c.intermediate_size = 37;  // I x H not a multiple of the alignment
    c.qkv_bias = bias;
    c.head_dim = 12;  // q dim = heads x 12 != hidden, kv dim odd multiples: nothing aligned by chance
    c.num_kv_heads = 1;
    const ParamLayout L = ParamLayout::for_model(c);
    std::vector<std::vector<int>> runs;
    for (const LayerParamIds& w : L.layers) {
      runs.push_back({w.gate, w.up});
      runs.push_back({w.q, w.k, w.v});
      if (bias) runs.push_back({w.q_bias, w.k_bias, w.v_bias});
      EXPECT_EQ(w.q_bias >= 0, bias);
    }
    for (const std::vector<int>& run : runs)
      for (size_t i = 1; i < run.size(); ++i) {
        ASSERT_EQ(run[i], run[i - 1] + 1) << L.params[run[0]].name;
        EXPECT_TRUE(L.params[run[i - 1]].joined_to_next) << L.params[run[i - 1]].name;
        EXPECT_EQ(L.params[run[i]].offset, L.params[run[i - 1]].offset + L.params[run[i - 1]].numel)
            << L.params[run[i]].name;
      }
    for (size_t id = 0; id < L.params.size(); ++id) {
      if (id == 0 || !L.params[id - 1].joined_to_next) {
        EXPECT_EQ(L.params[id].offset % ParamLayout::kAlign, 0) << id;
      }
    }
    for (int64_t bucket_size : {1, 5000, 1 << 20}) {
      const auto buckets = make_buckets(L, bucket_size);
      std::vector<size_t> bucket_of(L.params.size());
      for (size_t b = 0; b < buckets.size(); ++b) {
        for (int id : buckets[b].params) bucket_of[id] = b;
        if (b > 0) {
          EXPECT_EQ(buckets[b].end, buckets[b - 1].begin);
        }
      }
      EXPECT_EQ(buckets.front().end, L.total);
      EXPECT_EQ(buckets.back().begin, 0);
      for (const std::vector<int>& run : runs)
        for (int id : run)
          EXPECT_EQ(bucket_of[id], bucket_of[run[0]]) << L.params[id].name << ", bucket size " << bucket_size;
    }
  }
}

}  // namespace
}  // namespace so

namespace so {
namespace {

// The shipped model shapes parse and have the parameter counts their names promise.
TEST(ModelConfigs, ShippedShapesParseWithExpectedSizes) {
  const std::pair<const char*, double> expected[] = {
      {"llama-3-8b", 8.03e9}, {"llama-3-70b", 70.55e9}, {"qwen3-14b", 14.77e9},   {"llama-13b", 13.0e9},
      {"llama-25b", 25.0e9},  {"llama-50b", 50.5e9},    {"llama-3.1-8b", 8.03e9}, {"llama-3.3-70b", 70.55e9},
      {"phi-4", 14.66e9},     {"qwen2.5-7b", 7.62e9}};
  for (const auto& [name, params] : expected) {
    const ModelConfig c = ModelConfig::from_hf_file(std::string("configs/models/") + name + ".json");
    EXPECT_NEAR(c.num_parameters() / params, 1.0, 0.02) << name << ": " << c.num_parameters();
  }
  // Seed-OSS as published trains with attention and residual dropout 0.1, which so_train honours;
  // 36.15 B parameters. A probability of 1 is refused by name.
  const std::string seed = "configs/models/seed-oss-36b.json";
  const ModelConfig published = ModelConfig::from_hf_file(seed);
  EXPECT_EQ(published.attention_dropout, 0.1f);
  EXPECT_EQ(published.residual_dropout, 0.1f);
  nlohmann::json j = read_json_file(seed, "model config");
  j["attention_dropout"] = 1.0;
  EXPECT_NE(test::error_message([&] {
              ModelConfig::from_hf_json(j, seed);
            }).find("'attention_dropout' is 1; a drop probability is in [0, 1)"),
            std::string::npos);
  j["attention_dropout"] = j["residual_dropout"] = 0.0;
  EXPECT_NEAR(ModelConfig::from_hf_json(j, seed).num_parameters() / 36.15e9, 1.0, 0.02);
}

}  // namespace
}  // namespace so

namespace so {
namespace {

// A config is bounded by its tensor and parameter counts before any per-tensor table is built:
// Qwen3-MoE with 4096 layers of 65536 experts (every key within its bound) is refused by name at
// once, not after building 805M tensor entries; a dense model at every size bound (2.2e20
// parameters, past int64 for the plan's byte counts) likewise. Below the bounds the count is exact.
TEST(ModelConfigs, TensorAndParameterCountsAreBoundedBeforeAnyTable) {
  nlohmann::json moe = {{"model_type", "qwen3_moe"},  {"vocab_size", 64},          {"hidden_size", 32},
                        {"intermediate_size", 64},    {"num_hidden_layers", 4096}, {"num_attention_heads", 4},
                        {"num_key_value_heads", 2},   {"num_experts", 65536},      {"num_experts_per_tok", 2},
                        {"moe_intermediate_size", 16}};
  std::string msg = test::error_message([&] { ModelConfig::from_hf_json(moe, "moe"); });
  // 4096 layers x (1 router + 3 x 65536 experts + 8 attention and norm tensors) + embedding, norm, head.
  const int64_t tensors = 4096 * (1 + 3 * 65536 + 8) + 3;
  EXPECT_NE(msg.find(str_cat("'num_hidden_layers' (4096) with num_experts (65536) makes ", tensors, " tensors")),
            std::string::npos)
      << msg;
  moe["num_hidden_layers"] = 16;  // 3.1M tensors: the 1.5 GB of the first report
  msg = test::error_message([&] { ModelConfig::from_hf_json(moe, "moe"); });
  EXPECT_NE(msg.find("'num_hidden_layers' (16) with num_experts (65536) makes"), std::string::npos) << msg;

  const nlohmann::json huge = {{"model_type", "llama"},      {"vocab_size", 1 << 26},
                               {"hidden_size", 1 << 18},     {"intermediate_size", 1 << 20},
                               {"num_hidden_layers", 4096},  {"num_attention_heads", 4096},
                               {"num_key_value_heads", 4096}};
  msg = test::error_message([&] { ModelConfig::from_hf_json(huge, "huge"); });
  // 2 V H + H + L (4 H^2 + 2 H + 3 H I): q, k, v, o of H x H (head_dim 64 x 4096 heads), two norms, the MLP.
  const __int128 V = 1 << 26, H = 1 << 18, I = 1 << 20, L = 4096;
  __int128 want = 2 * V * H + H + L * (4 * H * H + 2 * H + 3 * H * I);
  std::string digits;
  for (; want > 0; want /= 10) digits.insert(digits.begin(), static_cast<char>('0' + static_cast<int>(want % 10)));
  EXPECT_NE(msg.find(str_cat(" makes ", digits, " parameters, more than 2^50")), std::string::npos) << msg;
  EXPECT_NE(msg.find("vocab_size 67108864, hidden_size 262144, intermediate_size 1048576"), std::string::npos) << msg;

  // Just below the bound: the count equals the layout's, element for element.
  nlohmann::json big = huge;
  big["num_hidden_layers"] = 32, big["intermediate_size"] = 1 << 16, big["hidden_size"] = 1 << 16;
  big["num_attention_heads"] = big["num_key_value_heads"] = 512;
  const ModelConfig c = ModelConfig::from_hf_json(big, "big");
  int64_t total = 0;
  for (const ParamInfo& p : ParamLayout::for_model(c).params) total += p.numel;
  EXPECT_EQ(c.num_parameters(), total);
  EXPECT_GT(c.num_parameters(), int64_t{1} << 43);

  // mlp_only_layers is a set: a million repeats of one layer read as that layer.
  moe["num_hidden_layers"] = 4, moe["num_experts"] = 4;
  moe["mlp_only_layers"] = std::vector<int64_t>(1'000'000, 2);
  const ModelConfig dense2 = ModelConfig::from_hf_json(moe, "moe");
  EXPECT_EQ(dense2.moe.dense_layers, std::vector<int64_t>{2});
  EXPECT_FALSE(dense2.is_moe_layer(2));
  EXPECT_TRUE(dense2.is_moe_layer(3));
}

// Sliding windows as transformers applies them: Mistral's on every layer; Qwen2's only with
// use_sliding_window, on the layers layer_types marks (by default from max_window_layers on);
// export writes what was trained; families without windows refuse sliding layers by name.
TEST(ModelConfigs, SlidingWindowLayersAsTransformersAppliesThem) {
  const nlohmann::json base = {{"vocab_size", 64},       {"hidden_size", 32},        {"intermediate_size", 64},
                               {"num_hidden_layers", 4}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}};
  const auto windows = [](const ModelConfig& c) {
    std::vector<int64_t> w;
    for (int64_t l = 0; l < c.num_layers; ++l) w.push_back(c.layer_window(l));
    return w;
  };
  nlohmann::json mistral = base;
  mistral["model_type"] = "mistral";
  mistral["sliding_window"] = 16;
  EXPECT_EQ(windows(ModelConfig::from_hf_json(mistral, "mistral")), (std::vector<int64_t>{16, 16, 16, 16}));
  mistral["sliding_window"] = nullptr;
  EXPECT_EQ(windows(ModelConfig::from_hf_json(mistral, "mistral")), (std::vector<int64_t>{0, 0, 0, 0}));

  nlohmann::json qwen2 = base;
  qwen2["model_type"] = "qwen2";
  qwen2["sliding_window"] = 8;  // ignored without use_sliding_window, as Qwen2Config does
  qwen2["max_window_layers"] = 2;
  EXPECT_EQ(windows(ModelConfig::from_hf_json(qwen2, "qwen2")), (std::vector<int64_t>{0, 0, 0, 0}));
  qwen2["use_sliding_window"] = true;
  const ModelConfig q = ModelConfig::from_hf_json(qwen2, "qwen2");
  EXPECT_EQ(windows(q), (std::vector<int64_t>{0, 0, 8, 8}));
  const nlohmann::json exported = q.to_hf_json();
  EXPECT_EQ(windows(ModelConfig::from_hf_json(exported, "export")), windows(q)) << exported.dump();
  qwen2["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention", "full_attention"};
  EXPECT_EQ(windows(ModelConfig::from_hf_json(qwen2, "qwen2")), (std::vector<int64_t>{8, 0, 8, 0}));
  qwen2["layer_types"] = {"sliding_attention", "full_attention"};
  EXPECT_NE(test::error_message([&] {
              ModelConfig::from_hf_json(qwen2, "qwen2");
            }).find("it must list \"full_attention\" or \"sliding_attention\" for each of the 4 layers"),
            std::string::npos);

  nlohmann::json llama = base;
  llama["model_type"] = "llama";
  llama["use_sliding_window"] = true;
  EXPECT_NE(test::error_message([&] {
              ModelConfig::from_hf_json(llama, "llama");
            }).find("'use_sliding_window' is true; llama models have no sliding-window attention"),
            std::string::npos);
}

}  // namespace
}  // namespace so
