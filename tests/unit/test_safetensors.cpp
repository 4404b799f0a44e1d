// The safetensors reader and writer: round trips in F32 and BF16, the exact fp16 widening, and
// one crafted file per validation rule (docs/checkpoints.md), each refused with a message that
// names the file and the tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "so/io/safetensors.h"
#include "tests/test_util.h"

namespace so {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public testing::Test {
 protected:
  std::string path(const std::string& name) const { return (dir_.path() / name).string(); }

  // A file with the given header text and `data_bytes` bytes of data; `header_len` overrides the
  // length field (default: the header's true length).
  std::string craft(const std::string& header, size_t data_bytes, uint64_t header_len = UINT64_MAX) {
    const std::string p = path("crafted.safetensors");
    const uint64_t n = header_len == UINT64_MAX ? header.size() : header_len;
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
    out << header << std::string(data_bytes, '\x01');
    return p;
  }

  // The error opening `p` raises (empty when it opens).
  static std::string open_error(const std::string& p) {
    return test::error_message([&] { SafetensorsFile f(p); });
  }

  test::ScratchDir dir_{testing::UnitTest::GetInstance()->current_test_info()->name()};
};

std::vector<float> ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.37f * static_cast<float>(i) + 0.1f);
  return v;
}

TEST_F(SafetensorsTest, RoundTripF32IsBitwise) {
  std::vector<float> a = ramp(6, 3.0f);
  a[1] = std::numeric_limits<float>::infinity();
  a[2] = std::numeric_limits<float>::denorm_min();
  a[3] = -0.0f;
  const std::vector<float> b = ramp(5, 1e-3f), scalar = {42.5f};
  const std::vector<std::vector<float>> values = {a, b, {}, scalar};
  const std::vector<SafetensorsEntry> entries = {{"a", {2, 3}}, {"layer.b", {5}}, {"empty", {0, 4}}, {"s", {}}};
  write_safetensors(path("m.safetensors"), entries, DType::F32, [&](size_t i) { return values[i]; },
                    {{"format", "pt"}});

  const SafetensorsFile f(path("m.safetensors"));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  ASSERT_EQ(f.tensors().size(), entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const SafetensorsTensor& t = f.tensor(entries[i].name);
    EXPECT_EQ(t.shape, entries[i].shape);
    EXPECT_EQ(t.dtype, SafetensorsDType::F32);
    const std::vector<float> got = f.read_f32(entries[i].name);
    ASSERT_EQ(got.size(), values[i].size());
    EXPECT_TRUE(test::same_bits(got, values[i])) << entries[i].name;
  }
  // The header is padded so that the data section starts 8-byte aligned.
  std::ifstream in(path("m.safetensors"), std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_FALSE(fs::exists(path("m.safetensors.tmp." + std::to_string(::getpid()))));
}

TEST_F(SafetensorsTest, RoundTripBf16RoundsToNearestEven) {
  std::vector<float> v = ramp(64, 7.0f);
  v[0] = std::nanf("");
  v[1] = 1.0f + 0x1.0p-8f;  // halfway between two bf16 values: ties to even (1.0)
  write_safetensors(path("m.safetensors"), {{"w", {8, 8}}}, DType::BF16, [&](size_t) { return v; });
  const SafetensorsFile f(path("m.safetensors"));
  EXPECT_EQ(f.tensor("w").dtype, SafetensorsDType::BF16);
  const std::vector<float> got = f.read_f32("w");
  EXPECT_TRUE(std::isnan(got[0]));
  EXPECT_EQ(got[1], 1.0f);
  for (size_t i = 1; i < v.size(); ++i) EXPECT_EQ(got[i], bf16_to_f32(f32_to_bf16(v[i]))) << i;
  EXPECT_TRUE(f.metadata().empty());
}

TEST_F(SafetensorsTest, FailedWriteLeavesNoFile) {
  const std::string msg = test::error_message([&] {
    write_safetensors(path("m.safetensors"), {{"a", {2}}, {"b", {3}}}, DType::F32, [&](size_t i) {
      return std::vector<float>(i == 0 ? 2 : 4, 1.0f);  // b has one value too many
    });
  });
  EXPECT_NE(msg.find("tensor 'b' has 4 values; its shape needs 3"), std::string::npos) << msg;
  EXPECT_TRUE(fs::is_empty(dir_.path())) << "neither the file nor its temporary may remain";
}

TEST_F(SafetensorsTest, ReadsF16AndRefusesUnknownNames) {
  // 1.0, -2.0, 65504 (max), 2^-24 (smallest subnormal) as F16.
  const uint16_t h[] = {0x3c00, 0xc000, 0x7bff, 0x0001};
  const std::string p = craft(R"({"h":{"dtype":"F16","shape":[4],"data_offsets":[0,8]}})", 0);
  std::ofstream(p, std::ios::binary | std::ios::app).write(reinterpret_cast<const char*>(h), sizeof(h));
  const SafetensorsFile f(p);
  EXPECT_EQ(f.read_f32("h"), (std::vector<float>{1.0f, -2.0f, 65504.0f, 0x1.0p-24f}));
  const std::string msg = test::error_message([&] { f.read_f32("missing"); });
  EXPECT_NE(msg.find("'" + p + "' has no tensor 'missing'"), std::string::npos) << msg;
}

// U8 (MXFP4 blocks and scales) is read as bytes; neither reader takes the other's dtype.
TEST_F(SafetensorsTest, ReadsU8AsBytesOnly) {
  const uint8_t b[] = {0, 17, 255};
  const std::string p = craft(R"({"b":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},)"
                              R"("h":{"dtype":"F16","shape":[1],"data_offsets":[3,5]}})",
                              0);
  const uint16_t h = 0x3c00;
  std::ofstream(p, std::ios::binary | std::ios::app)
      .write(reinterpret_cast<const char*>(b), sizeof(b))
      .write(reinterpret_cast<const char*>(&h), sizeof(h));
  const SafetensorsFile f(p);
  EXPECT_EQ(f.read_u8("b"), (std::vector<uint8_t>{0, 17, 255}));
  std::string msg = test::error_message([&] { f.read_f32("b"); });
  EXPECT_NE(msg.find("tensor 'b' holds U8 bytes, not floating-point values"), std::string::npos) << msg;
  msg = test::error_message([&] { f.read_u8("h"); });
  EXPECT_NE(msg.find("tensor 'h' is F16; U8 expected"), std::string::npos) << msg;
}

TEST(Fp16, ConversionTable) {
  const struct {
    uint16_t h;
    float f;
  } table[] = {{0x0000, 0.0f},        {0x3c00, 1.0f},       {0xc000, -2.0f},        {0x3555, 0x1.554p-2f},
               {0x7bff, 65504.0f},    {0x0400, 0x1.0p-14f}, {0x03ff, 0x1.ff8p-15f}, {0x0001, 0x1.0p-24f},
               {0x8001, -0x1.0p-24f}, {0x0200, 0x1.0p-15f}, {0x7c00, INFINITY},     {0xfc00, -INFINITY}};
  for (const auto& e : table) EXPECT_EQ(f16_to_f32(e.h), e.f) << std::hex << e.h;
  EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)) && f16_to_f32(0x8000) == 0.0f);
  for (uint16_t nan : {uint16_t{0x7e00}, uint16_t{0x7c01}, uint16_t{0xfe00}}) EXPECT_TRUE(std::isnan(f16_to_f32(nan)));
}

