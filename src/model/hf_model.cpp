#include "so/model/hf_model.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "so/core/error.h"
#include "so/core/json_reader.h"
#include "so/io/atomic_file.h"
#include "so/io/safetensors.h"
#include "so/model/mxfp4.h"

namespace so {

namespace fs = std::filesystem;

namespace {

constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";
constexpr char kTiedHead[] = "lm_head.weight";
// Shard names as transformers writes them: model-00001-of-00003.safetensors.
const std::regex kShardName(R"(model-\d{5}-of-\d{5}\.safetensors)");

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Buffers that older transformers versions saved beside the parameters: not weights.
bool is_known_buffer(const std::string& name) { return name.ends_with("rotary_emb.inv_freq"); }

// Every tensor of a model directory and the file that holds it, headers validated.
struct TensorFiles {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, const SafetensorsFile*> where;

  const SafetensorsTensor* find(const std::string& name) const {
    const auto it = where.find(name);
    return it == where.end() ? nullptr : it->second->find(name);
  }
};

TensorFiles open_single(const fs::path& path) {
  TensorFiles tf;
  tf.files.push_back(std::make_unique<SafetensorsFile>(path.string()));
  for (const SafetensorsTensor& t : tf.files.back()->tensors()) tf.where[t.name] = tf.files.back().get();
  return tf;
}

// The index maps every tensor to a shard; each shard must exist and hold exactly the tensors
// the index gives it.
TensorFiles open_sharded(const fs::path& dir) {
  const std::string index_path = (dir / kIndexFile).string();
  const nlohmann::json index = read_json_file(index_path, "shard index");
  SO_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(), "'", index_path,
           "' has no 'weight_map' object");
  std::map<std::string, std::string> map;  // tensor -> shard file name
  for (const auto& [tensor, file] : index["weight_map"].items()) {
    SO_CHECK(file.is_string(), "'", index_path, "': weight_map entry of tensor '", tensor, "' must be a file name");
    const std::string name = file.get<std::string>();
    // A shard is a file of this directory: no paths that lead elsewhere.
    SO_CHECK(!name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos, "'", index_path,
             "': tensor '", tensor, "' is mapped to '", name, "', which is not a file name in the directory");
    map[tensor] = name;
  }
  TensorFiles tf;
  std::map<std::string, const SafetensorsFile*> shards;
  for (const auto& [tensor, name] : map) {
    if (shards.count(name)) continue;
    const fs::path path = dir / name;
    SO_CHECK(fs::is_regular_file(path), "'", index_path, "' maps tensor '", tensor, "' to shard '", name,
             "', which does not exist");
    tf.files.push_back(std::make_unique<SafetensorsFile>(path.string()));
    shards[name] = tf.files.back().get();
  }
  for (const auto& [tensor, name] : map) {
    SO_CHECK(shards[name]->find(tensor), "'", index_path, "' maps tensor '", tensor, "' to shard '",
             shards[name]->path(), "', which does not hold it");
    tf.where[tensor] = shards[name];
  }
  for (const auto& [name, shard] : shards)
    for (const SafetensorsTensor& t : shard->tensors())
      SO_CHECK(map.count(t.name) && map[t.name] == name, "shard '", shard->path(), "' holds tensor '", t.name,
               "', which '", index_path, "' ",
               map.count(t.name) ? "maps to shard '" + map[t.name] + "'" : "does not list");
  return tf;
}

TensorFiles open_tensors(const fs::path& dir) {
  // transformers' order: the single file wins over an index.
  if (fs::exists(dir / kSingleFile)) return open_single(dir / kSingleFile);
  SO_CHECK(fs::exists(dir / kIndexFile), "model directory '", dir.string(), "' holds neither ", kSingleFile, " nor ",
           kIndexFile, " (only safetensors weights are read)");
  return open_sharded(dir);
}

// An MXFP4 expert stack [E, G*32, R] (HfTensor::mxfp4): E experts of R rows of G blocks.
struct Mxfp4Shape {
  int64_t experts, rows, groups;
};
Mxfp4Shape mxfp4_shape(const HfTensor& t) { return {t.shape[0], t.shape[2], t.shape[1] / (2 * kMxfp4BlockBytes)}; }

// Qwen3-MoE's experts as transformers 5 holds them in memory (and as some tools save them): per
// layer one gate_up_proj [E, 2I, H] (each expert's gate rows, then its up rows) and one down_proj
// [E, H, I], in place of the per-expert tensors its save_pretrained writes. Where a layer's fused
// tensors are in the directory, each per-expert parameter is read as its slice of them.
struct FusedSlice {
  std::string tensor;
  int64_t offset = 0;
};
struct FusedExperts {
  std::map<std::string, FusedSlice> slices;             // per-expert parameter name -> where it lies
  std::map<std::string, std::vector<int64_t>> tensors;  // fused tensor name -> its expected shape
};
FusedExperts fused_experts(const TensorFiles& tf, const ParamLayout& layout) {
  FusedExperts f;
  for (const LayerParamIds& ids : layout.layers) {
    if (ids.expert_gate.empty()) continue;
    const std::string& first = layout.params[ids.expert_gate[0]].name;  // ...mlp.experts.0.gate_proj.weight
    const std::string prefix = first.substr(0, first.find("experts.") + 8);
    const std::string gate_up = prefix + "gate_up_proj", down = prefix + "down_proj";
    if (!tf.find(gate_up) && !tf.find(down)) continue;
    const int64_t E = static_cast<int64_t>(ids.expert_gate.size());
    const std::vector<int64_t>& gs = layout.params[ids.expert_gate[0]].shape;  // [I, H]
    const int64_t I = gs[0], H = gs[1];
    f.tensors[gate_up] = {E, 2 * I, H};
    f.tensors[down] = {E, H, I};
    for (int64_t e = 0; e < E; ++e) {
      f.slices[layout.params[ids.expert_gate[e]].name] = {gate_up, e * 2 * I * H};
      f.slices[layout.params[ids.expert_up[e]].name] = {gate_up, e * 2 * I * H + I * H};
      f.slices[layout.params[ids.expert_down[e]].name] = {down, e * H * I};
    }
  }
  return f;
}

// Fails unless the tensors are exactly the layout's parameters with the layout's shapes, plus
// the tolerated extras (a tied lm_head, rotary buffers). All problems are listed at once.
void check_against_layout(const fs::path& dir, const TensorFiles& tf, const ParamLayout& layout) {
  const bool tied = layout.lm_head == layout.embedding;
  std::vector<std::string> problems;
  auto check_shape = [&](const std::string& name, const std::vector<int64_t>& expected) {
    const SafetensorsTensor* t = tf.find(name);
    if (!t) {
      problems.push_back(str_cat("tensor '", name, "' ", shape_str(expected), " is missing",
                                 name == kTiedHead ? " (config.json has tie_word_embeddings false)" : ""));
    } else if (t->shape != expected) {
      problems.push_back(str_cat("tensor '", name, "' in '", tf.where.at(name)->path(), "' has shape ",
                                 shape_str(t->shape), " (", safetensors_dtype_name(t->dtype), "); config.json needs ",
                                 shape_str(expected)));
    }
  };
  std::set<std::string> expected;
  const FusedExperts fused = fused_experts(tf, layout);
  for (const auto& [name, shape] : fused.tensors) {
    check_shape(name, shape);
    expected.insert(name);
  }
  for (const HfTensor& t : layout.hf_tensors) {
    if (fused.slices.count(t.name)) continue;  // read from its layer's fused tensor
    if (!t.mxfp4) {
      check_shape(t.name, t.shape);
      expected.insert(t.name);
      continue;
    }
    // The [E, G*32, R] stack as transformers' convert_moe_packed_tensors reads it: bytes, per
    // expert and output row, of G blocks of 32 values.
    const Mxfp4Shape s = mxfp4_shape(t);
    check_shape(t.name + "_blocks", {s.experts, s.rows, s.groups, kMxfp4BlockBytes});
    check_shape(t.name + "_scales", {s.experts, s.rows, s.groups});
    for (const std::string& part : {t.name + "_blocks", t.name + "_scales"}) {
      expected.insert(part);
      if (const SafetensorsTensor* st = tf.find(part); st && st->dtype != SafetensorsDType::U8)
        problems.push_back(str_cat("tensor '", part, "' in '", tf.where.at(part)->path(), "' is ",
                                   safetensors_dtype_name(st->dtype), "; MXFP4 (quantization_config) stores U8"));
    }
  }
  if (tied && tf.find(kTiedHead)) {
    check_shape(kTiedHead, layout.params[layout.embedding].shape);
    expected.insert(kTiedHead);
  }
  for (const auto& [name, file] : tf.where)
    if (!expected.count(name) && !is_known_buffer(name)) {
      const SafetensorsTensor& t = *file->find(name);
      problems.push_back(str_cat("unexpected tensor '", name, "' ", shape_str(t.shape), " (",
                                 safetensors_dtype_name(t.dtype), ") in '", file->path(),
                                 "': the model of config.json has no such parameter"));
    }
  if (problems.empty()) {
    // Scales are 1/16 of the blocks: all of them are checked now, before anything is allocated.
    for (const HfTensor& t : layout.hf_tensors)
      if (t.mxfp4) {
        const Mxfp4Shape s = mxfp4_shape(t);
        const std::string name = t.name + "_scales";
        check_mxfp4_scales(tf.where.at(name)->read_u8(name), s.experts * s.rows, s.groups,
                           str_cat("model directory '", dir.string(), "': tensor '", name, "'"));
      }
    return;
  }
  constexpr size_t kListed = 20;  // a wholly different model would list every tensor
  std::string msg;
  for (size_t i = 0; i < problems.size() && i < kListed; ++i) msg += (i ? "; " : " ") + problems[i];
  if (problems.size() > kListed) msg += str_cat("; and ", problems.size() - kListed, " more");
  SO_FAIL("model directory '", dir.string(), "' does not match its config.json (", problems.size(), " problem",
          problems.size() > 1 ? "s" : "", "):", msg);
}

const char* hf_dtype_name(DType t) { return t == DType::F32 ? "float32" : "bfloat16"; }

}  // namespace

