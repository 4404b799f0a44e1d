#pragma once
// Rotary position embedding frequencies as transformers computes them (modeling_rope_utils.py):
// the inverse frequency of each pair of head dimensions after the config's RoPE scaling, and the
// factor cos and sin are multiplied by (yarn's attention factor). Computed once per model, in
// double; the rope op rotates by the table, so scaling costs nothing per step.
#include <cstdint>
#include <string>
#include <vector>

namespace so {

// A config's rope_scaling (transformers 4) or rope_parameters (transformers 5), already checked.
struct RopeScaling {
  std::string type = "default";                          // default | linear | dynamic | yarn | llama3
  double factor = 1.0;                                   // every type but default
  double low_freq_factor = 0.0, high_freq_factor = 0.0;  // llama3
  int64_t original_max_position_embeddings = 0;          // llama3, yarn
  double beta_fast = 32.0, beta_slow = 1.0;              // yarn
  double mscale = 0.0, mscale_all_dim = 0.0;             // yarn; 0 = not given
  double attention_factor = -1.0;                        // yarn; < 0 = derived from factor and mscale
  bool truncate = true;                                  // yarn: round the correction range outwards
};

struct RopeFrequencies {
  std::vector<double> inv_freq;   // [head_dim / 2]
  double attention_factor = 1.0;  // cos and sin are multiplied by it
};

// theta^(-2i/dim), i < dim/2: the unscaled table.
std::vector<double> rope_default_inv_freq(double theta, int64_t dim);

// The table of a model. "dynamic" is the default table: transformers rescales only once a batch's
// positions pass max_position_embeddings, and so_train refuses data.seq_len beyond it (run_config).
RopeFrequencies rope_frequencies(const RopeScaling& s, double theta, int64_t head_dim);

}  // namespace so
