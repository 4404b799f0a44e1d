#include "so/train/run_config.h"

#include <filesystem>

#include "so/core/error.h"
#include "so/optim/simd_isa.h"
#include "so/core/json_reader.h"
#include "so/data/token_source.h"

namespace so {

nlohmann::json load_json_file(const std::string& path) { return read_json_file(path, "config file"); }

void apply_override(nlohmann::json& doc, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  SO_CHECK(eq != std::string::npos && eq > 0, "--set '", assignment, "' must look like key.path=value");
  const std::string path = assignment.substr(0, eq), text = assignment.substr(eq + 1);
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
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

void parse_optimizer(JsonReader r, RunConfig& c) {
  const std::string type = r.get<std::string>("type", "AdamW");
  // DeepSpeed's "Adam" defaults to adam_w_mode (decoupled decay): both mean AdamW here.
  if (type != "AdamW" && type != "Adam") r.fail("type", "is '" + type + "'; supported: AdamW, Adam (AdamW mode)");
  JsonReader p = r.child("params");
  c.schedule.base_lr = p.get<double>("lr", 1e-3);
  const auto betas = p.get<std::vector<double>>("betas", {0.9, 0.999});
  if (betas.size() != 2) p.fail("betas", "must have two elements");
  for (double b : betas)
    if (b < 0.0 || b >= 1.0) p.fail("betas", "must lie in [0, 1)");
  c.adam.beta1 = static_cast<float>(betas[0]);
  c.adam.beta2 = static_cast<float>(betas[1]);
  c.adam.eps = p.get<float>("eps", 1e-8f);
  c.adam.weight_decay = p.get<float>("weight_decay", 0.0f);
  if (!p.get<bool>("adam_w_mode", true)) p.fail("adam_w_mode", "false (L2-coupled Adam) is not supported");
  p.accept("torch_adam");
  if (c.schedule.base_lr < 0) p.fail("lr", "must not be negative");
  if (c.adam.eps <= 0) p.fail("eps", "must be positive");
  if (c.adam.weight_decay < 0) p.fail("weight_decay", "must not be negative");
  p.finish();
  r.finish();
}

void parse_scheduler(JsonReader r, RunConfig& c) {
  LrSchedule& s = c.schedule;
  s.type = r.require<std::string>("type");
  if (s.type != "WarmupLR" && s.type != "WarmupCosineLR" && s.type != "WarmupDecayLR")
    r.fail("type", "is '" + s.type + "'; supported: WarmupLR, WarmupCosineLR, WarmupDecayLR");
  JsonReader p = r.child("params");
  s.warmup_steps = p.get<int64_t>("warmup_num_steps", 1000);
  s.warmup_type = p.get<std::string>("warmup_type", "log");
  if (s.warmup_type != "log" && s.warmup_type != "linear") p.fail("warmup_type", "must be 'log' or 'linear'");
  if (s.warmup_steps < 0) p.fail("warmup_num_steps", "must not be negative");
  if (s.type == "WarmupCosineLR") {
    s.total_steps = p.require<int64_t>("total_num_steps");
    s.warmup_min_ratio = p.get<double>("warmup_min_ratio", 0.0);
    s.cos_min_ratio = p.get<double>("cos_min_ratio", 0.0001);
  } else {
    s.warmup_min_lr = p.get<double>("warmup_min_lr", 0.0);
    s.warmup_max_lr = p.get<double>("warmup_max_lr", 0.001);
    if (s.type == "WarmupDecayLR") s.total_steps = p.require<int64_t>("total_num_steps");
  }
  if (s.type != "WarmupLR" && s.total_steps < s.warmup_steps)
    p.fail("total_num_steps", "is smaller than warmup_num_steps");
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
  off.device_tail_buckets = o.get<int64_t>("device_tail_buckets", -1);
  if (o.has("device_tail_buckets") && o.has("ratio"))
    o.fail("device_tail_buckets", "and 'ratio' both choose which buckets stay on the device; give one");
  if (o.has("device_tail_buckets") && off.device_tail_buckets < 0) o.fail("device_tail_buckets", "must not be negative");
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
  c.zero_stage = static_cast<int>(r.get<int64_t>("stage", 0));
  if (c.zero_stage < 0 || c.zero_stage > 3) r.fail("stage", "must be 0, 1, 2 or 3");
  c.bucket_size = r.get<int64_t>("sub_group_size", c.bucket_size);
  if (c.bucket_size <= 0) r.fail("sub_group_size", "must be positive");
  if (r.has("offload_optimizer")) parse_offload(r.child("offload_optimizer"), c.offload);
  // Communication-tuning knobs of DeepSpeed that do not change results; accepted as no-ops.
  for (const char* k : {"overlap_comm", "contiguous_gradients", "reduce_bucket_size", "reduce_scatter",
                        "allgather_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
                        "stage3_max_live_parameters", "stage3_max_reuse_distance",
                        "stage3_gather_16bit_weights_on_model_save", "round_robin_gradients"})
    r.accept(k);
  r.finish();
}

void parse_model(JsonReader r, RunConfig& c) {
  if (r.has("config") + r.has("inline") + r.has("hf_dir") != 1)
    r.fail("config", "give exactly one of model.config (path to an HF config.json), model.inline or model.hf_dir "
                     "(a Hugging Face model directory)");
  if (r.has("config")) {
    c.model_source = r.require<std::string>("config");
    c.model = ModelConfig::from_hf_file(c.model_source);
  } else if (r.has("hf_dir")) {
    // The weights are read by the trainer (load_hf_weights), after the engine exists.
    c.init_hf_dir = r.require<std::string>("hf_dir");
    if (!std::filesystem::is_directory(c.init_hf_dir)) r.fail("hf_dir", "names '" + c.init_hf_dir + "', which is not a directory");
    c.model_source = c.init_hf_dir;
    c.model = ModelConfig::from_hf_file((std::filesystem::path(c.init_hf_dir) / "config.json").string());
  } else {
    JsonReader in = r.child("inline");
    c.model_source = c.source + ": model.inline";
    c.model = ModelConfig::from_hf_json(in.raw(), c.model_source);
  }
  r.finish();
}

void parse_data(JsonReader r, RunConfig& c) {
  DataConfig& d = c.data;
  d.type = r.get<std::string>("type", "text");
  if (d.type != "text" && d.type != "tokens" && d.type != "hdf5" && d.type != "synthetic")
    r.fail("type", "is '" + d.type + "'; supported: text, tokens, hdf5, synthetic");
  d.seq_len = r.require<int64_t>("seq_len");
  if (d.seq_len <= 0) r.fail("seq_len", "must be positive");
  d.seed = static_cast<uint64_t>(r.get<int64_t>("seed", static_cast<int64_t>(c.seed)));
  if (d.type == "synthetic") {
    d.synthetic_tokens = r.get<int64_t>("size", d.synthetic_tokens);
  } else {
    d.path = r.require<std::string>("path");
    if (!std::filesystem::exists(d.path)) r.fail("path", "names '" + d.path + "', which does not exist");
    if (std::filesystem::is_directory(d.path)) r.fail("path", "names '" + d.path + "', which is a directory");
    if (d.type == "hdf5") d.dataset = r.get<std::string>("dataset", d.dataset);
  }
  r.finish();
}

void parse_train(JsonReader r, RunConfig& c) {
  c.steps = r.get<int64_t>("steps", c.steps);
  c.log_every = r.get<int64_t>("log_every", c.log_every);
  c.peak_tflops = r.get<double>("peak_tflops", 0.0);
  c.activation_checkpointing = r.get<bool>("activation_checkpointing", false);
  c.loss_chunk_tokens = r.get<int64_t>("loss_chunk_tokens", 0);
  if (c.steps <= 0) r.fail("steps", "must be positive");
  if (c.log_every <= 0) r.fail("log_every", "must be positive");
  if (c.peak_tflops < 0) r.fail("peak_tflops", "must not be negative");
  if (c.loss_chunk_tokens < 0) r.fail("loss_chunk_tokens", "must not be negative");
  r.finish();
}

void parse_backend(JsonReader r, RunConfig& c) {
  c.backend.type = r.get<std::string>("type", "auto");
  if (c.backend.type != "auto" && c.backend.type != "cpu" && c.backend.type != "cuda")
    r.fail("type", "is '" + c.backend.type + "'; supported: auto, cpu, cuda");
  const int64_t mb = r.get<int64_t>("device_memory_limit_mb", 0);
  if (mb < 0) r.fail("device_memory_limit_mb", "must not be negative");
  c.backend.device_memory_limit = static_cast<size_t>(mb) << 20;
  c.backend.compute_threads = static_cast<int>(r.get<int64_t>("threads", 0));
  if (c.backend.compute_threads < 0) r.fail("threads", "must not be negative");
  r.finish();
}

}  // namespace

RunConfig parse_run_config(const nlohmann::json& doc, const std::string& source) {
  RunConfig c;
  c.source = source;
  c.resolved = doc;
  JsonReader r(doc, source);
  c.seed = static_cast<uint64_t>(r.get<int64_t>("seed", 1234));
  c.micro_batch = r.get<int64_t>("train_micro_batch_size_per_gpu", 1);
  c.grad_accum = r.get<int64_t>("gradient_accumulation_steps", 1);
  if (c.micro_batch <= 0) r.fail("train_micro_batch_size_per_gpu", "must be positive");
  if (c.grad_accum <= 0) r.fail("gradient_accumulation_steps", "must be positive");
  // Must be micro x accumulation x the data-parallel size: the multiple is checked here, the
  // size itself once the job's world is known (trainer).
  c.train_batch_size = r.get<int64_t>("train_batch_size", 0);
  if (r.has("train_batch_size") && (c.train_batch_size <= 0 || c.train_batch_size % (c.micro_batch * c.grad_accum)))
    r.fail("train_batch_size", str_cat("is ", c.train_batch_size, "; it must be a positive multiple of ",
                                       "train_micro_batch_size_per_gpu x gradient_accumulation_steps = ",
                                       c.micro_batch * c.grad_accum, " (times the data-parallel size)"));
  c.sequence_parallel_size = static_cast<int>(r.get<int64_t>("sequence_parallel_size", 1));
  if (c.sequence_parallel_size < 1) r.fail("sequence_parallel_size", "must be at least 1");
  c.grad_clip = r.get<float>("gradient_clipping", 0.0f);
  if (c.grad_clip < 0) r.fail("gradient_clipping", "must not be negative");
  c.log_every = r.get<int64_t>("steps_per_print", c.log_every);
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
  if (!r.has("model")) r.fail("model", "is required (model.config: path to an HF config.json, model.inline or model.hf_dir)");
  parse_model(r.child("model"), c);
  if (!r.has("data")) r.fail("data", "is required");
  parse_data(r.child("data"), c);
  parse_train(r.child("train"), c);
  parse_backend(r.child("backend"), c);
  r.finish();

  if (c.data.type == "text" && c.model.vocab_size < kByteVocabSize)
    r.fail("model", str_cat("vocab_size is ", c.model.vocab_size, " but byte-level text data needs at least ",
                            kByteVocabSize));
  if (c.data.seq_len > c.model.max_position_embeddings)
    r.fail("data.seq_len", str_cat("(", c.data.seq_len, ") exceeds the model's max_position_embeddings (",
                                   c.model.max_position_embeddings, ")"));
  return c;
}

}  // namespace so