void check_hf_weights(const std::string& dir, const ParamLayout& layout) {
  check_against_layout(dir, open_tensors(dir), layout);
}

void load_hf_weights(const std::string& dir, const ParamLayout& layout,
                     const std::function<void(int param_id, std::vector<float> values)>& load) {
  const TensorFiles tf = open_tensors(dir);
  check_against_layout(dir, tf, layout);
  const bool tied = layout.lm_head == layout.embedding;
  const FusedExperts fused = fused_experts(tf, layout);
  std::map<std::string, std::vector<float>> fused_read;  // one layer's fused tensors at a time
  for (const HfTensor& t : layout.hf_tensors) {
    const std::string& name = t.name;
    if (const auto slice = fused.slices.find(name); slice != fused.slices.end()) {
      const std::string& tensor = slice->second.tensor;
      if (!fused_read.count(tensor)) {
        if (fused_read.size() >= 2) fused_read.clear();  // the previous layer's pair
        fused_read[tensor] = tf.where.at(tensor)->read_f32(tensor);
      }
      const std::vector<float>& all = fused_read.at(tensor);
      const int64_t n = layout.params[t.parts[0]].numel;
      load(t.parts[0], std::vector<float>(all.begin() + slice->second.offset, all.begin() + slice->second.offset + n));
      continue;
    }
    if (t.mxfp4) {  // dequantised rows [E, R, G*32], transposed per expert into the [E, G*32, R] parameter
      const Mxfp4Shape s = mxfp4_shape(t);
      const std::string blocks = name + "_blocks", scales = name + "_scales";
      const std::vector<float> rows =
          dequantize_mxfp4(tf.where.at(blocks)->read_u8(blocks), tf.where.at(scales)->read_u8(scales),
                           s.experts * s.rows, s.groups, str_cat("model directory '", dir, "': tensor '", blocks, "'"));
      const int64_t cols = t.shape[1];
      std::vector<float> values(rows.size());
      for (int64_t e = 0; e < s.experts; ++e)
        for (int64_t r = 0; r < s.rows; ++r)
          for (int64_t c = 0; c < cols; ++c) values[(e * cols + c) * s.rows + r] = rows[(e * s.rows + r) * cols + c];
      load(t.parts[0], std::move(values));
      continue;
    }
    std::vector<float> values = tf.where.at(name)->read_f32(name);
    if (tied && t.parts[0] == layout.embedding && tf.find(kTiedHead)) {
      // Bit patterns, so a NaN equals itself.
      const std::vector<float> head = tf.where.at(kTiedHead)->read_f32(kTiedHead);
      SO_CHECK(std::memcmp(head.data(), values.data(), values.size() * sizeof(float)) == 0, "model directory '", dir,
               "': ", kTiedHead, " differs from ", name, " but config.json ties them (tie_word_embeddings true)");
    }
    if (t.parts.size() == 1) {
      load(t.parts[0], std::move(values));
      continue;
    }
    int64_t row_elems = 0;  // a stacked tensor's parts are consecutive row ranges
    for (int id : t.parts) {
      const int64_t n = layout.params[id].numel;
      load(id, std::vector<float>(values.begin() + row_elems, values.begin() + row_elems + n));
      row_elems += n;
    }
  }
}

