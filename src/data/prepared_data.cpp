#include "so/data/prepared_data.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "so/core/error.h"
#include "so/io/crc32c.h"

namespace so {

namespace {

// 2: /{split}/padding_start (version 1 files cannot say where an example-compatible row's padding
// begins, which attention must hide).
constexpr int64_t kFormatVersion = 2;

std::string attr_or_empty(const H5File& f, const std::string& name) {
  return f.has_attr("/", name) ? f.read_string_attr("/", name) : std::string();
}

// Token ids outside the vocabulary: how many, the first few distinct ones and where each was first.
struct OutOfVocabulary {
  int64_t count = 0;
  std::vector<std::string> examples;
  std::vector<int32_t> seen;
  void add(int32_t id, int64_t row, int64_t position) {
    ++count;
    if (seen.size() >= 5 || std::find(seen.begin(), seen.end(), id) != seen.end()) return;
    seen.push_back(id);
    examples.push_back(str_cat(id, " (row ", row, ", position ", position, ")"));
  }
  std::string describe() const {
    std::string s;
    for (const std::string& e : examples) s += (s.empty() ? "" : ", ") + e;
    return s + (seen.size() >= 5 ? ", ..." : "");
  }
};

}  // namespace

bool is_prepared_file(const std::string& path) {
  const H5File f = H5File::open_read(path);
  return f.has_attr("/", "format") && f.read_string_attr("/", "format") == "so_train prepared data";
}

int64_t prepared_row_length(const std::string& path) {
  const H5File f = H5File::open_read(path);
  const std::vector<int64_t> shape = f.shape("train/tokens");
  SO_CHECK(shape.size() == 2 && shape[1] >= 2 && shape[1] <= INT32_MAX, path,
           ": dataset 'train/tokens' must be [rows, row length in 2..", INT32_MAX, "]");
  return shape[1];
}

PreparedSplit::PreparedSplit(const std::string& path, const std::string& split)
    : file_(H5File::open_read(path)), split_(split) {
  SO_CHECK(is_prepared_file(path), path,
           " is not a file scripts/prepare_data.py wrote (its root attribute 'format' is not "
           "'so_train prepared data')");
  const int64_t version = file_.read_int_attr("/", "format_version");
  SO_CHECK(version == kFormatVersion, path, " has prepared-data format version ", version, "; this build reads ",
           kFormatVersion, ": prepare it again with this version's scripts/prepare_data.py");
  SO_CHECK(file_.exists(split), path, " has no '", split, "' split");
  const std::string tokens = split + "/tokens", mask = split + "/loss_mask";
  const std::vector<int64_t> shape = file_.shape(tokens);
  SO_CHECK(shape.size() == 2 && shape[0] >= 1 && shape[1] >= 2, path, ": dataset '", tokens,
           "' must be [rows >= 1, row length >= 2]");
  SO_CHECK(file_.shape(mask) == shape, path, ": dataset '", mask, "' must have the shape of '", tokens, "'");
  for (const std::string& d :
       {tokens, mask, split + "/row_documents", split + "/document_lengths", split + "/padding_start"}) {
    SO_CHECK(file_.is_integer(d), path, ": dataset '", d, "' holds ", file_.type_description(d), ", not integers");
    file_.check_stored(d);
  }
  rows_ = shape[0];
  row_length_ = shape[1];
  check_declared_sizes(path);
  tokenizer_.vocab_size = file_.read_int_attr("/", "vocab_size");
  tokenizer_.tokenizer_crc32c = static_cast<uint32_t>(file_.read_int_attr("/", "tokenizer_crc32c"));
  tokenizer_.tokenizer_sha256 = attr_or_empty(file_, "tokenizer_sha256");
  tokenizer_.model_dir = attr_or_empty(file_, "model_dir");

  const std::vector<int32_t> counts = file_.read_i32(split + "/row_documents", {rows_});
  padding_start_ = file_.read_i32(split + "/padding_start", {rows_});
  const std::vector<int64_t> n_docs = file_.shape(split + "/document_lengths");
  document_lengths_ = file_.read_i32(split + "/document_lengths", n_docs);
  first_document_.assign(rows_ + 1, 0);
  for (int64_t r = 0; r < rows_; ++r) {
    SO_CHECK(counts[r] >= 1, path, ": row ", r, " of '", split, "' has ", counts[r], " documents");
    first_document_[r + 1] = first_document_[r] + counts[r];
    SO_CHECK(first_document_[r + 1] <= n_docs[0], path, ": '", split, "/row_documents' counts more documents than the ",
             n_docs[0], " of '", split, "/document_lengths'");
    int64_t used = 0;
    for (int64_t d = first_document_[r]; d < first_document_[r + 1]; ++d) {
      SO_CHECK(document_lengths_[d] >= 1, path, ": document ", d, " of '", split, "' has length ",
               document_lengths_[d]);
      used += document_lengths_[d];
    }
    SO_CHECK(used <= row_length_, path, ": row ", r, " of '", split, "' holds documents of ", used,
             " tokens in a row of ", row_length_);
    // The padding follows the documents, or ends the last one (the example-compatible rows, whose
    // padding is part of their one supervised document).
    const int64_t before_last = used - document_lengths_[first_document_[r + 1] - 1];
    SO_CHECK(padding_start_[r] > before_last && padding_start_[r] <= used, path, ": row ", r, " of '", split,
             "' has padding_start ", padding_start_[r], "; its documents end at ", used,
             " and the padding may begin only within the last one, after ", before_last);
  }
  SO_CHECK(first_document_[rows_] == n_docs[0], path, ": '", split, "/row_documents' counts ", first_document_[rows_],
           " documents, '", split, "/document_lengths' has ", n_docs[0]);

  // Labels per row, counted once (the loss of a step is normalised by them before its
  // micro-batches are read); every mask value and every token id is checked on the way, so a split
  // that would fail when it is read (at an evaluation after the last step) fails now.
  SO_CHECK(tokenizer_.vocab_size >= 1, path, ": root attribute 'vocab_size' is ", tokenizer_.vocab_size);
  supervised_.assign(rows_, 0);
  OutOfVocabulary outside;
  TokenBatch b;
  for (int64_t r = 0; r < rows_; ++r) {
    read_row(r, b, 0);
    supervised_[r] = std::count_if(b.targets.begin(), b.targets.end(), [](int32_t t) { return t >= 0; });
    for (int64_t t = 0; t < row_length_; ++t)
      if (b.inputs[t] < 0 || b.inputs[t] >= tokenizer_.vocab_size) outside.add(b.inputs[t], r, t);
  }
  SO_CHECK(outside.count == 0, describe(), ": ", outside.count,
           " token ids lie outside the tokenizer's vocabulary [0, ", tokenizer_.vocab_size, "): ", outside.describe());
  SO_CHECK(std::any_of(supervised_.begin(), supervised_.end(), [](int64_t n) { return n > 0; }), describe(),
           ": no row has a supervised token (every loss_mask is 0, or only on documents' first tokens): nothing to "
           "train on");
}

void PreparedSplit::check_declared_sizes(const std::string& path) const {
  const std::string& split = split_;
  // Positions and offsets within a row are 32-bit.
  SO_CHECK(row_length_ <= INT32_MAX, path, ": dataset '", split, "/tokens' declares rows of ", row_length_,
           " tokens; a row (one sample, data.seq_len) holds at most ", INT32_MAX);
  for (const char* per_row : {"/row_documents", "/padding_start"})
    SO_CHECK(file_.shape(split + per_row) == std::vector<int64_t>{rows_}, path, ": dataset '", split, per_row,
             "' must be [", rows_, "], one per row of '", split, "/tokens'");
  const std::vector<int64_t> n_docs = file_.shape(split + "/document_lengths");
  SO_CHECK(n_docs.size() == 1, path, ": dataset '", split, "/document_lengths' must be 1-D");
  // Every row holds at least one document of at least one token.
  int64_t cells = 0;
  SO_CHECK(!__builtin_mul_overflow(rows_, row_length_, &cells), path, ": '", split, "/tokens' declares ", rows_,
           " rows of ", row_length_, " tokens, more than 2^63 tokens");
  SO_CHECK(n_docs[0] >= rows_ && n_docs[0] <= cells, path, ": '", split, "/document_lengths' declares ", n_docs[0],
           " documents; ", rows_, " rows of ", row_length_, " tokens hold between ", rows_, " and ", cells);
  // What reading the split holds in memory: per row its document count, first document, padding
  // start and labels; per document its length; one row's buffers. Declared sizes the file cannot
  // back (a sparse file, a crafted header) would otherwise end in an allocation failure.
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  const double memory = pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
  const double needed = 24.0 * static_cast<double>(rows_) + 4.0 * static_cast<double>(n_docs[0]) +
                        24.0 * static_cast<double>(row_length_);
  SO_CHECK(memory == 0.0 || needed <= memory / 2, path, ": split '", split, "' declares ", rows_, " rows of ",
           row_length_, " tokens and ", n_docs[0], " documents; reading it needs ", needed / (1 << 30),
           " GiB of tables, more than half this machine's ", memory / (1 << 30), " GiB");
}

std::string PreparedSplit::describe() const {
  return str_cat("prepared data '", file_.path(), "' split '", split_, "' (", rows_, " rows of ", row_length_, ")");
}

void PreparedSplit::read_row(int64_t row, TokenBatch& b, int64_t at) const {
  SO_CHECK(row >= 0 && row < rows_, describe(), ": row ", row, " does not exist");
  const int64_t L = row_length_;
  for (std::vector<int32_t>* v : {&b.inputs, &b.targets, &b.positions, &b.doc_start})
    if (static_cast<int64_t>(v->size()) < at + L) v->resize(at + L);
  std::vector<int32_t> mask(L);
  file_.read_i32_rows(split_ + "/tokens", row, 1, b.inputs.data() + at);
  file_.read_i32_rows(split_ + "/loss_mask", row, 1, mask.data());
  // Documents in order, then the padding after them as one more span (attending only to itself).
  int64_t start = 0;
  for (int64_t d = first_document_[row]; d <= first_document_[row + 1] && start < L; ++d) {
    const int64_t end = d < first_document_[row + 1] ? start + document_lengths_[d] : L;
    const bool padding = d == first_document_[row + 1];
    for (int64_t t = start; t < end; ++t) {
      SO_CHECK(mask[t] == 0 || mask[t] == 1, describe(), ": loss_mask of row ", row, " at ", t, " is ", mask[t],
               "; it must be 0 or 1");
      b.positions[at + t] = static_cast<int32_t>(t - start);
      b.doc_start[at + t] = static_cast<int32_t>(start);
      const bool label = !padding && t + 1 < end && mask[t + 1] == 1;
      b.targets[at + t] = label ? b.inputs[at + t + 1] : -1;
    }
    start = end;
  }
  if (static_cast<int64_t>(b.padding_start.size()) <= at / L) b.padding_start.resize(at / L + 1);
  b.padding_start[at / L] = padding_start_[row];
}

void check_tokenizer_matches(const TokenizerIdentity& data, const std::string& data_path, int64_t model_vocab,
                             const std::string& model_dir) {
  SO_CHECK(data.vocab_size <= model_vocab, data_path, " was made with a tokenizer of ", data.vocab_size, " tokens (",
           data.model_dir, "), more than the model's vocab_size ", model_vocab,
           ": its token ids would index past the embedding");
  if (model_dir.empty()) return;
  const std::string tj = (std::filesystem::path(model_dir) / "tokenizer.json").string();
  if (!std::filesystem::exists(tj)) return;
  std::ifstream in(tj, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  SO_CHECK(crc32c(bytes.data(), bytes.size()) == data.tokenizer_crc32c, data_path, " was made with the tokenizer of ",
           data.model_dir, " (tokenizer.json sha256 ", data.tokenizer_sha256, "), not the one in ", model_dir,
           ": the token ids would mean other words to this model; prepare the data again with --model-dir ", model_dir);
}

}  // namespace so
