#include "so/data/token_source.h"

#include <cstring>
#include <fstream>

#include "so/core/error.h"
#include "so/core/random.h"
#include "so/io/hdf5_file.h"
#include "so/io/mapped_file.h"

namespace so {

namespace {

void check_range(const TokenSource& s, int64_t offset, int64_t count) {
  SO_CHECK(offset >= 0 && count >= 0 && offset + count <= s.size(), s.describe(), ": read of [", offset, ", ",
           offset + count, ") past its ", s.size(), " tokens");
}

class BinaryTokenFile final : public TokenSource {
 public:
  explicit BinaryTokenFile(const std::string& path) : file_(path) {
    const size_t hb = TokenFileFormat::kHeaderBytes;
    SO_CHECK(file_.size() >= hb, "token file '", path, "' is ", file_.size(), " bytes, shorter than its ", hb,
             "-byte header");
    const uint8_t* h = file_.data();
    SO_CHECK(std::memcmp(h, TokenFileFormat::kMagic, 8) == 0, "token file '", path,
             "' does not start with the SOTOKENS magic (is it a token file?)");
    uint32_t version, bpt;
    uint64_t count;
    std::memcpy(&version, h + 8, 4);
    std::memcpy(&bpt, h + 12, 4);
    std::memcpy(&count, h + 16, 8);
    SO_CHECK(version == TokenFileFormat::kVersion, "token file '", path, "' has format version ", version,
             "; this build reads version ", TokenFileFormat::kVersion);
    SO_CHECK(bpt == 2 || bpt == 4, "token file '", path, "' says ", bpt, " bytes per token; must be 2 or 4");
    // Compared as a token count: count * bpt can wrap around 64 bits for a crafted header.
    const uint64_t fits = (file_.size() - hb) / bpt;
    SO_CHECK(count == fits && (file_.size() - hb) % bpt == 0, "token file '", path, "' header promises ", count,
             " tokens of ", bpt, " bytes but the file has ", file_.size(), " bytes, room for ", fits,
             " after the header (truncated or corrupt)");
    bytes_per_token_ = bpt;
    count_ = static_cast<int64_t>(count);
  }
  int64_t size() const override { return count_; }
  void read(int64_t offset, int64_t count, int32_t* out) const override {
    check_range(*this, offset, count);
    const uint8_t* p = file_.data() + TokenFileFormat::kHeaderBytes + offset * bytes_per_token_;
    for (int64_t i = 0; i < count; ++i) {
      if (bytes_per_token_ == 2) {
        uint16_t v;
        std::memcpy(&v, p + 2 * i, 2);
        out[i] = v;
      } else {
        uint32_t v;
        std::memcpy(&v, p + 4 * i, 4);
        SO_CHECK(v <= 0x7fffffffu, describe(), ": token ", v, " at index ", offset + i, " does not fit int32");
        out[i] = static_cast<int32_t>(v);
      }
    }
  }
  std::string describe() const override { return "token file '" + file_.path() + "'"; }

 private:
  MappedFile file_;
  uint32_t bytes_per_token_ = 2;
  int64_t count_ = 0;
};

class TextBytes final : public TokenSource {
 public:
  explicit TextBytes(const std::string& path) : file_(path) {}
  int64_t size() const override { return static_cast<int64_t>(file_.size()); }
  void read(int64_t offset, int64_t count, int32_t* out) const override {
    check_range(*this, offset, count);
    for (int64_t i = 0; i < count; ++i) out[i] = file_.data()[offset + i];
  }
  std::string describe() const override { return "text file '" + file_.path() + "'"; }

 private:
  MappedFile file_;
};

class Hdf5Tokens final : public TokenSource {
 public:
  Hdf5Tokens(const std::string& path, const std::string& dataset) : file_(H5File::open_read(path)), dataset_(dataset) {
    const auto shape = file_.shape(dataset);
    SO_CHECK(shape.size() == 1, "HDF5 token dataset '", dataset, "' in '", path, "' must be 1-D, has rank ",
             shape.size());
    const std::string type = file_.type_description(dataset);
    SO_CHECK(file_.is_integer(dataset), "HDF5 token dataset '", dataset, "' in '", path, "' holds ", type,
             "; token ids must be integers (a float dataset would be truncated)");
    file_.check_stored(dataset);
    count_ = shape[0];
  }
  int64_t size() const override { return count_; }
  void read(int64_t offset, int64_t count, int32_t* out) const override {
    check_range(*this, offset, count);
    file_.read_i32_range(dataset_, offset, count, out);
  }
  std::string describe() const override { return "HDF5 dataset '" + dataset_ + "' in '" + file_.path() + "'"; }

 private:
  H5File file_;
  std::string dataset_;
  int64_t count_ = 0;
};

class SyntheticTokens final : public TokenSource {
 public:
  SyntheticTokens(int64_t vocab, int64_t count, uint64_t seed) : vocab_(vocab), count_(count), seed_(seed) {
    SO_CHECK(vocab > 0 && count > 0, "synthetic data needs a positive vocabulary and size");
  }
  int64_t size() const override { return count_; }
  void read(int64_t offset, int64_t count, int32_t* out) const override {
    check_range(*this, offset, count);
    for (int64_t i = 0; i < count; ++i)
      out[i] = static_cast<int32_t>(random_u64(seed_, 0x70c5, static_cast<uint64_t>(offset + i)) % vocab_);
  }
  std::string describe() const override { return "synthetic tokens"; }

 private:
  int64_t vocab_, count_;
  uint64_t seed_;
};

}  // namespace

void write_token_file(const std::string& path, const std::vector<int32_t>& tokens, int bytes_per_token) {
  SO_CHECK(bytes_per_token == 2 || bytes_per_token == 4, "bytes per token must be 2 or 4");
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  SO_CHECK(out.good(), "cannot create token file '", path, "'");
  char header[TokenFileFormat::kHeaderBytes] = {};
  std::memcpy(header, TokenFileFormat::kMagic, 8);
  const uint32_t version = TokenFileFormat::kVersion, bpt = static_cast<uint32_t>(bytes_per_token);
  const uint64_t count = tokens.size();
  std::memcpy(header + 8, &version, 4);
  std::memcpy(header + 12, &bpt, 4);
  std::memcpy(header + 16, &count, 8);
  out.write(header, sizeof(header));
  for (int32_t t : tokens) {
    SO_CHECK(t >= 0 && (bytes_per_token == 4 || t < 65536), "token ", t, " does not fit ", bytes_per_token, " bytes");
    const uint32_t v = static_cast<uint32_t>(t);
    out.write(reinterpret_cast<const char*>(&v), bytes_per_token);  // little-endian hosts only
  }
  SO_CHECK(out.good(), "writing token file '", path, "' failed");
}

std::unique_ptr<TokenSource> open_token_file(const std::string& path) {
  return std::make_unique<BinaryTokenFile>(path);
}
std::unique_ptr<TokenSource> open_hdf5_tokens(const std::string& path, const std::string& dataset) {
  return std::make_unique<Hdf5Tokens>(path, dataset);
}
std::unique_ptr<TokenSource> open_text_bytes(const std::string& path) { return std::make_unique<TextBytes>(path); }
std::unique_ptr<TokenSource> make_synthetic_tokens(int64_t vocab_size, int64_t count, uint64_t seed) {
  return std::make_unique<SyntheticTokens>(vocab_size, count, seed);
}

}  // namespace so
