#pragma once
// Megatron-LM indexed datasets (PREFIX.bin + PREFIX.idx, the format of megatron/core/datasets/
// indexed_dataset.py), read in place through memory maps, as one token stream with its document
// boundaries.
//   .idx: "MMIDIDX\0\0", u64 version (1), u8 dtype code (1 uint8, 2 int8, 3 int16, 4 int32,
//         5 int64, 6 float64, 7 float32, 8 uint16), u64 sequence count S, u64 document-index count
//         D, int32 sequence lengths [S], int64 byte offsets of the sequences in .bin [S], int64
//         document indices [D] (0, then the sequence index that ends each document; the last = S).
//   .bin: the sequences' tokens back to back.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "so/data/token_source.h"
#include "so/io/mapped_file.h"

namespace so {

class MegatronIndexedDataset final : public TokenSource {
 public:
  // `prefix` names PREFIX.bin and PREFIX.idx. Everything the index claims is checked against the
  // files' sizes before a token is read.
  explicit MegatronIndexedDataset(const std::string& prefix);
  int64_t size() const override { return tokens_; }
  void read(int64_t offset, int64_t count, int32_t* out) const override;
  std::string describe() const override { return "Megatron indexed dataset '" + prefix_ + "'"; }
  // Token offsets of the documents' first tokens (ascending, from 0).
  const std::vector<int64_t>* document_offsets() const override { return &doc_offsets_; }
  int64_t documents() const { return static_cast<int64_t>(doc_offsets_.size()); }

 private:
  std::string prefix_;
  MappedFile bin_, idx_;
  int dtype_code_ = 0, dtype_bytes_ = 0;
  int64_t tokens_ = 0;
  std::vector<int64_t> doc_offsets_;
};

}  // namespace so
