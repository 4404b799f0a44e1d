#pragma once
// The HDF5 file scripts/prepare_data.py writes (layout: docs/finetuning.md): per split
// ("train", "validation") rows of equal length holding whole documents, a loss mask (1 = the
// token is a label) and the documents' lengths; the tokenizer's identity in the root attributes.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "so/io/hdf5_file.h"
#include "so/data/token_batch.h"

namespace so {

struct TokenizerIdentity {
  int64_t vocab_size = 0;
  uint32_t tokenizer_crc32c = 0;  // of tokenizer.json's bytes
  std::string tokenizer_sha256, model_dir;
};

class PreparedSplit {
 public:
  // Reads the split's shape and document table; refuses a file that is not one prepare_data wrote,
  // data that was declared but never written, declared sizes that disagree or that reading would
  // not fit in memory, a document table that does not tile the rows, and token ids outside the
  // tokenizer's vocabulary.
  PreparedSplit(const std::string& path, const std::string& split);
  int64_t rows() const { return rows_; }
  int64_t row_length() const { return row_length_; }
  const TokenizerIdentity& tokenizer() const { return tokenizer_; }
  std::string describe() const;

  // Row `row` as one sequence of the batch at offset `at` (a multiple of row_length): inputs =
  // the tokens; target t = token t+1 where it is supervised and in the same document, else -1;
  // positions restart at 0 and doc_start names each document's first token; padding_start of
  // sequence at / row_length is where the row's padding begins.
  void read_row(int64_t row, TokenBatch& batch, int64_t at) const;
  // Labels in the row (targets >= 0 as read_row makes them).
  int64_t supervised(int64_t row) const { return supervised_[row]; }

 private:
  // The datasets' declared extents against each other (per-row tables of the rows' count, between
  // one document per row and one per token) and what reading them would allocate against this
  // machine's memory, before anything is allocated.
  void check_declared_sizes(const std::string& path) const;
  H5File file_;
  std::string split_;
  int64_t rows_ = 0, row_length_ = 0;
  TokenizerIdentity tokenizer_;
  std::vector<int64_t> first_document_;  // per row, index of its first document (rows + 1)
  std::vector<int32_t> document_lengths_;
  std::vector<int32_t> padding_start_;  // per row
  std::vector<int64_t> supervised_;
};

// Whether `path` is a prepare_data file (its root attribute "format"), and its rows' length.
bool is_prepared_file(const std::string& path);
int64_t prepared_row_length(const std::string& path);
// The model's vocabulary must hold the tokenizer's; a model directory with a tokenizer.json other
// than the one the data was made with is refused, naming both.
void check_tokenizer_matches(const TokenizerIdentity& data, const std::string& data_path, int64_t model_vocab,
                             const std::string& model_dir);

}  // namespace so
