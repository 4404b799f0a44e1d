#pragma once
// Where training tokens come from: pre-tokenized files (flat binary with a header, or an HDF5
// dataset), raw UTF-8 text through the byte-level tokenizer, or synthetic tokens.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace so {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual int64_t size() const = 0;  // number of tokens
  virtual void read(int64_t offset, int64_t count, int32_t* out) const = 0;
  virtual std::string describe() const = 0;
  // Token offsets where documents begin (ascending, the first 0), for sources that know them;
  // windows then restart positions there and carry doc_start. nullptr: one undivided stream.
  virtual const std::vector<int64_t>* document_offsets() const { return nullptr; }
};

// Binary token file: 32-byte header, then little-endian tokens.
//   bytes 0-7 "SOTOKENS", u32 version (1), u32 bytes per token (2 or 4), u64 token count,
//   u64 reserved (0).
struct TokenFileFormat {
  static constexpr char kMagic[9] = "SOTOKENS";
  static constexpr uint32_t kVersion = 1;
  static constexpr size_t kHeaderBytes = 32;
};
void write_token_file(const std::string& path, const std::vector<int32_t>& tokens, int bytes_per_token);

std::unique_ptr<TokenSource> open_token_file(const std::string& path);
std::unique_ptr<TokenSource> open_hdf5_tokens(const std::string& path, const std::string& dataset);
// Byte-level tokenizer: token = byte value, vocabulary 256.
std::unique_ptr<TokenSource> open_text_bytes(const std::string& path);
std::unique_ptr<TokenSource> make_synthetic_tokens(int64_t vocab_size, int64_t count, uint64_t seed);

constexpr int64_t kByteVocabSize = 256;

}  // namespace so
