#pragma once
// Which parameters weight decay applies to: HF Trainer's two parameter groups by default (no
// decay on biases and norm weights, found by the name patterns of Trainer.get_decay_parameter_names),
// the embedding optionally excluded too (OLMo's decay_embeddings; HF decays it).
#include <string>
#include <vector>

#include "so/model/param_layout.h"

namespace so {

struct DecayGroupsConfig {
  // train.weight_decay_exclude: regular expressions (RE2 syntax, matched in linear time) searched
  // in each lower-cased Hugging Face parameter name; a match puts the parameter in the no-decay
  // group. HF Trainer's list by default.
  std::vector<std::string> exclude = {"bias", "layernorm", "rmsnorm", "(?:^|\\.)norm(?:$|\\.)", "_norm(?:$|\\.)"};
  bool exclude_given = false;    // the list came from the config (then every pattern must match something)
  bool decay_embeddings = true;  // train.decay_embeddings: false puts the embedding in the no-decay group
};

struct DecayGroups {
  std::vector<char> no_decay;  // per parameter id of the layout
  std::string description;     // for the start-up line
};

// Errors (said of train.weight_decay_exclude: "has 'x', which ..."): a pattern that is not a regular expression (or
// longer than 1024 characters), or one given in the config that matches no parameter of this model (a typo would
// silently decay norms).
DecayGroups decay_groups(const ParamLayout& layout, const DecayGroupsConfig& cfg, double weight_decay);

}  // namespace so
