#include "so/train/run_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <initializer_list>

#include "so/core/error.h"
#include "so/optim/simd_isa.h"
#include "so/core/json_reader.h"
#include "so/data/prepared_data.h"
#include "so/data/token_source.h"

namespace so {

nlohmann::json load_json_file(const std::string& path) { return read_json_file(path, "config file"); }

void apply_override(nlohmann::json& doc, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  SO_CHECK(eq != std::string::npos && eq > 0, "--set '", assignment, "' must look like key.path=value");
  const std::string path = assignment.substr(0, eq), text = assignment.substr(eq + 1);
  nlohmann::json value;
  try {
    value = parse_json_text(text, str_cat("--set '", path, "'"));
  } catch (const Error&) {
    value = text;  // bare words are strings
  }
  nlohmann::json* node = &doc;
  size_t start = 0;
  for (;;) {
    const size_t dot = path.find('.', start);
    const std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    SO_CHECK(!key.empty(), "--set '", assignment, "' has an empty key");
    SO_CHECK(node->is_object(), "--set '", assignment, "': '", path.substr(0, start ? start - 1 : 0),
             "' is not an object");
    if (dot == std::string::npos) {
      (*node)[key] = value;
      return;
    }
    node = &(*node)[key];
    if (node->is_null()) *node = nlohmann::json::object();
    start = dot + 1;
  }
}

namespace {

constexpr int64_t kMaxSteps = int64_t{1} << 40;
constexpr int64_t kMaxElements = int64_t{1} << 40;
constexpr int64_t kMaxBatch = int64_t{1} << 30;  // sequences; a product of two stays below 2^60

// The kernels compute in float: a learning rate (and eps, wd) must survive the rounding.
bool float_finite(double x) { return std::isfinite(static_cast<float>(x)); }

// A learning rate of the config (optimizer.params.lr and the schedules' lr keys): >= 0 (or > 0)
// and finite as a 32-bit float. A negative one trains by gradient ascent, one past 3.4e38 is
// infinite in the kernels and every loss NaN.
double read_lr(JsonReader& p, const char* key, double fallback, bool positive = false) {
  const double lr = p.get<double>(key, fallback);
  if (!((positive ? lr > 0 : lr >= 0) && float_finite(lr)))
    p.fail(key,
           str_cat("is ", lr, "; it must be ", positive ? "> 0" : ">= 0", " and finite as a 32-bit float (<= 3.4e38)"));
  return lr;
}

// A fraction of optimizer.params.lr, in [0, 1].
double read_fraction(JsonReader& p, const char* key, double fallback) {
  const double v = p.get<double>(key, fallback);
  if (!(v >= 0 && v <= 1)) p.fail(key, str_cat("is ", v, "; it must be in [0, 1] (a fraction of optimizer.params.lr)"));
  return v;
}

// A rate (a factor per step): >= 0 and finite.
double read_rate(JsonReader& p, const char* key, double fallback) {
  const double v = p.get<double>(key, fallback);
  if (!(v >= 0 && std::isfinite(v))) p.fail(key, str_cat("is ", v, "; it must be >= 0 and finite"));
  return v;
}

void parse_optimizer(JsonReader r, RunConfig& c) {
  const std::string type = r.get<std::string>("type", "AdamW");
  // DeepSpeed's "Adam" defaults to adam_w_mode (decoupled decay): both mean AdamW here.
  if (type != "AdamW" && type != "Adam") r.fail("type", "is '" + type + "'; supported: AdamW, Adam (AdamW mode)");
  JsonReader p = r.child("params");
  c.schedule.base_lr = read_lr(p, "lr", 1e-3);
  const auto betas = p.get<std::vector<double>>("betas", {0.9, 0.999});
  if (betas.size() != 2) p.fail("betas", "must have two elements");
  for (double b : betas)
    if (b < 0.0 || b >= 1.0) p.fail("betas", "must lie in [0, 1)");
  c.adam.beta1 = betas[0];
  c.adam.beta2 = betas[1];
  c.adam.eps = p.get<double>("eps", 1e-8);
  c.adam.weight_decay = p.get<double>("weight_decay", 0.0);
  // eps below 1.4e-45 is 0 in float, and a zero second moment would then divide by zero.
  if (!(static_cast<float>(c.adam.eps) > 0.0f && float_finite(c.adam.eps)))
    p.fail("eps", str_cat("is ", c.adam.eps,
                          "; it must be a positive number that a 32-bit float can hold (1.4e-45 .. 3.4e38)"));
  if (!p.get<bool>("adam_w_mode", true)) p.fail("adam_w_mode", "false (L2-coupled Adam) is not supported");
  p.accept("torch_adam");
  if (!(c.adam.weight_decay >= 0 && float_finite(c.adam.weight_decay)))
    p.fail("weight_decay", str_cat("is ", c.adam.weight_decay, "; it must be >= 0 and finite as a 32-bit float"));
  p.finish();
  r.finish();
}

// DeepSpeed's OneCycle (deepspeed/runtime/lr_schedules.py), its parameter names and defaults.
void parse_one_cycle(JsonReader& p, LrSchedule& s) {
  for (const char* k : {"cycle_min_lr", "cycle_max_lr"})
    if (!p.has(k)) p.fail(k, "is required");
  s.cycle_min_lr = read_lr(p, "cycle_min_lr", 0.0);
  s.cycle_max_lr = read_lr(p, "cycle_max_lr", 0.0);
  s.decay_lr_rate = read_rate(p, "decay_lr_rate", 0.0);
  s.cycle_first_step_size = static_cast<double>(p.get_in("cycle_first_step_size", 2000, 1, kMaxSteps));
  // DeepSpeed takes None (null) for "as long as the first half".
  const auto given = [&](const char* k) { return p.has(k) && !p.raw().at(k).is_null(); };
  s.cycle_second_step_size = given("cycle_second_step_size")
                                 ? static_cast<double>(p.get_in("cycle_second_step_size", 0, 1, kMaxSteps))
                                 : s.cycle_first_step_size;
  p.accept("cycle_second_step_size");
  s.decay_step_size = p.get_in("decay_step_size", 0, 0, kMaxSteps);
  if (!(s.cycle_max_lr >= s.cycle_min_lr))
    p.fail("cycle_max_lr", str_cat("is ", s.cycle_max_lr, ", below cycle_min_lr (", s.cycle_min_lr, ")"));
  // A staircase is refused rather than ignored.
  for (const char* k : {"cycle_first_stair_count", "cycle_second_stair_count"}) {
    if (given(k) && p.get<int64_t>(k, 0) != 0)
      p.fail(k, "asks for a staircase cycle, which so_train does not implement; give 0 or leave it out");
    p.accept(k);
  }
  s.cycle_momentum = p.get<bool>("cycle_momentum", true);  // DeepSpeed's default
  s.cycle_min_mom = p.get<double>("cycle_min_mom", s.cycle_min_mom);
  s.cycle_max_mom = p.get<double>("cycle_max_mom", s.cycle_max_mom);
  if (!(s.cycle_min_mom >= 0 && s.cycle_max_mom < 1 && s.cycle_min_mom <= s.cycle_max_mom))
    p.fail("cycle_min_mom", str_cat("is ", s.cycle_min_mom, " and cycle_max_mom ", s.cycle_max_mom,
                                    "; Adam's beta1 needs 0 <= cycle_min_mom <= cycle_max_mom < 1"));
  // DeepSpeed multiplies beta1 by (1 + rate x steps) after the cycle: it passes 1, and Adam breaks.
  if (p.get<double>("decay_mom_rate", 0.0) != 0.0 && s.cycle_momentum)
    p.fail("decay_mom_rate",
           "is not 0: DeepSpeed's momentum decay grows beta1 by (1 + rate x steps) until it passes 1; "
           "give 0 (beta1 stays at cycle_max_mom after the cycle)");
}

// DeepSpeed's LRRangeTest.
void parse_range_test(JsonReader& p, LrSchedule& s) {
  s.range_min_lr = read_lr(p, "lr_range_test_min_lr", 1e-3, true);
  s.range_step_size = static_cast<double>(p.get_in("lr_range_test_step_size", 2000, 1, kMaxSteps));
  s.range_step_rate = read_rate(p, "lr_range_test_step_rate", 1.0);
  s.range_staircase = p.get<bool>("lr_range_test_staircase", false);
}

// Warmup-stable-decay with transformers.get_wsd_schedule's names: the stable phase given, or what
// num_training_steps leaves of it.
void parse_wsd(JsonReader& p, LrSchedule& s) {
  s.warmup_steps = p.get_in("num_warmup_steps", 0, 0, kMaxSteps);
  if (!p.has("num_decay_steps")) p.fail("num_decay_steps", "is required");
  s.decay_steps = p.get_in("num_decay_steps", 0, 0, kMaxSteps);
  if (p.has("num_stable_steps") == p.has("num_training_steps"))
    p.fail("num_stable_steps",
           "or num_training_steps: give exactly one (the stable phase, or the whole run it is the rest of)");
  if (p.has("num_stable_steps")) {
    s.stable_steps = p.get_in("num_stable_steps", 0, 0, kMaxSteps);
  } else {
    const int64_t total = p.get_in("num_training_steps", 0, 0, kMaxSteps);
    s.stable_steps = total - s.warmup_steps - s.decay_steps;
    if (s.stable_steps < 0)
      p.fail("num_training_steps", str_cat("is ", total, ", fewer than num_warmup_steps + num_decay_steps (",
                                           s.warmup_steps, " + ", s.decay_steps, "): the phases do not fit"));
  }
  const auto shape = [&](const char* key, const char* fallback) {
    const std::string v = p.get<std::string>(key, fallback);
    if (v != "linear" && v != "cosine" && v != "1-sqrt") p.fail(key, "is '" + v + "'; choose linear, cosine or 1-sqrt");
    return v;
  };
  s.warmup_type = shape("warmup_type", "linear");
  s.decay_type = shape("decay_type", "cosine");
  s.min_lr_ratio = read_fraction(p, "min_lr_ratio", 0.0);
  // More than half a period per decay step samples the cosine below its period: the lr the steps
  // see is an alias (at 1e308 periods, 0 throughout).
  s.num_cycles = p.get<double>("num_cycles", 0.5);
  const double most = std::max(0.5, static_cast<double>(s.decay_steps) / 2.0);
  if (!(s.num_cycles > 0 && s.num_cycles <= most))
    p.fail("num_cycles",
           str_cat("is ", s.num_cycles, "; it must be in (0, ", most,
                   "]: at most half a cosine period per decay step (num_decay_steps ", s.decay_steps, ")"));
}

void parse_scheduler(JsonReader r, RunConfig& c) {
  LrSchedule& s = c.schedule;
  s.type = r.require<std::string>("type");
  if (s.type != "WarmupLR" && s.type != "WarmupCosineLR" && s.type != "WarmupDecayLR" && s.type != "OneCycle" &&
      s.type != "LRRangeTest" && s.type != "WSD")
    r.fail("type",
           "is '" + s.type + "'; supported: WarmupLR, WarmupCosineLR, WarmupDecayLR, OneCycle, LRRangeTest, WSD");
  JsonReader p = r.child("params");
  if (s.type == "OneCycle") {
    parse_one_cycle(p, s);
  } else if (s.type == "LRRangeTest") {
    parse_range_test(p, s);
  } else if (s.type == "WSD") {
    parse_wsd(p, s);
  } else {
    s.warmup_steps = p.get_in("warmup_num_steps", 1000, 0, kMaxSteps);
    s.warmup_type = p.get<std::string>("warmup_type", "log");
    if (s.warmup_type != "log" && s.warmup_type != "linear") p.fail("warmup_type", "must be 'log' or 'linear'");
    if (s.type == "WarmupCosineLR") {
      s.total_steps = p.get_in("total_num_steps", -1, 1, kMaxSteps);
      if (s.total_steps < 0) p.fail("total_num_steps", "is required");
      s.warmup_min_ratio = read_fraction(p, "warmup_min_ratio", 0.0);
      s.cos_min_ratio = read_fraction(p, "cos_min_ratio", 0.0001);
    } else {
      s.warmup_min_lr = read_lr(p, "warmup_min_lr", 0.0);
      s.warmup_max_lr = read_lr(p, "warmup_max_lr", 0.001);
      if (s.warmup_min_lr > s.warmup_max_lr)
        p.fail("warmup_min_lr", str_cat("is ", s.warmup_min_lr, ", above warmup_max_lr (", s.warmup_max_lr,
                                        "): the warm-up rises from the one to the other"));
      if (s.type == "WarmupDecayLR") {
        s.total_steps = p.get_in("total_num_steps", -1, 1, kMaxSteps);
        if (s.total_steps < 0) p.fail("total_num_steps", "is required");
      }
    }
    if (s.type != "WarmupLR" && s.total_steps < s.warmup_steps)
      p.fail("total_num_steps", "is smaller than warmup_num_steps");
    // DeepSpeed divides by the cosine's length, total_num_steps - max(2, warmup_num_steps).
    if (s.type == "WarmupCosineLR" && s.total_steps <= std::max<int64_t>(2, s.warmup_steps))
      p.fail("total_num_steps", str_cat("is ", s.total_steps, "; the cosine phase after the warm-up (at least 2 steps ",
                                        "in DeepSpeed) would be empty"));
  }
  p.accept("last_batch_iteration");
  p.finish();
  r.finish();
}

template <typename E, size_t N>
E parse_choice(JsonReader& r, const std::string& key, E fallback, const std::pair<const char*, E> (&choices)[N]) {
  if (!r.has(key)) return fallback;
  const std::string v = r.get<std::string>(key, "");
  std::string names;
  for (const auto& [name, value] : choices) {
    if (v == name) return value;
    names += names.empty() ? name : std::string(", ") + name;
  }
  r.fail(key, "is '" + v + "'; choose one of " + names);
}

void parse_offload(JsonReader o, OffloadConfig& off) {
  const std::string device = o.get<std::string>("device", "none");
  if (device != "none" && device != "cpu")
    o.fail("device", "is '" + device + "'; supported: none, cpu (NVMe offload is not implemented)");
  const bool super = o.get<bool>("super_offload", false);
  off.mode = device == "none" ? OffloadMode::None : super ? OffloadMode::SuperOffload : OffloadMode::ZeroOffload;
  if (device == "none" && super) o.fail("super_offload", "needs offload_optimizer.device \"cpu\"");
  off.ratio = o.get<double>("ratio", off.ratio);
  if (!(off.ratio >= 0.0 && off.ratio <= 1.0)) o.fail("ratio", str_cat("is ", off.ratio, "; must be in [0, 1]"));
  off.device_tail_buckets = o.has("device_tail_buckets") ? o.get_in("device_tail_buckets", 0, 0, INT32_MAX) : -1;
  if (o.has("device_tail_buckets") && o.has("ratio"))
    o.fail("device_tail_buckets", "and 'ratio' both choose which buckets stay on the device; give one");
  off.cpu_cores_fraction = o.get<double>("cpuadam_cores_perc", off.cpu_cores_fraction);
  if (!(off.cpu_cores_fraction > 0.0 && off.cpu_cores_fraction <= 1.0))
    o.fail("cpuadam_cores_perc", str_cat("is ", off.cpu_cores_fraction, "; must be a fraction in (0, 1]"));
  off.pin_memory = o.get<bool>("pin_memory", off.pin_memory);
  static const std::pair<const char*, CastSite> sites[] = {
      {"auto", CastSite::Auto}, {"device", CastSite::Device}, {"host", CastSite::Host}};
  off.cast_grads = parse_choice(o, "cast_grads", off.cast_grads, sites);
  off.cast_weights = parse_choice(o, "cast_weights", off.cast_weights, sites);
  static const std::pair<const char*, RollbackMode> rollbacks[] = {{"inverse", RollbackMode::Inverse},
                                                                   {"exact", RollbackMode::Exact}};
  off.rollback = parse_choice(o, "rollback", off.rollback, rollbacks);
  static const std::pair<const char*, Speculation> speculations[] = {{"adaptive", Speculation::Adaptive},
                                                                     {"always", Speculation::Always}};
  off.speculation = parse_choice(o, "speculation", off.speculation, speculations);
  off.simd = o.get<std::string>("simd", off.simd);
  if (off.simd != "auto") {
    try {
      parse_simd_isa(off.simd);
    } catch (const Error& e) {
      o.fail("simd", e.what());
    }
  }
  // DeepSpeed knobs of its NVMe/AIO path that have no meaning for CPU offload.
  for (const char* k : {"buffer_count", "fast_init", "pipeline_read", "pipeline_write"}) o.accept(k);
  o.finish();
}

void parse_zero(JsonReader r, RunConfig& c) {
  c.zero_stage = static_cast<int>(r.get_in("stage", c.zero_stage, 0, 3));
  c.bucket_size = r.get_in("sub_group_size", c.bucket_size, 1, kMaxElements);
  if (r.has("offload_optimizer")) parse_offload(r.child("offload_optimizer"), c.offload);
  // Communication-tuning knobs of DeepSpeed that do not change results; accepted as no-ops.
  for (const char* k :
       {"overlap_comm", "contiguous_gradients", "reduce_bucket_size", "reduce_scatter", "allgather_bucket_size",
        "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold", "stage3_max_live_parameters",
        "stage3_max_reuse_distance", "stage3_gather_16bit_weights_on_model_save", "round_robin_gradients"})
    r.accept(k);
  r.finish();
}

void parse_model(JsonReader r, RunConfig& c) {
  if (r.has("config") + r.has("inline") + r.has("hf_dir") != 1)
    r.fail("config",
           "give exactly one of model.config (path to an HF config.json), model.inline or model.hf_dir "
           "(a Hugging Face model directory)");
  nlohmann::json hf;
  std::string source;  // what errors name
  if (r.has("config")) {
    c.model_source = source = r.require<std::string>("config");
    hf = read_json_file(source, "model config");
  } else if (r.has("hf_dir")) {
    // The weights are read by the trainer (load_hf_weights), after the engine exists.
    c.init_hf_dir = r.require<std::string>("hf_dir");
    if (!std::filesystem::is_directory(c.init_hf_dir))
      r.fail("hf_dir", "names '" + c.init_hf_dir + "', which is not a directory");
    c.model_source = c.init_hf_dir;
    source = (std::filesystem::path(c.init_hf_dir) / "config.json").string();
    hf = read_json_file(source, "model config");
  } else {
    c.model_source = source = c.source + ": model.inline";
    hf = r.child("inline").raw();
  }
  // model.override: keys that replace config.json's, read like them (e.g. Seed-OSS's dropout set
  // to 0 to train without it).
  r.accept("override");
  if (r.has("override")) {
    for (const auto& [key, value] : r.child("override").raw().items()) hf[key] = value;
    source += str_cat(" with ", c.source, ": model.override");
  }
  c.model = ModelConfig::from_hf_json(hf, source);
  r.finish();
}

void parse_data(JsonReader r, RunConfig& c) {
  DataConfig& d = c.data;
  d.type = r.get<std::string>("type", "text");
  if (d.type != "text" && d.type != "tokens" && d.type != "hdf5" && d.type != "synthetic" && d.type != "prepared" &&
      d.type != "megatron")
    r.fail("type", "is '" + d.type + "'; supported: text, tokens, hdf5, synthetic, prepared, megatron");
  if (d.type == "prepared") {  // rows of the file's length; data.seq_len, when given, must agree
    d.path = r.require<std::string>("path");
    if (!std::filesystem::is_regular_file(d.path)) r.fail("path", "names '" + d.path + "', which is not a file");
    if (!is_prepared_file(d.path))
      r.fail("path", "names '" + d.path + "', which scripts/prepare_data.py did not write");
    const int64_t row = prepared_row_length(d.path);
    const int64_t given = r.get_in("seq_len", row, 1, INT32_MAX);
    if (given != row)
      r.fail("seq_len", str_cat("is ", given, " but the rows of '", d.path, "' have ", row,
                                " tokens (a row is one sample; leave seq_len out)"));
    d.seq_len = row;
    d.seed = static_cast<uint64_t>(r.get<int64_t>("seed", static_cast<int64_t>(c.seed)));
    r.finish();
    return;
  }
  if (!r.has("seq_len")) r.fail("seq_len", "is required (tokens per sequence; so_train --seq-len N sets it)");
  // RoPE positions and token indices are 32-bit on the device.
  d.seq_len = r.get_in("seq_len", 0, 1, INT32_MAX);
  d.seed = static_cast<uint64_t>(r.get<int64_t>("seed", static_cast<int64_t>(c.seed)));
  if (d.type == "synthetic") {
    d.synthetic_tokens = r.get_in("size", d.synthetic_tokens, 2, kMaxElements);
  } else if (d.type == "megatron") {
    // One prefix (data.path) or Megatron's blend list (data.blend: weight, prefix, weight, ...).
    if (r.has("path") == r.has("blend")) r.fail("path", "or blend: give exactly one for Megatron data");
    const nlohmann::json list =
        r.has("path") ? nlohmann::json::array({1.0, r.require<std::string>("path")}) : r.raw()["blend"];
    r.accept("blend");
    if (!list.is_array() || list.empty() || list.size() % 2 != 0)
      r.fail("blend", "must be [weight, prefix, weight, prefix, ...] as Megatron's --data-path");
    for (size_t i = 0; i < list.size(); i += 2) {
      if (!list[i].is_number() || !(list[i].get<double>() > 0) || !list[i + 1].is_string())
        r.fail("blend", str_cat("entry ", i / 2, " must be a positive weight and a path prefix"));
      const std::string prefix = list[i + 1].get<std::string>();
      for (const char* ext : {".bin", ".idx"})
        if (!std::filesystem::is_regular_file(prefix + ext))
          r.fail(r.has("path") ? "path" : "blend",
                 str_cat("names the prefix '", prefix, "', but '", prefix, ext, "' is not a file"));
      d.blend.emplace_back(list[i].get<double>(), prefix);
    }
  } else {
    d.path = r.require<std::string>("path");
    if (!std::filesystem::exists(d.path)) r.fail("path", "names '" + d.path + "', which does not exist");
    if (std::filesystem::is_directory(d.path)) r.fail("path", "names '" + d.path + "', which is a directory");
    if (d.type == "hdf5") d.dataset = r.get<std::string>("dataset", d.dataset);
  }
  r.finish();
}

void parse_train(JsonReader r, RunConfig& c) {
  c.num_train_epochs = r.get<double>("num_train_epochs", 0.0);
  if (!(c.num_train_epochs >= 0.0 && c.num_train_epochs <= 1e6))
    r.fail("num_train_epochs", str_cat("is ", c.num_train_epochs, "; it must lie in [0, 1e6]"));
  // As in transformers, steps (max_steps there), when given, decides over the epochs.
  if (c.num_train_epochs == 0 || r.has("steps")) {
    if (!r.has("steps") && c.steps <= 0)
      r.fail("steps", "is required (so_train --steps N sets it; or train.num_train_epochs)");
    c.steps = r.get_in("steps", c.steps, 1, kMaxSteps);
  }
  c.eval_every = r.get_in("eval_every", 0, 0, kMaxSteps);
  const std::string norm = r.get<std::string>("loss_normalization", "step");
  if (norm != "step" && norm != "micro_batch")
    r.fail("loss_normalization", "is '" + norm +
                                     "'; supported: step (mean over the step's supervised tokens), "
                                     "micro_batch (mean per micro-batch, as DeepSpeed)");
  c.loss_normalization = norm == "step" ? LossNormalization::Step : LossNormalization::MicroBatch;
  c.log_every = r.get_in("log_every", c.log_every, 1, kMaxSteps);
  c.peak_tflops = r.get<double>("peak_tflops", 0.0);
  c.activation_checkpointing = r.get<bool>("activation_checkpointing", false);
  c.loss_chunk_tokens = r.get_in("loss_chunk_tokens", 0, 0, INT32_MAX);
  NanPolicyConfig& np = c.nan_policy;
  np.max_consecutive_skips = r.get_in("max_consecutive_skipped_steps", np.max_consecutive_skips, 0, kMaxSteps);
  np.spike_factor = r.get<double>("loss_spike_factor", np.spike_factor);
  if (!(np.spike_factor == 0 || np.spike_factor > 1))
    r.fail("loss_spike_factor",
           str_cat("is ", np.spike_factor, "; give a factor > 1 (a loss above it x the recent mean), or 0: off"));
  np.spike_window = r.get_in("loss_spike_window", np.spike_window, 1, 1 << 20);
  c.z_loss = r.get<float>("z_loss", 0.0f);
  if (!(c.z_loss >= 0.0f)) r.fail("z_loss", str_cat("is ", c.z_loss, "; a z-loss coefficient must be >= 0 (0: off)"));
  // Either a value or "auto" (the memory planner decides); any other string is named.
  const auto is_auto = [&](const char* key, const char* choices) {
    if (!r.has(key) || !r.raw()[key].is_string()) return false;
    const std::string v = r.raw()[key].get<std::string>();
    if (v != "auto")
      r.fail(key, str_cat("is '", v, "'; choose ", choices, " or \"auto\" (the memory planner decides)"));
    r.accept(key);
    return true;
  };
  c.offload_checkpoints_auto = is_auto("activation_offload", "true, false");
  if (!c.offload_checkpoints_auto) c.offload_checkpoints = r.get<bool>("activation_offload", false);
  c.mlp_tile_auto = is_auto("mlp_tile_tokens", "a token count (0: untiled)");
  if (!c.mlp_tile_auto) c.mlp_tile_tokens = r.get_in("mlp_tile_tokens", 0, 0, INT32_MAX);
  if (c.offload_checkpoints && !c.activation_checkpointing)
    r.fail("activation_offload", "is true but train.activation_checkpointing is false: only checkpoints are offloaded");
  if (c.peak_tflops < 0) r.fail("peak_tflops", "must not be negative");
  if (r.has("weight_decay_exclude")) {
    c.decay.exclude = r.get<std::vector<std::string>>("weight_decay_exclude", {});
    c.decay.exclude_given = true;
  }
  c.decay.decay_embeddings = r.get<bool>("decay_embeddings", c.decay.decay_embeddings);
  c.collective_timeout_s = r.get<double>("collective_timeout_s", c.collective_timeout_s);
  if (!(c.collective_timeout_s >= 0 && c.collective_timeout_s <= 1e7))
    r.fail("collective_timeout_s",
           str_cat("is ", c.collective_timeout_s, "; must be seconds in [0, 1e7] (0: no limit)"));
  r.finish();
}

// DeepSpeed's csv_monitor and tensorboard sections (deepspeed/monitor/config.py: enabled,
// output_path, job_name); any other key is refused by name.
void parse_monitor(JsonReader r, MonitorConfig& m) {
  m.enabled = r.get<bool>("enabled", m.enabled);
  m.output_path = r.get<std::string>("output_path", m.output_path);
  m.job_name = r.get<std::string>("job_name", m.job_name);
  if (m.job_name.empty()) r.fail("job_name", "is empty; it names the directory the monitor's files go to");
  r.finish();
}

// DeepSpeed's wandb section: enabled, group, team, project (deepspeed/monitor/config.py).
void parse_wandb(JsonReader r, WandbConfig& w) {
  w.enabled = r.get<bool>("enabled", w.enabled);
  w.group = r.get<std::string>("group", w.group);
  w.team = r.get<std::string>("team", w.team);
  w.project = r.get<std::string>("project", w.project);
  r.finish();
}

// DeepSpeed's Comet monitor writes what so_train cannot: a section that leaves it off (DeepSpeed's
// default) is accepted, its keys checked; one that turns it on is refused.
void parse_comet(JsonReader r) {
  if (r.get<bool>("enabled", false))
    r.fail("enabled",
           "is true; so_train does not write Comet experiments (it writes tensorboard and csv_monitor "
           "files, and scripts/wandb_log.py logs to wandb), so comet must stay disabled");
  for (const char* k : {"samples_log_interval", "project", "workspace", "api_key", "experiment_name", "experiment_key",
                        "online", "mode"})
    r.accept(k);
  r.finish();
}

// DeepSpeed's FLOPs profiler: its per-module profile is not written; the step line's TFLOP/s and
// MFU answer what it is used for. Its keys are checked by name.
bool parse_flops_profiler(JsonReader r) {
  const bool enabled = r.get<bool>("enabled", false);
  for (const char* k :
       {"recompute_fwd_factor", "profile_step", "module_depth", "top_modules", "detailed", "output_file"})
    r.accept(k);
  r.finish();
  return enabled;
}

void parse_backend(JsonReader r, RunConfig& c) {
  c.backend.type = r.get<std::string>("type", "auto");
  if (c.backend.type != "auto" && c.backend.type != "cpu" && c.backend.type != "cuda")
    r.fail("type", "is '" + c.backend.type + "'; supported: auto, cpu, cuda");
  const int64_t mb = r.get_in("device_memory_limit_mb", 0, 0, int64_t{1} << 40);
  c.backend.device_memory_limit = static_cast<size_t>(mb) << 20;
  c.backend.compute_threads = static_cast<int>(r.get_in("threads", 0, 0, 65536));
  c.backend.attention = r.get<std::string>("attention", "auto");
  if (c.backend.attention != "auto" && c.backend.attention != "cudnn" && c.backend.attention != "flash")
    r.fail("attention", "is '" + c.backend.attention + "'; supported: auto, cudnn, flash");
  c.backend.deterministic_attention = r.get<bool>("deterministic_attention", false);
  r.finish();
}

}  // namespace

BatchSizes resolve_batch_sizes(const RunConfig& cfg, int64_t dp) {
  SO_CHECK(dp >= 1, "data-parallel size ", dp);
  int64_t tb = cfg.train_batch_size, mb = cfg.micro_batch, ga = cfg.grad_accum;
  const auto describe = [&] {
    return str_cat("train_batch_size ", tb ? std::to_string(tb) : "(absent)", ", train_micro_batch_size_per_gpu ",
                   mb ? std::to_string(mb) : "(absent)", ", gradient_accumulation_steps ",
                   ga ? std::to_string(ga) : "(absent)", ", data-parallel size ", dp,
                   " (ranks / sequence_parallel_size)");
  };
  // tb must split into dp x `by` x something whole; returns the something.
  const auto split = [&](int64_t by, const char* derived) {
    int64_t unit = 0;
    SO_CHECK(!__builtin_mul_overflow(by, dp, &unit) && tb % unit == 0, cfg.source, ": ", describe(), ": ", derived,
             " cannot be derived: train_batch_size is not a multiple of ", by, " x ", dp);
    return tb / unit;
  };
  BatchSizes b;
  if (tb && mb && ga) {
  } else if (tb && mb) {
    ga = split(mb, "gradient_accumulation_steps"), b.derived = "gradient_accumulation_steps";
  } else if (tb && ga) {
    mb = split(ga, "train_micro_batch_size_per_gpu"), b.derived = "train_micro_batch_size_per_gpu";
  } else if (tb) {
    ga = 1, mb = split(1, "train_micro_batch_size_per_gpu"), b.derived = "train_micro_batch_size_per_gpu";
  } else {
    if (!mb) mb = 1, b.derived = "train_micro_batch_size_per_gpu (default 1)";
    if (!ga) ga = 1;
    SO_CHECK(!__builtin_mul_overflow(mb * ga, dp, &tb) && tb <= kMaxBatch, cfg.source, ": ", describe(),
             ": the global batch is over ", kMaxBatch, " sequences");
    b.derived += b.derived.empty() ? "train_batch_size" : " and train_batch_size";
  }
  int64_t product = 0;
  SO_CHECK(!__builtin_mul_overflow(mb * ga, dp, &product) && product == tb, cfg.source, ": ", describe(),
           ": they disagree: train_batch_size must equal micro x accumulation x data-parallel size = ", mb, " x ", ga,
           " x ", dp, " = ", product);
  b.micro = mb, b.accumulation = ga, b.global = tb;
  return b;
}

RunConfig parse_run_config(const nlohmann::json& doc, const std::string& source) {
  RunConfig c;
  c.source = source;
  c.resolved = doc;
  JsonReader r(doc, source);
  c.seed = static_cast<uint64_t>(r.get<int64_t>("seed", 1234));
  // Batch sizes as given (0 = absent); resolve_batch_sizes completes them once dp is known.
  c.micro_batch = r.get_in("train_micro_batch_size_per_gpu", 0, 1, kMaxBatch);
  c.grad_accum = r.get_in("gradient_accumulation_steps", 0, 1, kMaxBatch);
  c.train_batch_size = r.get_in("train_batch_size", 0, 1, kMaxBatch);
  c.sequence_parallel_size = static_cast<int>(r.get_in("sequence_parallel_size", 1, 1, 1 << 20));
  c.grad_clip = r.get<float>("gradient_clipping", 0.0f);
  if (c.grad_clip < 0) r.fail("gradient_clipping", "must not be negative");  // (get<float> refused a non-float)
  c.log_every = r.get_in("steps_per_print", c.log_every, 1, kMaxSteps);
  {
    JsonReader bf = r.child("bf16");
    c.dtype = bf.get<bool>("enabled", false) ? DType::BF16 : DType::F32;
    bf.finish();
  }
  if (r.has("fp16")) {
    JsonReader fp = r.child("fp16");
    if (fp.get<bool>("enabled", false)) fp.fail("enabled", "is true; fp16 is not supported, use bf16.enabled");
    fp.finish();
  }
  r.accept("wall_clock_breakdown");
  parse_optimizer(r.child("optimizer"), c);
  if (r.has("scheduler")) parse_scheduler(r.child("scheduler"), c);
  parse_zero(r.child("zero_optimization"), c);
  if (!r.has("model"))
    r.fail("model",
           "is missing (DeepSpeed configs have none): give so_train --model HF_DIR|config.json, or "
           "model.config (an HF config.json), model.hf_dir or model.inline in the config");
  parse_model(r.child("model"), c);
  if (c.model.moe.aux_loss && c.sequence_parallel_size > 1)
    r.fail("sequence_parallel_size", str_cat("is ", c.sequence_parallel_size,
                                             " and the model's output_router_logits is "
                                             "true: the load-balancing loss needs the whole micro-batch's router "
                                             "statistics and each rank holds part of every sequence; use 1"));
  if (!r.has("data"))
    r.fail("data",
           "is missing (DeepSpeed configs have none): give so_train --data FILE --seq-len N, or a data "
           "section in the config");
  parse_data(r.child("data"), c);
  parse_train(r.child("train"), c);
  // LRRangeTest's lr grows without end: it must stay finite as a float through the run's last step
  // (through the most steps a run can take when its epochs decide them).
  if (c.schedule.type == "LRRangeTest") {
    const int64_t last = c.steps > 0 ? c.steps : kMaxSteps;
    if (!float_finite(c.schedule.lr_at(last)))
      r.fail("scheduler.params.lr_range_test_step_rate",
             str_cat("is ", c.schedule.range_step_rate, ": with lr_range_test_min_lr ", c.schedule.range_min_lr,
                     " and lr_range_test_step_size ", c.schedule.range_step_size, " the lr reaches ",
                     c.schedule.lr_at(last), " by step ", last, ", past a 32-bit float"));
  }
  parse_backend(r.child("backend"), c);
  if (r.has("csv_monitor")) parse_monitor(r.child("csv_monitor"), c.csv_monitor);
  if (r.has("tensorboard")) parse_monitor(r.child("tensorboard"), c.tensorboard);
  if (r.has("wandb")) parse_wandb(r.child("wandb"), c.wandb);
  if (r.has("comet")) parse_comet(r.child("comet"));
  if (r.has("flops_profiler")) c.flops_profiler = parse_flops_profiler(r.child("flops_profiler"));
  r.finish();

  if (c.data.type == "text" && c.model.vocab_size < kByteVocabSize)
    r.fail("model",
           str_cat("vocab_size is ", c.model.vocab_size, " but byte-level text data needs at least ", kByteVocabSize));
  try {  // the patterns against this model's parameter names, before anything is allocated
    decay_groups(ParamLayout::for_model(c.model), c.decay, c.adam.weight_decay);
  } catch (const Error& e) {
    r.fail("train.weight_decay_exclude", e.what());
  }
  if (c.data.seq_len > c.model.max_position_embeddings)
    r.fail("data.seq_len", str_cat("(", c.data.seq_len, ") exceeds the model's max_position_embeddings (",
                                   c.model.max_position_embeddings, ")"));
  return c;
}

}  // namespace so