TEST(Fp16, EveryFiniteValueIsExact) {
  // (-1)^s x m x 2^(e-25) with the implicit bit for e > 0, m x 2^-24 for subnormals: in double.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0x1f) continue;
    const double mag = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
    const double want = (h & 0x8000) ? -mag : mag;
    ASSERT_EQ(static_cast<double>(f16_to_f32(static_cast<uint16_t>(h))), want) << std::hex << h;
  }
}

// Each rule with a file that breaks only it: the error names the file and what is wrong.
TEST_F(SafetensorsTest, RefusesEveryMalformedHeader) {
  const std::string ok_a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const struct {
    const char* what;
    std::string header;
    size_t data;
    std::string expect;
  } cases[] = {
      {"not JSON", R"({"a":)", 0, "the header is not valid JSON"},
      {"not an object", "[1, 2]", 0, "the header must be a JSON object"},
      {"duplicate tensor", "{" + ok_a + "," + ok_a + "}", 8, "the header: duplicate key 'a'"},
      {"nested 100,000 deep", R"({"a":)" + std::string(100000, '[') + std::string(100000, ']') + "}", 0,
       "the header is nested deeper than 64 levels"},
      {"unknown dtype", R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8,
       "tensor 'a' has dtype I64; so_train reads F32, BF16, F16 and U8"},
      {"negative dimension", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8,
       "tensor 'a': every shape dimension must be a non-negative integer, is -2"},
      {"fractional dimension", R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8,
       "every shape dimension must be a non-negative integer"},
      {"element count overflow", R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8,
       "tensor 'a': shape [4294967296, 4294967296] has more elements than fit 63 bits"},
      {"byte count overflow", R"({"a":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,8]}})", 8,
       "tensor 'a': shape [4611686018427387904] overflows the byte count"},
      {"offsets past the end", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 8,
       "tensor 'a': data_offsets [8, 16] lie outside the 8-byte data section"},
      {"huge offsets", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[18446744073709551608,0]}})", 8,
       "lie outside the 8-byte data section"},
      {"size mismatch", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4,
       "tensor 'a': data_offsets [0, 4] hold 4 bytes but shape [2] of F32 needs 8"},
      {"overlap", "{" + ok_a + R"(,"b":{"dtype":"BF16","shape":[4],"data_offsets":[4,12]}})", 12,
       "tensor 'b' (bytes [4, 12)) overlaps tensor 'a' (bytes [0, 8))"},
      {"gap", "{" + ok_a + R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})", 16,
       "bytes [8, 12) of the data section belong to no tensor (before tensor 'b')"},
      {"trailing bytes", "{" + ok_a + "}", 12, "the data section has 12 bytes but its tensors end at byte 8"},
      {"missing offsets", R"({"a":{"dtype":"F32","shape":[2]}})", 8, "tensor 'a' needs dtype, shape and data_offsets"},
      {"unknown key", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"offset":0}})", 8,
       "tensor 'a' has the unknown key 'offset'"},
      {"offsets not a pair", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8,
       "tensor 'a': data_offsets must be [begin, end]"},
      {"metadata not strings", R"({"__metadata__":{"format":1}})", 0, "metadata 'format' must be a string, is 1"},
  };
  for (const auto& c : cases) {
    const std::string p = craft(c.header, c.data);
    const std::string msg = open_error(p);
    EXPECT_NE(msg.find("safetensors file '" + p + "'"), std::string::npos) << c.what << ": " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.what << ": " << msg;
  }
}

