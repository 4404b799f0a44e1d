#include "so/train/decay_groups.h"

#include <re2/re2.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <set>

#include "so/core/error.h"

namespace so {

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// "model.layers.3.input_layernorm.weight" -> "model.layers.*.input_layernorm.weight": one entry per
// kind of tensor in the start-up line, not one per layer.
std::string kind_of(std::string name) {
  static const RE2 layer_index(R"(\.layers\.[0-9]+\.)");
  RE2::GlobalReplace(&name, layer_index, ".layers.*.");
  return name;
}

// A pattern of the config: searched in time linear in the name whatever it is (RE2 has no
// backtracking; std::regex took exponential time on "(.+)+z" and overflowed its stack compiling
// deeply nested groups), and bounded in length so that compiling it is too.
constexpr size_t kMaxPatternBytes = 1024;

std::unique_ptr<RE2> compile(const std::string& p) {
  if (p.size() > kMaxPatternBytes)
    throw Error(
        str_cat("has a pattern of ", p.size(), " characters ('", p.substr(0, 40), "...'); at most ", kMaxPatternBytes));
  RE2::Options options;
  options.set_log_errors(false);
  auto re = std::make_unique<RE2>(p, options);
  if (!re->ok())
    throw Error(str_cat("has '", p, "', which is not a regular expression (", re->error(),
                        "; RE2 syntax: no backreferences or lookaround)"));
  return re;
}

}  // namespace

DecayGroups decay_groups(const ParamLayout& layout, const DecayGroupsConfig& cfg, double weight_decay) {
  std::vector<std::unique_ptr<RE2>> patterns;
  for (const std::string& p : cfg.exclude) patterns.push_back(compile(p));
  DecayGroups g;
  g.no_decay.assign(layout.params.size(), 0);
  std::vector<int64_t> matched(patterns.size(), 0);
  std::set<std::string> excluded_kinds;
  int64_t tensors[2] = {0, 0}, elements[2] = {0, 0};  // [decayed, not]
  for (size_t id = 0; id < layout.params.size(); ++id) {
    const std::string name = lower(layout.params[id].name);
    for (size_t k = 0; k < patterns.size(); ++k)
      if (RE2::PartialMatch(name, *patterns[k])) g.no_decay[id] = 1, ++matched[k];
    if (!cfg.decay_embeddings && static_cast<int>(id) == layout.embedding) g.no_decay[id] = 1;
    const int group = g.no_decay[id] ? 1 : 0;
    if (group) excluded_kinds.insert(kind_of(layout.params[id].name));
    ++tensors[group];
    elements[group] += layout.params[id].numel;
  }
  for (size_t k = 0; k < patterns.size() && cfg.exclude_given; ++k)
    SO_CHECK(matched[k] > 0, "has '", cfg.exclude[k], "', which matches no parameter of this model (",
             "names look like ", layout.params.front().name, "; patterns are searched in the lower-cased name)");
  std::string kinds;
  for (const std::string& k : excluded_kinds) kinds += (kinds.empty() ? "" : ", ") + k;
  std::string list;
  for (const std::string& p : cfg.exclude) list += (list.empty() ? "'" : ", '") + p + "'";
  g.description =
      str_cat("weight decay ", weight_decay, " on ", tensors[0], " tensors (", elements[0], " parameters); none on ",
              tensors[1], " tensors (", elements[1], " parameters: ", kinds.empty() ? "none" : kinds,
              ") matching train.weight_decay_exclude [", list, "]", cfg.exclude_given ? "" : " (HF Trainer's)",
              cfg.decay_embeddings ? "" : " or the embedding (train.decay_embeddings false)");
  return g;
}

}  // namespace so
