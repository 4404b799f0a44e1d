// The data layer's readers and samplers: Megatron-LM indexed datasets against the documents their
// writer (make_megatron_fixture.py) put in, windows that restart positions at documents, blends,
// damaged index files; the loss scales of a step.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "so/core/error.h"
#include "so/data/batch_sampler.h"
#include "so/data/megatron_dataset.h"
#include "so/data/token_source.h"
#include "so/io/hdf5_file.h"
#include "so/train/loss_normalization.h"
#include "tests/test_util.h"

namespace so {
namespace {

const std::string kDir = "tests/data/fixtures/";

nlohmann::json documents() {
  std::ifstream in(kDir + "megatron_documents.json");
  return nlohmann::json::parse(in);
}

TEST(MegatronDataset, ReadsBackTheDocumentsItsWriterWrote) {
  const nlohmann::json docs = documents();
  for (const char* name : {"megatron_u16", "megatron_i32_sentences"}) {
    SCOPED_TRACE(name);
    const MegatronIndexedDataset ds(kDir + name);
    const auto& want = docs[name];
    ASSERT_EQ(ds.documents(), static_cast<int64_t>(want.size()));
    const std::vector<int64_t>& at = *ds.document_offsets();
    for (size_t d = 0; d < want.size(); ++d) {
      const int64_t end = d + 1 < want.size() ? at[d + 1] : ds.size();
      std::vector<int32_t> got(static_cast<size_t>(end - at[d]));
      ds.read(at[d], end - at[d], got.data());
      EXPECT_EQ(got, want[d].get<std::vector<int32_t>>()) << "document " << d;
    }
  }
}

TEST(MegatronDataset, WindowsRestartPositionsAtDocuments) {
  const nlohmann::json docs = documents();
  const MegatronIndexedDataset ds(kDir + "megatron_u16");
  std::set<int32_t> firsts;
  for (const auto& d : docs["megatron_u16"]) firsts.insert(d[0].get<int32_t>());
  const int64_t S = 64, B = 4;
  const BatchSampler sampler(ds, S, B, 65536, 5);
  int boundaries = 0;
  for (int64_t first = 0; first < 40; first += B) {
    const TokenBatch b = sampler.batch_at(first);
    ASSERT_EQ(b.doc_start.size(), b.inputs.size());
    for (int64_t r = 0; r < B; ++r)
      for (int64_t t = 0; t < S; ++t) {
        const size_t i = static_cast<size_t>(r * S + t);
        EXPECT_EQ(b.positions[i], t - b.doc_start[i]);
        EXPECT_TRUE(t == 0 || b.doc_start[i] == b.doc_start[i - 1] || b.doc_start[i] == t);
        if (t > 0 && b.doc_start[i] == t) {
          ++boundaries;
          EXPECT_TRUE(firsts.count(b.inputs[i])) << "a document starts at token " << t << " of row " << r;
        }
        if (t + 1 < S) {
          EXPECT_EQ(b.targets[i], b.inputs[i + 1]);
        }
      }
  }
  EXPECT_GT(boundaries, 10);  // documents of 1..89 tokens: most windows of 64 cross some
}

TEST(MegatronDataset, BlendDrawsEachDatasetByItsWeight) {
  const MegatronIndexedDataset a(kDir + "megatron_u16"), b(kDir + "megatron_i32_sentences");
  std::vector<std::unique_ptr<BatchSampler>> parts;
  parts.push_back(std::make_unique<BatchSampler>(a, 16, 2, 65536, 3));
  parts.push_back(std::make_unique<BatchSampler>(b, 16, 2, 65536, 3));
  const BlendedSampler blend(std::move(parts), {1.0, 3.0}, 2, 16, 3);
  int second = 0;
  const int n = 8000;
  for (int i = 0; i < n; ++i) second += blend.part_of(i) == 1;
  EXPECT_NEAR(second / static_cast<double>(n), 0.75, 0.02);
  const TokenBatch batch = blend.batch_at(0);
  EXPECT_EQ(batch.inputs.size(), 32u);
  EXPECT_EQ(batch.doc_start.size(), 32u);
}

// Weights near the largest double: their sum would overflow to infinity, and every share but the
// last read as 0. [1e308, 1, 1e308, 1]: half each for the big ones, ~1e-308 for the others.
TEST(MegatronDataset, BlendWeightsNearTheLargestDoubleKeepTheirShares) {
  const MegatronIndexedDataset a(kDir + "megatron_u16"), b(kDir + "megatron_i32_sentences");
  std::vector<std::unique_ptr<BatchSampler>> parts;
  for (int k = 0; k < 4; ++k) parts.push_back(std::make_unique<BatchSampler>(k % 2 ? b : a, 16, 2, 65536, 3));
  const BlendedSampler blend(std::move(parts), {1e308, 1.0, 1e308, 1.0}, 2, 16, 3);
  std::vector<int> drawn(4, 0);
  const int n = 8000;
  for (int i = 0; i < n; ++i) ++drawn[blend.part_of(i)];
  EXPECT_NEAR(drawn[0] / static_cast<double>(n), 0.5, 0.02);
  EXPECT_NEAR(drawn[2] / static_cast<double>(n), 0.5, 0.02);
  EXPECT_EQ(drawn[1] + drawn[3], 0);
}

// A copy of the u16 fixture with `edit` applied to its index (or its .bin when `bin`).
std::string damaged(const std::string& tag, bool bin, const std::function<void(std::string&)>& edit) {
  const std::string prefix = (std::filesystem::temp_directory_path() / ("so_megatron_" + tag)).string();
  for (const char* ext : {".bin", ".idx"}) {
    std::ifstream in(kDir + "megatron_u16" + ext, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (bin == (std::string(ext) == ".bin")) edit(bytes);
    std::ofstream(prefix + ext, std::ios::binary) << bytes;
  }
  return prefix;
}

void expect_refused(const std::string& prefix, const std::string& needle) {
  try {
    MegatronIndexedDataset ds(prefix);
    ADD_FAILURE() << prefix << " was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(MegatronDataset, DamagedFilesAreRefusedByName) {
  expect_refused(damaged("truncated", true, [](std::string& b) { b.resize(b.size() - 2); }),
                 "does not belong together");
  expect_refused(damaged("magic", false, [](std::string& b) { b[0] = 'X'; }), "MMIDIDX");
  expect_refused(damaged("version", false, [](std::string& b) { b[9] = 2; }), "version 2");
  expect_refused(damaged("float", false, [](std::string& b) { b[17] = 7; }), "float");
  expect_refused(damaged("count", false, [](std::string& b) { b[25] = 0x7f; }), "truncated or corrupt");
  expect_refused(damaged("short_idx", false, [](std::string& b) { b.resize(b.size() - 8); }), "truncated or corrupt");
}

// A 1-D int32 dataset "tokens" of `values` in a new file, chunked by 1000 with `filters` applied to
// the dataset creation properties; only the first `chunks_written` chunks written (-1: all).
std::string token_file(const std::string& tag, const std::vector<int32_t>& values,
                       const std::function<void(hid_t)>& filters, int chunks_written = -1) {
  const std::string path = (std::filesystem::temp_directory_path() / ("so_h5_" + tag + ".h5")).string();
  const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  const hsize_t n = values.size(), chunk = 1000;
  const hid_t space = H5Screate_simple(1, &n, nullptr);
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 1, &chunk);
  filters(dcpl);
  const hid_t d = H5Dcreate2(f, "tokens", H5T_STD_I32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  EXPECT_GE(d, 0) << tag;
  const hsize_t count = chunks_written < 0 ? n : chunks_written * chunk, start = 0;
  const hid_t mem = H5Screate_simple(1, &count, nullptr);
  H5Sselect_hyperslab(space, H5S_SELECT_SET, &start, nullptr, &count, nullptr);
  EXPECT_GE(H5Dwrite(d, H5T_NATIVE_INT32, mem, space, H5P_DEFAULT, values.data()), 0) << tag;
  H5Sclose(mem), H5Dclose(d), H5Pclose(dcpl), H5Sclose(space), H5Fclose(f);
  return path;
}

// Compressed datasets are read (HDF5 calls a complete one "partly allocated": its chunks are
// smaller than their extent); a filter this HDF5 lacks is named; chunks never written are counted.
TEST(Hdf5Tokens, CompressedDatasetsReadAndMissingFiltersAreNamed) {
  std::vector<int32_t> values(4000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int32_t>((i * 7919) % 300);  // compressible
  std::vector<std::pair<std::string, std::function<void(hid_t)>>> kinds = {
      {"gzip", [](hid_t p) { H5Pset_deflate(p, 6); }},
      {"shuffle_gzip", [](hid_t p) { H5Pset_shuffle(p), H5Pset_deflate(p, 4); }},
      {"fletcher32_gzip", [](hid_t p) { H5Pset_fletcher32(p), H5Pset_deflate(p, 1); }}};
  unsigned szip = 0;
  if (H5Zfilter_avail(H5Z_FILTER_SZIP) > 0 && H5Zget_filter_info(H5Z_FILTER_SZIP, &szip) >= 0 &&
      (szip & H5Z_FILTER_CONFIG_ENCODE_ENABLED))
    kinds.push_back({"szip", [](hid_t p) { H5Pset_szip(p, H5_SZIP_NN_OPTION_MASK, 16); }});
  for (const auto& [name, filters] : kinds) {
    SCOPED_TRACE(name);
    const std::string path = token_file(name, values, filters);
    const std::unique_ptr<TokenSource> tokens = open_hdf5_tokens(path, "tokens");
    std::vector<int32_t> got(values.size());
    tokens->read(0, static_cast<int64_t>(got.size()), got.data());
    EXPECT_EQ(got, values);
    EXPECT_LT(H5File::open_read(path).size(), values.size() * sizeof(int32_t));  // really compressed
  }
  // lzf (h5py's): recorded in the pipeline as optional, so HDF5 writes the chunks, but this HDF5 has no lzf.
  ASSERT_LE(H5Zfilter_avail(32000), 0) << "this HDF5 decodes lzf: the test needs a filter it lacks";
  const std::string lzf =
      token_file("lzf", values, [](hid_t p) { H5Pset_filter(p, 32000, H5Z_FLAG_OPTIONAL, 0, nullptr); });
  std::string msg = test::error_message([&] { open_hdf5_tokens(lzf, "tokens"); });
  EXPECT_NE(msg.find("compressed with the HDF5 filter 'lzf' (id 32000), which this build's HDF5 library cannot decode"),
            std::string::npos)
      << msg;
  msg = test::error_message([&] {
    open_hdf5_tokens(token_file(
                         "gzip_partial", values, [](hid_t p) { H5Pset_deflate(p, 6); }, 1),
                     "tokens");
  });
  EXPECT_NE(msg.find("only partly written (1 of its 4 chunks)"), std::string::npos) << msg;
  msg = test::error_message([&] {
    open_hdf5_tokens(token_file(
                         "gzip_none", values, [](hid_t p) { H5Pset_deflate(p, 6); }, 0),
                     "tokens");
  });
  EXPECT_NE(msg.find("declared but never written"), std::string::npos) << msg;
}

// A stream whose sample i has (i % 3) labels.
class CountingStream final : public SampleStream {
 public:
  TokenBatch batch_at(int64_t) const override { return {}; }
  int64_t supervised_tokens(int64_t first, int64_t count) const override {
    int64_t n = 0;
    for (int64_t i = first; i < first + count; ++i) n += i % 3;
    return n;
  }
  int64_t samples_per_epoch() const override { return 0; }
  std::string describe() const override { return "counting"; }
};

TEST(LossNormalization, StepMeanMicroBatchMeanAndEmptySteps) {
  const CountingStream s;
  // Samples 0..7 (labels 0,1,2,0,1,2,0,1 = 7), 2 micro-batches x 2 ranks x 2 samples; rank 1's
  // micro-batches are samples 2-3 (2 labels) and 6-7 (1 label).
  const std::vector<float> step = micro_batch_loss_scales(s, 0, 2, 2, 2, 1, LossNormalization::Step);
  EXPECT_EQ(step, (std::vector<float>{1.0f / 7, 1.0f / 7}));
  const std::vector<float> micro = micro_batch_loss_scales(s, 0, 2, 2, 2, 1, LossNormalization::MicroBatch);
  EXPECT_EQ(micro, (std::vector<float>{1.0f / 8, 1.0f / 4}));
  // Sample 0 alone (and 3, 6): no label; scale 0, never a division by zero.
  EXPECT_EQ(micro_batch_loss_scales(s, 0, 1, 1, 1, 0, LossNormalization::Step), std::vector<float>{0.0f});
  EXPECT_EQ(micro_batch_loss_scales(s, 3, 1, 1, 1, 0, LossNormalization::MicroBatch), std::vector<float>{0.0f});
}

}  // namespace
}  // namespace so
