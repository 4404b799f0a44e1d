#include "so/train/training_data.h"

#include <cmath>

#include "so/core/error.h"
#include "so/data/batch_sampler.h"
#include "so/data/epoch_sampler.h"
#include "so/data/megatron_dataset.h"

namespace so {

namespace {

TrainingData open_streams(const RunConfig& cfg, int64_t micro_batch) {
  const DataConfig& d = cfg.data;
  const int64_t vocab = cfg.model.vocab_size;
  TrainingData out;
  if (d.type == "prepared") {
    out.train_rows = std::make_unique<PreparedSplit>(d.path, "train");
    check_tokenizer_matches(out.train_rows->tokenizer(), d.path, vocab, cfg.init_hf_dir);
    SO_CHECK(out.train_rows->row_length() == d.seq_len, d.path, " holds rows of ", out.train_rows->row_length(),
             " tokens but data.seq_len is ", d.seq_len, " (leave data.seq_len out to take the file's)");
    out.train = std::make_unique<EpochSampler>(*out.train_rows, micro_batch, vocab, d.seed);
    out.tokens_count = out.train_rows->rows() * out.train_rows->row_length();
    // Every split is read in full now (masks, document tables, token ids against the vocabulary)
    // and must have the train split's rows: nothing is found only at an evaluation.
    if (H5File::open_read(d.path).exists("validation")) {
      out.validation_rows = std::make_unique<PreparedSplit>(d.path, "validation");
      SO_CHECK(out.validation_rows->row_length() == out.train_rows->row_length(), d.path,
               ": split 'validation' holds rows of ", out.validation_rows->row_length(),
               " tokens and split 'train' rows of ", out.train_rows->row_length(),
               ": every split is read as data.seq_len-token sequences; prepare both with the same --max-length");
      out.validation = std::make_unique<EpochSampler>(*out.validation_rows, micro_batch, vocab, d.seed);
    }
    return out;
  }
  if (d.type == "megatron") {
    std::vector<std::unique_ptr<BatchSampler>> parts;
    std::vector<double> weights;
    for (const auto& [weight, prefix] : d.blend) {
      out.tokens.push_back(std::make_unique<MegatronIndexedDataset>(prefix));
      parts.push_back(std::make_unique<BatchSampler>(*out.tokens.back(), d.seq_len, micro_batch, vocab, d.seed));
      weights.push_back(weight);
      out.tokens_count += out.tokens.back()->size();
    }
    if (parts.size() == 1)
      out.train = std::move(parts.front());
    else
      out.train = std::make_unique<BlendedSampler>(std::move(parts), weights, micro_batch, d.seq_len, d.seed);
    return out;
  }
  if (d.type == "text")
    out.tokens.push_back(open_text_bytes(d.path));
  else if (d.type == "tokens")
    out.tokens.push_back(open_token_file(d.path));
  else if (d.type == "hdf5")
    out.tokens.push_back(open_hdf5_tokens(d.path, d.dataset));
  else
    out.tokens.push_back(make_synthetic_tokens(vocab, d.synthetic_tokens, d.seed));
  out.train = std::make_unique<BatchSampler>(*out.tokens.front(), d.seq_len, micro_batch, vocab, d.seed);
  out.tokens_count = out.tokens.front()->size();
  return out;
}

}  // namespace

TrainingData open_training_data(const RunConfig& cfg, int64_t micro_batch) {
  TrainingData out = open_streams(cfg, micro_batch);
  SO_CHECK(
      cfg.eval_every == 0 || out.validation, "train.eval_every is ", cfg.eval_every, " but ", out.train->describe(),
      " has no validation split to evaluate on (scripts/prepare_data.py --validation-fraction or --validation-file)");
  return out;
}

int64_t steps_for_epochs(double epochs, int64_t samples_per_epoch, int64_t global_batch) {
  SO_CHECK(samples_per_epoch > 0,
           "train.num_train_epochs needs data with epochs (data.type \"prepared\"); windows "
           "of a token stream are drawn at random: give train.steps");
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(epochs * static_cast<double>(samples_per_epoch) /
                                                             static_cast<double>(global_batch))));
}

}  // namespace so