HfModel load_hf_model(const std::string& dir) {
  HfModel m;
  m.config = ModelConfig::from_hf_file((fs::path(dir) / "config.json").string());
  m.layout = ParamLayout::for_model(m.config);
  m.values.resize(m.layout.params.size());
  load_hf_weights(dir, m.layout, [&](int id, std::vector<float> v) { m.values[id] = std::move(v); });
  return m;
}

void export_hf_model(const std::string& dir, const ModelConfig& cfg, const ParamLayout& layout,
                     const std::function<std::vector<float>(int param_id)>& get, const HfExportOptions& opts) {
  SO_CHECK(opts.max_shard_bytes >= 0, "export to '", dir, "': max_shard_bytes must not be negative");
  const fs::path root(dir);
  std::error_code ec;
  fs::create_directories(root, ec);
  SO_CHECK(!ec, "cannot create model directory '", dir, "': ", ec.message());
  // What save_pretrained writes; transformers 4.x refuses metadata without a framework "format".
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};

  // Shards of checkpoint tensors in layout order: a new one starts when the next tensor would
  // overflow the limit.
  const std::vector<HfTensor>& tensors = layout.hf_tensors;
  std::vector<std::vector<int>> shards(1);  // indices into tensors
  int64_t shard_bytes = 0, total_bytes = 0, total_params = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    int64_t numel = 0;
    for (int id : tensors[i].parts) numel += layout.params[id].numel;
    const int64_t bytes = numel * static_cast<int64_t>(dtype_size(opts.dtype));
    if (opts.max_shard_bytes > 0 && !shards.back().empty() && shard_bytes + bytes > opts.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(static_cast<int>(i));
    shard_bytes += bytes;
    total_bytes += bytes;
    total_params += numel;
  }
  auto write_shard = [&](const fs::path& path, const std::vector<int>& which) {
    std::vector<SafetensorsEntry> entries;
    for (int i : which) entries.push_back({tensors[i].name, tensors[i].shape});
    write_safetensors(
        path.string(), entries, opts.dtype,
        [&](size_t e) {
          const HfTensor& t = tensors[which[e]];
          std::vector<float> values = get(t.parts[0]);
          for (size_t j = 1; j < t.parts.size(); ++j) {  // stacked: the parts' rows one after another
            const std::vector<float> part = get(t.parts[j]);
            values.insert(values.end(), part.begin(), part.end());
          }
          return values;
        },
        metadata);
  };

  std::set<std::string> written;
  if (shards.size() == 1) {
    write_shard(root / kSingleFile, shards[0]);
  } else {
    nlohmann::json weight_map = nlohmann::json::object();
    for (size_t s = 0; s < shards.size(); ++s) {
      char name[64];
      std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
      write_shard(root / name, shards[s]);
      written.insert(name);
      for (int i : shards[s]) weight_map[tensors[i].name] = name;
    }
    const nlohmann::json index = {{"metadata", {{"total_size", total_bytes}, {"total_parameters", total_params}}},
                                  {"weight_map", weight_map}};
    write_file_atomically((root / kIndexFile).string(), index.dump(2) + "\n");
  }
  // What an earlier export of the other layout left: transformers would read it first (the
  // single file) or it would sit there unreferenced (shards, index).
  std::vector<fs::path> stale;  // collected first: removing while iterating is unspecified
  for (const fs::directory_entry& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (shards.size() == 1 ? name == kIndexFile || std::regex_match(name, kShardName)
                           : name == kSingleFile || (std::regex_match(name, kShardName) && !written.count(name)))
      stale.push_back(e.path());
  }
  for (const fs::path& p : stale) fs::remove(p);
  nlohmann::json config = cfg.to_hf_json();
  config["dtype"] = hf_dtype_name(opts.dtype);
  write_file_atomically((root / "config.json").string(), config.dump(2) + "\n");
}

}  // namespace so