TEST_F(SafetensorsTest, RefusesBadLengthsAndTruncation) {
  const std::string tiny = path("tiny.safetensors");
  std::ofstream(tiny) << "abc";
  EXPECT_NE(open_error(tiny).find("is 3 bytes, shorter than the 8-byte header length"), std::string::npos);

  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_NE(open_error(craft(header, 8, 1000)).find("header length 1000 runs past the end of the"), std::string::npos);
  EXPECT_NE(open_error(craft(header, 8, UINT64_MAX - 1)).find("runs past the end"), std::string::npos);

  // A sparse file larger than the header limit: the length is refused before anything is parsed.
  const std::string big = craft(header, 8, 150'000'000);
  fs::resize_file(big, 200'000'000);
  EXPECT_NE(open_error(big).find("header length 150000000 exceeds the limit of 100000000 bytes"), std::string::npos);

  // A valid file cut short: the last tensor now ends past the data section.
  write_safetensors(path("cut.safetensors"), {{"x", {4}}, {"y", {4}}}, DType::F32,
                    [](size_t) { return std::vector<float>(4, 2.0f); });
  EXPECT_EQ(open_error(path("cut.safetensors")), "");
  fs::resize_file(path("cut.safetensors"), fs::file_size(path("cut.safetensors")) - 3);
  const std::string msg = open_error(path("cut.safetensors"));
  EXPECT_NE(msg.find("tensor 'y': data_offsets [16, 32] lie outside the 29-byte data section (truncated"),
            std::string::npos)
      << msg;
  EXPECT_NE(open_error(path("absent.safetensors")).find("cannot open"), std::string::npos);
}

}  // namespace
}  // namespace so
