#include "so/model/decoder_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <set>

#include "so/core/error.h"

namespace so {

namespace {
void* at(void* p, int64_t elems, DType dt) { return static_cast<char*>(p) + elems * dtype_size(dt); }
// An optional parameter (a bias the family may not have): null when absent.
void* weight_or_null(ParamStore& p, int id) { return id < 0 ? nullptr : p.weight(id); }
void* grad_or_null(ParamStore& p, int id) { return id < 0 ? nullptr : p.grad(id); }

MoeSpec moe_spec(const ModelConfig& cfg, DType dt) {
  MoeSpec spec;
  const bool gpt_oss = cfg.moe.style == ModelConfig::Moe::Style::GptOss;
  spec.routing.kind = gpt_oss ? MoeRouting::Kind::TopKSoftmax : MoeRouting::Kind::SoftmaxTopK;
  spec.experts = gpt_oss ? MoeSpec::Experts::GptOssGLU : MoeSpec::Experts::SwiGLU;
  spec.glu_alpha = static_cast<float>(cfg.moe.glu_alpha);
  spec.glu_limit = static_cast<float>(cfg.moe.glu_limit);
  spec.routing.experts = cfg.moe.experts;
  spec.routing.top_k = cfg.moe.top_k;
  spec.routing.normalize = cfg.moe.normalize;
  spec.routing.weight_dtype = dt;
  spec.hidden = cfg.hidden_size;
  spec.intermediate = cfg.moe.intermediate;
  return spec;
}

// MoE blocks a model holds: one per MoE layer, or one shared when checkpointing (each layer's
// forward is recomputed right before its backward, so one layer's routing is alive at a time).
int64_t moe_blocks(const ModelConfig& cfg, const ModelOptions& opts) {
  int64_t n = 0;
  for (int64_t l = 0; l < cfg.num_layers; ++l) n += cfg.is_moe_layer(l);
  return opts.activation_checkpointing ? std::min<int64_t>(n, 1) : n;
}
}  // namespace

// Everything one layer's backward needs from its forward. With activation checkpointing a
// single set is reused: backward recomputes the layer's forward into it first.
struct DecoderModel::LayerActs {
  DeviceBuffer h1, rstd1, q_raw, q_rstd, k_raw, k_rstd, q, k, v, attn, lse, x_mid, h2, rstd2;
  DeviceBuffer gate_up;                // untiled MLP only: [T, 2I], each row gate | up; kept for backward
  DeviceBuffer q_f, k_f, v_f, attn_f;  // Ulysses: whole sequence, this rank's heads (lse is lse_f then)
};

struct DecoderModel::Activations {
  DeviceBuffer tokens, targets, positions;  // int32 [T]
  // int32 [B * S * P]: the batch's doc_start for whole rows (under Ulysses attention sees every
  // token of a row); valid when `documents` (this batch has packed rows).
  DeviceBuffer doc_start;
  bool documents = false;
  int64_t document_count = 0, longest_document = 0;  // of doc_start, counted on the host (AttentionMask)
  DeviceBuffer key_end;                              // int32 [B]: the batch's padding_start; valid when `padded`
  bool padded = false;
  DeviceBuffer rope_inv_freq;  // fp64 [head_dim / 2], the model's RoPE table
  DeviceBuffer ones;           // [T] of 1 in dtype: bias GEMMs (families with biases)
  // Residual stream: x[l] is layer l's input, x[L] the last output. Offloaded checkpoints: two
  // slots (layer l's input in x[l % 2]) and x[2], where a recompute writes its unused output.
  std::vector<DeviceBuffer> x;
  std::vector<LayerActs> layer;      // per layer, or one set when checkpointing
  DeviceBuffer hn, rstd_final, dhn;  // final norm output and its gradient
  // One chunk's fp32 logits [C, V]; the logit gradients of one weight-gradient group [G, V] in
  // dtype (G a multiple of C, or all tokens), turned into dhn and lm_head's gradient by one GEMM each.
  DeviceBuffer logits, dlogits;
  DeviceBuffer gate_up_t;            // tiled MLP: one tile's gate | up [tile, 2I], recomputed in backward
  DeviceBuffer act, dact, dgate_up;  // MLP scratch [tile, I], [tile, I], [tile, 2I]
  DeviceBuffer dx, dh, dq, dk, dv, dattn, dq_raw, dk_raw;
  // [T, q + 2 kv], each row q | k | v: the one projection GEMM's output in forward (split into the
  // layer's q, k, v), the gathered q, k, v gradients in backward (one GEMM each for dh and the weights).
  DeviceBuffer qkv;
  DeviceBuffer branch;  // residual dropout: a branch's output, then its gradient [T, H]
  DeviceBuffer dq_f, dk_f, dv_f, dattn_f, kv_rep, a2a_send, a2a_recv;  // Ulysses scratch
  DeviceBuffer loss;                                                   // fp32 accumulator
  TokenBatch staged;                                                   // host copy being uploaded
  std::unique_ptr<Event> uploaded;
  int64_t chunk = 0, grad_chunk = 0;
  // Offloaded checkpoints: layer l's input at host[l * T * H]; per device slot, the event of its
  // last D2H (stash) and of its last H2D (fetch).
  HostBuffer host;
  std::unique_ptr<Event> stashed[2], fetched[2], compute_here;
};

const char* activation_term_name(ActivationTerm t) {
  switch (t) {
    case ActivationTerm::Inputs: return "token ids, targets, positions";
    case ActivationTerm::Checkpoints: return "residual stream (layer inputs)";
    case ActivationTerm::LayerWorkingSet: return "layer tensors kept for backward";
    case ActivationTerm::Mlp: return "MLP [tokens x intermediate]";
    case ActivationTerm::Ulysses: return "Ulysses head slices + all-to-all buffers";
    case ActivationTerm::LossChunk: return "final norm + logits chunk";
    case ActivationTerm::BackwardScratch: return "backward gradients of one layer";
  }
  return "?";
}

namespace {
// Ulysses with more ranks than KV heads: copies of each KV head sent.
int64_t kv_copies_for(const ModelConfig& cfg, int64_t P) { return P > cfg.num_kv_heads ? P / cfg.num_kv_heads : 1; }
}  // namespace

DecoderModel::LossChunks DecoderModel::loss_chunks(const ModelConfig& cfg, const ModelOptions& opts) {
  // Fixed byte budgets, whatever the vocabulary: the fp32 logits of one chunk at most 128 MiB, the
  // logit gradients one weight-gradient GEMM reads at most 512 MiB (at V = 32000 and bf16: 1048-row
  // chunks, and 8384 tokens per lm_head gradient GEMM, so a 4096-token micro-batch makes one).
  constexpr int64_t kLogitsBudget = int64_t{128} << 20, kGradBudget = int64_t{512} << 20;
  const int64_t T = opts.micro_batch * opts.seq_len, V = cfg.vocab_size;
  const int64_t e = static_cast<int64_t>(dtype_size(opts.dtype));
  LossChunks c;
  c.chunk =
      std::min(T, opts.loss_chunk_tokens > 0 ? opts.loss_chunk_tokens : std::max<int64_t>(1, kLogitsBudget / (V * 4)));
  const int64_t grad =
      opts.loss_grad_chunk_tokens > 0 ? opts.loss_grad_chunk_tokens : kGradBudget / (V * e) / c.chunk * c.chunk;
  c.grad_chunk = std::min(T, std::max(c.chunk, grad));
  return c;
}

int64_t DecoderModel::mlp_tile(const ModelOptions& opts) {
  const int64_t T = opts.micro_batch * opts.seq_len;
  return opts.mlp_tile_tokens > 0 ? std::min(opts.mlp_tile_tokens, T) : T;
}

size_t DecoderModel::host_checkpoint_bytes(const ModelConfig& cfg, const ModelOptions& opts) {
  if (!opts.offload_checkpoints) return 0;
  return static_cast<size_t>(cfg.num_layers * opts.micro_batch * opts.seq_len * cfg.hidden_size) *
         dtype_size(opts.dtype);
}

template <class Visit>
void DecoderModel::layout_buffers(Activations& a, const ModelConfig& cfg, const ModelOptions& opts, int64_t P,
                                  Visit&& visit) {
  const size_t e = dtype_size(opts.dtype), f32 = sizeof(float), i32 = sizeof(int32_t);
  const auto bytes = [](int64_t n, size_t elem) { return static_cast<size_t>(n) * elem; };
  const int64_t T = opts.micro_batch * opts.seq_len, H = cfg.hidden_size, I = cfg.intermediate_size;
  const int64_t qd = cfg.q_dim(), kvd = cfg.kv_dim(), V = cfg.vocab_size, M = mlp_tile(opts);
  const bool tiled = M < T;
  // Ulysses: P ranks hold 1/P of every sequence; attention runs on all tokens for Hq/P heads, and
  // on max(1, Hkv/P) KV heads (replicated when P exceeds the KV-head count).
  const int64_t kv_sent = T * cfg.num_kv_heads * kv_copies_for(cfg, P) * cfg.head_dim;
  using Term = ActivationTerm;
  visit(a.tokens, bytes(T, i32), "tokens", Term::Inputs);
  visit(a.targets, bytes(T, i32), "targets", Term::Inputs);
  visit(a.positions, bytes(T, i32), "positions", Term::Inputs);
  visit(a.doc_start, bytes(T * P, i32), "document starts (whole rows)", Term::Inputs);
  visit(a.key_end, bytes(opts.micro_batch, i32), "padding starts", Term::Inputs);
  visit(a.rope_inv_freq, bytes(cfg.head_dim / 2, sizeof(double)), "rope frequencies", Term::Inputs);
  if (cfg.qkv_bias || cfg.o_bias) visit(a.ones, bytes(T, e), "ones (bias GEMMs)", Term::Inputs);
  a.x.resize(opts.offload_checkpoints ? 3 : static_cast<size_t>(cfg.num_layers + 1));
  for (DeviceBuffer& x : a.x) visit(x, bytes(T * H, e), "residual stream", Term::Checkpoints);
  a.layer.resize(opts.activation_checkpointing ? 1 : static_cast<size_t>(cfg.num_layers));
  for (LayerActs& s : a.layer) {
    const Term keep = Term::LayerWorkingSet;
    visit(s.h1, bytes(T * H, e), "attn norm out", keep);
    visit(s.rstd1, bytes(T, f32), "attn norm rstd", keep);
    if (cfg.qk_norm) {
      visit(s.q_raw, bytes(T * qd, e), "q before norm", keep);
      visit(s.q_rstd, bytes(T * cfg.num_heads, f32), "q norm rstd", keep);
      visit(s.k_raw, bytes(T * kvd, e), "k before norm", keep);
      visit(s.k_rstd, bytes(T * cfg.num_kv_heads, f32), "k norm rstd", keep);
    }
    visit(s.q, bytes(T * qd, e), "q", keep);
    visit(s.k, bytes(T * kvd, e), "k", keep);
    visit(s.v, bytes(T * kvd, e), "v", keep);
    visit(s.attn, bytes(T * qd, e), "attention out", keep);
    visit(s.lse, bytes(T * cfg.num_heads, f32), "attention lse", keep);
    if (P > 1) {
      visit(s.q_f, bytes(T * qd, e), "q (all tokens, local heads)", Term::Ulysses);
      visit(s.k_f, bytes(kv_sent, e), "k (all tokens, local heads)", Term::Ulysses);
      visit(s.v_f, bytes(kv_sent, e), "v (all tokens, local heads)", Term::Ulysses);
      visit(s.attn_f, bytes(T * qd, e), "attention out (all tokens, local heads)", Term::Ulysses);
    }
    visit(s.x_mid, bytes(T * H, e), "residual after attention", keep);
    visit(s.h2, bytes(T * H, e), "mlp norm out", keep);
    visit(s.rstd2, bytes(T, f32), "mlp norm rstd", keep);
    if (!tiled) {
      visit(s.gate_up, bytes(T * 2 * I, e), "mlp gate|up", Term::Mlp);
    }
  }
  visit(a.hn, bytes(T * H, e), "final norm out", Term::LossChunk);
  visit(a.rstd_final, bytes(T, f32), "final norm rstd", Term::LossChunk);
  visit(a.dhn, bytes(T * H, e), "final norm grad", Term::LossChunk);
  const LossChunks lc = loss_chunks(cfg, opts);
  a.chunk = lc.chunk;
  a.grad_chunk = lc.grad_chunk;
  visit(a.logits, bytes(a.chunk * V, f32), "logits chunk", Term::LossChunk);
  visit(a.dlogits, bytes(a.grad_chunk * V, e), "logits grad (one lm_head weight-gradient GEMM)", Term::LossChunk);
  if (tiled) {
    visit(a.gate_up_t, bytes(M * 2 * I, e), "mlp gate|up tile", Term::Mlp);
  }
  visit(a.act, bytes(M * I, e), "mlp activation", Term::Mlp);
  visit(a.dact, bytes(M * I, e), "mlp activation grad", Term::Mlp);
  visit(a.dgate_up, bytes(M * 2 * I, e), "mlp gate|up grad", Term::Mlp);
  const Term scratch = Term::BackwardScratch;
  visit(a.dx, bytes(T * H, e), "residual grad", scratch);
  visit(a.dh, bytes(T * H, e), "norm out grad", scratch);
  if (cfg.residual_dropout > 0) visit(a.branch, bytes(T * H, e), "residual branch (dropout)", scratch);
  visit(a.dq, bytes(T * qd, e), "q grad", scratch);
  visit(a.dk, bytes(T * kvd, e), "k grad", scratch);
  visit(a.dv, bytes(T * kvd, e), "v grad", scratch);
  visit(a.dattn, bytes(T * qd, e), "attention out grad", scratch);
  visit(a.qkv, bytes(T * (qd + 2 * kvd), e), "q|k|v rows (projection, then its gradient)", scratch);
  if (cfg.qk_norm) {
    visit(a.dq_raw, bytes(T * qd, e), "q before norm grad", scratch);
    visit(a.dk_raw, bytes(T * kvd, e), "k before norm grad", scratch);
  }
  if (P > 1) {
    visit(a.dq_f, bytes(T * qd, e), "q grad (all tokens, local heads)", Term::Ulysses);
    visit(a.dattn_f, bytes(T * qd, e), "attention out grad (all tokens, local heads)", Term::Ulysses);
    visit(a.dk_f, bytes(kv_sent, e), "k grad (all tokens, local heads)", Term::Ulysses);
    visit(a.dv_f, bytes(kv_sent, e), "v grad (all tokens, local heads)", Term::Ulysses);
    if (kv_copies_for(cfg, P) > 1) visit(a.kv_rep, bytes(kv_sent, e), "replicated kv heads", Term::Ulysses);
    visit(a.a2a_send, bytes(std::max(T * qd, kv_sent), e), "all-to-all send", Term::Ulysses);
    visit(a.a2a_recv, bytes(std::max(T * qd, kv_sent), e), "all-to-all receive", Term::Ulysses);
  }
  visit(a.loss, bytes(1, f32), "loss", Term::Inputs);
}

std::vector<ActivationBuffer> DecoderModel::activation_buffers(const ModelConfig& cfg, const ModelOptions& opts,
                                                               int64_t sp_size) {
  std::vector<ActivationBuffer> out;
  Activations a;
  layout_buffers(a, cfg, opts, sp_size, [&](DeviceBuffer&, size_t bytes, const char* tag, ActivationTerm term) {
    out.push_back({tag, term, bytes});
  });
  // The MoE blocks' buffers: each block's kept set, and one backward scratch.
  const int64_t blocks = moe_blocks(cfg, opts);
  if (blocks > 0)
    for (const MoeBuffer& b : MoeBlock::buffers(moe_spec(cfg, opts.dtype), opts.micro_batch * opts.seq_len, opts.dtype))
      for (int64_t i = 0; i < (b.kept ? blocks : 1); ++i)
        out.push_back({b.tag, b.kept ? ActivationTerm::LayerWorkingSet : ActivationTerm::BackwardScratch, b.bytes});
  return out;
}

DecoderModel::DecoderModel(Backend& backend, const ModelConfig& cfg, const ModelOptions& opts)
    : backend_(backend),
      ops_(backend.ops()),
      stream_(backend.stream(StreamKind::Compute)),
      cfg_(cfg),
      opts_(opts),
      layout_(ParamLayout::for_model(cfg)),
      acts_(std::make_unique<Activations>()) {
  SO_CHECK(opts.micro_batch > 0 && opts.seq_len > 0, "model: micro_batch (", opts.micro_batch, ") and seq_len (",
           opts.seq_len, ") must be positive");
  SO_CHECK(opts.mlp_tile_tokens >= 0, "model: mlp_tile_tokens (", opts.mlp_tile_tokens, ") must not be negative");
  SO_CHECK(!opts.offload_checkpoints || opts.activation_checkpointing,
           "model: offloading activation checkpoints needs activation checkpointing");
  const int64_t P = sp_size(), Hq = cfg.num_heads, Hkv = cfg.num_kv_heads;
  SO_CHECK(P == 1 || Hq % P == 0, "num_attention_heads (", Hq, ") is not divisible by sequence_parallel_size (", P,
           ")");
  SO_CHECK(P == 1 || Hkv % P == 0 || P % Hkv == 0, "num_key_value_heads (", Hkv, ") and sequence_parallel_size (", P,
           "): one must divide the other (KV heads are split over the ranks, or replicated)");
  kv_copies_ = kv_copies_for(cfg, P);
  // One GEMM reads [W_gate; W_up], [W_q; W_k; W_v] and [b_q; b_k; b_v] each as one matrix.
  const auto check_joined = [&](std::initializer_list<int> ids) {
    const int first = *ids.begin();
    if (first < 0) return;
    int prev = -1;
    for (int id : ids) {
      SO_CHECK(prev < 0 || (id == prev + 1 && layout_.params[prev].joined_to_next &&
                            layout_.params[id].offset == layout_.params[prev].offset + layout_.params[prev].numel),
               "model: ", layout_.params[id].name, " does not follow ", layout_.params[first].name,
               " in the flat buffer (their projections are one GEMM)");
      prev = id;
    }
  };
  for (const LayerParamIds& w : layout_.layers) {
    check_joined({w.gate, w.up});
    check_joined({w.q, w.k, w.v});
    check_joined({w.q_bias, w.k_bias, w.v_bias});
  }
  Activations& a = *acts_;
  layout_buffers(a, cfg, opts, P, [&](DeviceBuffer& b, size_t bytes, const char* tag, ActivationTerm) {
    b = backend.alloc(bytes, tag);
  });
  const RopeFrequencies rope = rope_frequencies(cfg.rope, cfg.rope_theta, cfg.head_dim);
  rope_scale_ = static_cast<float>(rope.attention_factor);
  backend.copy_h2d(a.rope_inv_freq.data(), rope.inv_freq.data(), rope.inv_freq.size() * sizeof(double), stream_);
  std::vector<char> ones;
  if (a.ones.data()) {
    const float one_f32 = 1.0f;
    const bf16 one_bf16 = f32_to_bf16(1.0f);
    const void* one = opts.dtype == DType::F32 ? static_cast<const void*>(&one_f32) : &one_bf16;
    const size_t e = dtype_size(opts.dtype);
    ones.resize(a.ones.bytes());
    for (size_t i = 0; i < ones.size(); i += e) std::memcpy(ones.data() + i, one, e);
    backend.copy_h2d(a.ones.data(), ones.data(), ones.size(), stream_);
  }
  moe_of_layer_.assign(static_cast<size_t>(cfg.num_layers), -1);
  if (const int64_t blocks = moe_blocks(cfg, opts); blocks > 0) {
    const MoeSpec spec = moe_spec(cfg, opts.dtype);
    const int64_t T = opts.micro_batch * opts.seq_len;
    for (int64_t b = 0; b < blocks; ++b) moe_.push_back(std::make_unique<MoeBlock>(backend, spec, T, opts.dtype));
    moe_scratch_ = std::make_unique<MoeScratch>(backend, spec, T, opts.dtype);
    int next = 0;
    for (int64_t l = 0; l < cfg.num_layers; ++l)
      if (cfg.is_moe_layer(l)) moe_of_layer_[l] = opts.activation_checkpointing ? 0 : next++;
  }
  if (cfg.moe.aux_loss) {
    SO_CHECK(sp_size() == 1, "model: output_router_logits with ", sp_size(),
             " sequence-parallel ranks (RunConfig refuses it)");
    const size_t E = static_cast<size_t>(cfg.moe.experts);
    aux_sums_ = backend.alloc(2 * E * sizeof(double), "load-balancing loss sums");  // zeroed
    aux_dprob_ = backend.alloc(E * sizeof(float), "load-balancing loss gradient");
  }
  if (!moe_.empty())
    expert_counts_ = backend.alloc(static_cast<size_t>(cfg.num_layers * cfg.moe.experts) * sizeof(int64_t),
                                   "tokens per expert");  // zeroed
  figures_host_ =
      HostBuffer(expert_counts_.bytes() + sizeof(float), -1, &backend, "step figures (host copy)", 0, false);
  figures_copied_ = backend.create_event();
  backend.synchronize(stream_);  // the host copies go away
  a.uploaded = backend.create_event();
  backend.record(*a.uploaded, stream_);
  if (opts.offload_checkpoints) {
    a.host = HostBuffer(host_checkpoint_bytes(cfg, opts), opts.numa_node, &backend, "activation checkpoints");
    for (auto* evs : {&a.stashed, &a.fetched})
      for (auto& e : *evs) {
        e = backend.create_event();
        backend.record(*e, stream_);
      }
    a.compute_here = backend.create_event();
  }
}

DecoderModel::~DecoderModel() {
  // Enqueued ops reference the activations: let them finish (errors were reported already).
  try {
    backend_.synchronize(stream_);
  } catch (...) {
  }
}

DecoderModel::AttentionShape DecoderModel::attention_shape(const ModelConfig& cfg, const ModelOptions& opts,
                                                           int64_t sp_size) {
  return {opts.micro_batch,
          opts.seq_len * sp_size,
          cfg.num_heads / sp_size,
          cfg.num_kv_heads * kv_copies_for(cfg, sp_size) / sp_size,
          cfg.head_dim,
          1.0f / std::sqrt(static_cast<float>(cfg.head_dim))};
}

std::vector<AttentionMask> DecoderModel::attention_mask_kinds(const ModelConfig& cfg) {
  // Only which fields are set matters to the implementation and workspace queries.
  static const int32_t kPackedRows = 0;
  std::set<int64_t> windows;
  for (int64_t l = 0; l < cfg.num_layers; ++l) windows.insert(cfg.layer_window(l));
  std::vector<AttentionMask> kinds;
  for (int64_t w : windows)
    for (const int32_t* docs : {static_cast<const int32_t*>(nullptr), &kPackedRows}) {
      AttentionMask m;
      m.doc_start = docs;
      m.key_end = docs;  // prepared rows carry both; other token streams neither
      m.window = w;
      if (cfg.attention_sinks) m.sinks = &kPackedRows;  // a placeholder too
      m.dropout.p = cfg.attention_dropout;              // training's mask (evaluation's: attention_workspace_bytes)
      kinds.push_back(m);
    }
  return kinds;
}

size_t DecoderModel::attention_workspace_bytes(Ops& ops, const ModelConfig& cfg, const ModelOptions& opts,
                                               int64_t sp_size) {
  const AttentionShape a = attention_shape(cfg, opts, sp_size);
  size_t bytes = 0;
  for (AttentionMask m : attention_mask_kinds(cfg)) {
    bytes = std::max(bytes, ops.attention_workspace_bytes(a, m, opts.dtype));
    m.dropout.p = 0.0f;  // evaluation runs without dropout, perhaps on another implementation
    bytes = std::max(bytes, ops.attention_workspace_bytes(a, m, opts.dtype));
  }
  return bytes;
}

std::string DecoderModel::attention_implementation() const {
  const AttentionShape a = attention_shape(cfg_, opts_, sp_size());
  std::string text;
  const std::vector<AttentionMask> kinds = attention_mask_kinds(cfg_);
  for (size_t i = 0; i < kinds.size(); i += 2) {  // pairs: whole rows, then packed rows
    const std::string whole = ops_.attention_implementation(a, kinds[i], opts_.dtype);
    const std::string packed = ops_.attention_implementation(a, kinds[i + 1], opts_.dtype);
    if (!text.empty()) text += "; ";
    if (kinds.size() > 2 || kinds[i].window > 0)
      text += kinds[i].window > 0 ? str_cat("sliding-window layers (", kinds[i].window, "): ") : "full layers: ";
    text += whole;
    if (packed != whole) text += str_cat(" (packed rows: ", packed, ")");
  }
  return text;
}

AttentionMask DecoderModel::attention_mask(int l, ParamStore& p) const {
  AttentionMask m;
  if (acts_->documents) {
    m.doc_start = acts_->doc_start.as<int32_t>();
    m.documents = acts_->document_count;
    m.longest_document = acts_->longest_document;
  }
  if (acts_->padded) m.key_end = acts_->key_end.as<int32_t>();
  m.window = cfg_.layer_window(l);
  const int sinks = layout_.layers[l].sinks;
  if (sinks >= 0) m.sinks = at(p.weight(sinks), sp_rank() * cfg_.num_heads / sp_size(), opts_.dtype);
  if (dropping_attention_) {  // keyed as residual dropout's masks; site 2, heads by global index
    m.dropout.p = cfg_.attention_dropout;
    m.dropout.key = dropout_key(opts_.dropout_seed, static_cast<uint64_t>(l), 2);
    m.dropout.first_sample = first_sample_;
    m.first_head = sp_rank() * cfg_.num_heads / sp_size();
  }
  return m;
}

void* DecoderModel::sinks_grad(int l, ParamStore& p) const {
  const int sinks = layout_.layers[l].sinks;
  return sinks < 0 ? nullptr : at(p.grad(sinks), sp_rank() * cfg_.num_heads / sp_size(), opts_.dtype);
}

void DecoderModel::zero_expert_tokens() {
  if (expert_counts_) backend_.memset_zero(expert_counts_.data(), expert_counts_.bytes(), stream_);
}

void DecoderModel::queue_step_figures() {
  SO_CHECK(!figures_queued_, "model: queue_step_figures while the last queued figures are unread");
  const size_t counts = expert_counts_.bytes();
  if (counts > 0) backend_.copy_d2h(figures_host_.data(), expert_counts_.data(), counts, stream_);
  backend_.copy_d2h(figures_host_.as<char>() + counts, acts_->loss.data(), sizeof(float), stream_);
  backend_.record(*figures_copied_, stream_);
  figures_queued_ = true;
}

DecoderModel::StepFigures DecoderModel::step_figures() {
  SO_CHECK(figures_queued_, "model: step_figures without queue_step_figures");
  backend_.synchronize(*figures_copied_);
  figures_queued_ = false;
  StepFigures f;
  const int64_t* counts = figures_host_.as<int64_t>();
  std::memcpy(&f.loss, figures_host_.as<char>() + expert_counts_.bytes(), sizeof(float));
  f.expert_tokens.resize(static_cast<size_t>(cfg_.num_layers));
  const int64_t E = cfg_.moe.experts;
  if (expert_counts_)
    for (int64_t l = 0; l < cfg_.num_layers; ++l)
      if (moe_of_layer_[l] >= 0) f.expert_tokens[static_cast<size_t>(l)].assign(counts + l * E, counts + (l + 1) * E);
  return f;  // the load-balancing loss included (aux_loss_forward)
}

void DecoderModel::zero_loss() { backend_.memset_zero(acts_->loss.data(), sizeof(float), stream_); }

float DecoderModel::read_loss() {
  float loss = 0.0f;
  backend_.copy_d2h(&loss, acts_->loss.data(), sizeof(float), stream_);
  backend_.synchronize(stream_);
  return loss;  // the load-balancing loss included (aux_loss_forward)
}

// transformers' load_balancing_loss_func without an attention mask: over the N = layers x T
// (token, MoE layer) rows, E * sum_e (selections of e / N) * (router probability of e summed / N),
// times router_aux_loss_coef. The loss is a mean over the step's tokens (loss_scale = 1 / their
// count), so each micro-batch's aux loss enters weighted by its share of them (loss_scale * T): the
// step's value is the mean of its micro-batches' (and data-parallel ranks') aux losses.
void DecoderModel::aux_loss_forward(float loss_scale) {
  const int64_t T = opts_.micro_batch * opts_.seq_len, E = cfg_.moe.experts;
  int64_t layers = 0;
  for (int64_t l = 0; l < cfg_.num_layers; ++l) layers += moe_of_layer_[l] >= 0;
  MoeAuxLoss a;
  a.experts = E;
  a.rows = static_cast<double>(layers * T);
  a.weight = static_cast<double>(loss_scale) * static_cast<double>(T) * cfg_.moe.aux_loss_coef;
  double* sums = aux_sums_.as<double>();
  ops_.moe_aux_loss(stream_, a, acts_->loss.as<float>(), aux_dprob_.as<float>(), sums, sums + E);
}

const void* DecoderModel::final_hidden() const { return acts_->hn.data(); }

RmsNormShape DecoderModel::rmsnorm_shape(int64_t rows, int64_t dim) const {
  return {.rows = rows, .dim = dim, .eps = cfg_.rms_norm_eps, .dtype = opts_.dtype};
}

HeadReplication DecoderModel::kv_replication() const {
  return {.rows = opts_.micro_batch * opts_.seq_len,
          .heads = cfg_.num_kv_heads,
          .copies = kv_copies_,
          .head_dim = cfg_.head_dim,
          .dtype = opts_.dtype};
}

Rope DecoderModel::rope_of(int64_t heads) const {
  return {.T = opts_.micro_batch * opts_.seq_len,
          .heads = heads,
          .head_dim = cfg_.head_dim,
          .positions = acts_->positions.as<int32_t>(),
          .inv_freq = acts_->rope_inv_freq.as<double>(),
          .attention_scale = rope_scale_,
          .dtype = opts_.dtype};
}

void DecoderModel::linear(const void* in, const void* w, void* out, int64_t rows, int64_t out_dim, int64_t in_dim,
                          float beta, const void* bias) {
  const DType dt = opts_.dtype;
  if (bias) {
    ops_.gemm(stream_, Gemm::nn(rows, out_dim, 1, acts_->ones.data(), bias, out, dt, beta));
    beta = 1.0f;
  }
  ops_.gemm(stream_, Gemm::nt(rows, out_dim, in_dim, in, w, out, dt, beta));
}

// y = x W^T + b:  dW += dy^T x,  dx = dy W (+ din_beta * dx),  db += dy^T 1
void DecoderModel::linear_backward(const void* dout, const void* in, const void* w, void* din, void* dw, int64_t rows,
                                   int64_t out_dim, int64_t in_dim, float din_beta, void* dbias) {
  const DType dt = opts_.dtype;
  ops_.gemm(stream_, Gemm::tn(out_dim, in_dim, rows, dout, in, dw, dt, 1.0f));
  ops_.gemm(stream_, Gemm::nn(rows, in_dim, out_dim, dout, w, din, dt, din_beta));
  if (dbias) ops_.gemm(stream_, Gemm::tn(out_dim, 1, rows, dout, acts_->ones.data(), dbias, dt, 1.0f));
}

void DecoderModel::forward_backward(const TokenBatch& batch, ParamStore& p, ModelHooks& hooks, float loss_scale,
                                    bool backward) {
  Activations& a = *acts_;
  const int64_t T = opts_.micro_batch * opts_.seq_len, L = cfg_.num_layers;
  SO_CHECK(static_cast<int64_t>(batch.inputs.size()) == T && batch.targets.size() == batch.inputs.size() &&
               batch.positions.size() == batch.inputs.size(),
           "model: batch has ", batch.inputs.size(), " inputs, ", batch.targets.size(), " targets, ",
           batch.positions.size(), " positions; expected ", T, " each");
  // The previous upload must be done before its host staging copy is overwritten.
  backend_.synchronize(*a.uploaded);
  a.staged = batch;
  const size_t id_bytes = T * sizeof(int32_t);
  backend_.copy_h2d(a.tokens.data(), a.staged.inputs.data(), id_bytes, stream_);
  backend_.copy_h2d(a.targets.data(), a.staged.targets.data(), id_bytes, stream_);
  backend_.copy_h2d(a.positions.data(), a.staged.positions.data(), id_bytes, stream_);
  a.documents = !batch.doc_start.empty();
  if (a.documents) {
    const int64_t P = sp_size(), S = opts_.seq_len * P;
    SO_CHECK(static_cast<int64_t>(batch.doc_start.size()) == opts_.micro_batch * S, "model: batch has ",
             batch.doc_start.size(), " doc_start entries; expected ", opts_.micro_batch * S, " (", opts_.micro_batch,
             " whole rows of ", S, " tokens", P > 1 ? ", every sequence-parallel rank gets the whole rows" : "", ")");
    check_attention_doc_start(batch.doc_start.data(), opts_.micro_batch, S);
    const AttentionDocuments docs = count_attention_documents(batch.doc_start.data(), opts_.micro_batch, S);
    a.document_count = docs.documents;
    a.longest_document = docs.longest;
    backend_.copy_h2d(a.doc_start.data(), a.staged.doc_start.data(), batch.doc_start.size() * sizeof(int32_t), stream_);
  }
  a.padded = !batch.padding_start.empty();
  if (a.padded) {
    SO_CHECK(static_cast<int64_t>(batch.padding_start.size()) == opts_.micro_batch, "model: batch has ",
             batch.padding_start.size(), " padding starts; expected one per sequence (", opts_.micro_batch, ")");
    check_attention_key_end(batch.padding_start.data(), opts_.micro_batch, opts_.seq_len * sp_size());
    backend_.copy_h2d(a.key_end.data(), a.staged.padding_start.data(), batch.padding_start.size() * sizeof(int32_t),
                      stream_);
  }
  backend_.record(*a.uploaded, stream_);
  dropping_ = backward && cfg_.residual_dropout > 0;  // evaluation runs without dropout
  dropping_attention_ = backward && cfg_.attention_dropout > 0;
  first_sample_ = batch.first_sample;

  const bool offload = opts_.offload_checkpoints;
  hooks.before_unit(0);
  // A slot is written only after its last copy to the host (of this or the last micro-batch).
  if (offload) backend_.wait(stream_, *a.stashed[0]);
  ops_.embedding_forward(stream_, {.T = T, .V = cfg_.vocab_size, .H = cfg_.hidden_size, .dtype = opts_.dtype},
                         residual(0), p.weight(layout_.embedding), a.tokens.as<int32_t>());
  if (offload) move_checkpoint(0, true, hooks);
  for (int64_t l = 0; l < L; ++l) {
    hooks.before_unit(static_cast<int>(l) + 1);
    if (offload) backend_.wait(stream_, *a.stashed[(l + 1) % 2]);
    layer_forward(static_cast<int>(l), p, a.layer[opts_.activation_checkpointing ? 0 : l], residual(l),
                  residual(l + 1));
    if (moe_of_layer_[l] >= 0) {  // this layer's selections (and router probabilities), on the device
      const MoeBlock& block = moe_block(static_cast<int>(l));
      const int64_t E = cfg_.moe.experts;
      double* sums = cfg_.moe.aux_loss ? aux_sums_.as<double>() : nullptr;
      ops_.moe_expert_stats(stream_, expert_counts_.as<int64_t>() + l * E, sums, sums ? sums + E : nullptr,
                            block.router_logits(), block.expert_offsets(), T, E);
    }
    if (offload && l + 1 < L) move_checkpoint(l + 1, true, hooks);
  }
  if (cfg_.moe.aux_loss) aux_loss_forward(loss_scale);
  hooks.before_unit(static_cast<int>(L) + 1);
  head_forward_backward(p, loss_scale, backward);
  if (!backward) return;

  const int head_unit = static_cast<int>(L) + 1;
  ops_.rmsnorm_backward(stream_, rmsnorm_shape(T, cfg_.hidden_size),
                        {.dx = a.dx.data(), .dw_acc = p.grad(layout_.final_norm), .accumulate = false}, a.dhn.data(),
                        residual(L), p.weight(layout_.final_norm), a.rstd_final.as<float>());
  hooks.after_backward(head_unit);
  for (int64_t l = L - 1; l >= 0; --l) {
    LayerActs& acts = a.layer[opts_.activation_checkpointing ? 0 : l];
    if (opts_.activation_checkpointing) {
      // Offloaded: the next layer down's input comes back while this one recomputes and runs
      // backward (its slot's last reader, the layer above, is done). Layer L-1's input is still
      // in its slot from forward; every other one was fetched.
      if (offload && l >= 1) move_checkpoint(l - 1, false, hooks);
      if (offload && l + 1 < L) backend_.wait(stream_, *a.fetched[l % 2]);
      hooks.before_unit(static_cast<int>(l) + 1);
      layer_forward(static_cast<int>(l), p, acts, residual(l), offload ? a.x[2].data() : residual(l + 1));
    }
    hooks.before_backward(static_cast<int>(l) + 1);
    layer_backward(static_cast<int>(l), p, acts, residual(l));
    hooks.after_backward(static_cast<int>(l) + 1);
  }
  hooks.before_backward(0);
  ops_.embedding_backward(stream_, {.T = T, .V = cfg_.vocab_size, .H = cfg_.hidden_size, .dtype = opts_.dtype},
                          p.grad(layout_.embedding), a.dx.data(), a.tokens.as<int32_t>(), cfg_.pad_token_id);
  hooks.after_backward(0);
}

DropoutMask DecoderModel::residual_mask(int l, int site, int64_t row0) const {
  DropoutMask m;
  m.p = cfg_.residual_dropout;
  m.key = dropout_key(opts_.dropout_seed, static_cast<uint64_t>(l), static_cast<uint64_t>(site));
  m.first_sample = first_sample_;
  m.seq_local = opts_.seq_len;
  m.seq_global = opts_.seq_len * sp_size();
  m.seq_offset = opts_.sequence_parallel ? opts_.sequence_parallel->rank() * opts_.seq_len : 0;
  m.row0 = row0;
  return m;
}

void* DecoderModel::residual(int64_t l) {
  return acts_->x[static_cast<size_t>(opts_.offload_checkpoints ? l % 2 : l)].data();
}

// Layer l's input between its device slot and host slot l: to the host on the D2H stream, back
// on the H2D stream, either after the compute stream's work so far. The per-slot events order
// the copies against the layers that write and read the slot.
void DecoderModel::move_checkpoint(int64_t l, bool to_host, ModelHooks& hooks) {
  Activations& a = *acts_;
  const size_t bytes = host_checkpoint_bytes(cfg_, opts_) / static_cast<size_t>(cfg_.num_layers);
  Stream& s = backend_.stream(to_host ? StreamKind::D2H : StreamKind::H2D);
  backend_.record(*a.compute_here, stream_);  // a wait takes the record it sees: one event serves
  backend_.wait(s, *a.compute_here);
  // The D2H stream is in order: its last copy out of this slot also means host slot l is written.
  if (!to_host) backend_.wait(s, *a.stashed[l % 2]);
  char* host = a.host.as<char>() + l * bytes;
  hooks.copy_span(s, to_host ? "checkpoint to host" : "checkpoint from host", static_cast<int>(l), [&] {
    if (to_host)
      backend_.copy_d2h(host, residual(l), bytes, s);
    else
      backend_.copy_h2d(residual(l), host, bytes, s);
  });
  backend_.record(to_host ? *a.stashed[l % 2] : *a.fetched[l % 2], s);
}

void DecoderModel::layer_forward(int l, ParamStore& p, LayerActs& s, const void* x_in, void* x_out) {
  const LayerParamIds& w = layout_.layers[l];
  const DType dt = opts_.dtype;
  const int64_t T = opts_.micro_batch * opts_.seq_len, H = cfg_.hidden_size;
  const int64_t qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), D = cfg_.head_dim;

  ops_.rmsnorm_forward(stream_, rmsnorm_shape(T, H), s.h1.data(), s.rstd1.as<float>(), x_in, p.weight(w.attn_norm));
  // q | k | v by one GEMM with [W_q; W_k; W_v] (and [b_q; b_k; b_v]), adjacent in the flat buffer
  // (ParamInfo::joined_to_next), then split into the tensors attention reads.
  void* q = cfg_.qk_norm ? s.q_raw.data() : s.q.data();
  void* k = cfg_.qk_norm ? s.k_raw.data() : s.k.data();
  linear(s.h1.data(), p.weight(w.q), acts_->qkv.data(), T, qd + 2 * kvd, H, 0.0f, weight_or_null(p, w.q_bias));
  qkv_columns(q, k, s.v.data(), false);
  if (cfg_.qk_norm) {
    ops_.rmsnorm_forward(stream_, rmsnorm_shape(T * cfg_.num_heads, D), s.q.data(), s.q_rstd.as<float>(), q,
                         p.weight(w.q_norm));
    ops_.rmsnorm_forward(stream_, rmsnorm_shape(T * cfg_.num_kv_heads, D), s.k.data(), s.k_rstd.as<float>(), k,
                         p.weight(w.k_norm));
  }
  ops_.rope(stream_, rope_of(cfg_.num_heads), s.q.data(), false);
  ops_.rope(stream_, rope_of(cfg_.num_kv_heads), s.k.data(), false);
  const AttentionMask mask = attention_mask(l, p);
  const int64_t P = sp_size();
  const AttentionShape a = attention_shape(cfg_, opts_, P);
  if (P == 1) {
    ops_.attention_forward(stream_, a, mask, a.inputs(dt, s.q.data(), s.k.data(), s.v.data()),
                           a.query_view(s.attn.data(), dt), a.lse_view(s.lse.data()));
  } else {
    const int64_t kv_heads = cfg_.num_kv_heads * kv_copies_;
    scatter_heads(s.q_f.data(), s.q.data(), cfg_.num_heads);
    for (auto [full, local] : {std::pair{s.k_f.data(), s.k.data()}, std::pair{s.v_f.data(), s.v.data()}}) {
      if (kv_copies_ > 1) {
        ops_.replicate_heads(stream_, kv_replication(), acts_->kv_rep.data(), local, false);
        local = acts_->kv_rep.data();
      }
      scatter_heads(full, local, kv_heads);
    }
    ops_.attention_forward(stream_, a, mask, a.inputs(dt, s.q_f.data(), s.k_f.data(), s.v_f.data()),
                           a.query_view(s.attn_f.data(), dt), a.lse_view(s.lse.data()));
    gather_heads(s.attn.data(), s.attn_f.data(), cfg_.num_heads);
  }
  backend_.copy_d2d(s.x_mid.data(), x_in, T * H * dtype_size(dt), stream_);
  if (dropping_) {
    linear(s.attn.data(), p.weight(w.o), acts_->branch.data(), T, H, qd, 0.0f, weight_or_null(p, w.o_bias));
    ops_.dropout_add(stream_, s.x_mid.data(), acts_->branch.data(), T, H, residual_mask(l, 0, 0), dt);
  } else {
    linear(s.attn.data(), p.weight(w.o), s.x_mid.data(), T, H, qd, 1.0f, weight_or_null(p, w.o_bias));
  }

  ops_.rmsnorm_forward(stream_, rmsnorm_shape(T, H), s.h2.data(), s.rstd2.as<float>(), s.x_mid.data(),
                       p.weight(w.mlp_norm));
  backend_.copy_d2d(x_out, s.x_mid.data(), T * H * dtype_size(dt), stream_);
  if (moe_of_layer_[l] >= 0)
    moe_block(l).forward(stream_, x_out, s.h2.data(), moe_params(l, p, false), T, true);
  else
    mlp_forward(l, p, s, x_out);
}

MoeBlock& DecoderModel::moe_block(int l) { return *moe_[static_cast<size_t>(moe_of_layer_[l])]; }

MoeParams DecoderModel::moe_params(int l, ParamStore& p, bool grads) const {
  const LayerParamIds& w = layout_.layers[l];
  auto ptr = [&](int id) { return grads ? p.grad(id) : p.weight(id); };
  MoeParams m;
  m.router = ptr(w.router);
  if (w.router_bias >= 0) m.router_bias = ptr(w.router_bias);
  for (size_t e = 0; e < w.expert_gate.size(); ++e) {
    m.gate.push_back(ptr(w.expert_gate[e]));
    m.up.push_back(ptr(w.expert_up[e]));
    m.down.push_back(ptr(w.expert_down[e]));
  }
  if (w.experts_gate_up >= 0) {  // expert e's slice of each fused tensor
    const int64_t E = cfg_.moe.experts;
    auto slices = [&](int id, std::vector<void*>& out) {
      const int64_t per_expert = layout_.params[id].numel / E;
      for (int64_t e = 0; e < E; ++e) out.push_back(at(ptr(id), e * per_expert, opts_.dtype));
    };
    slices(w.experts_gate_up, m.gate_up);
    slices(w.experts_gate_up_bias, m.gate_up_bias);
    slices(w.experts_down, m.down);
    slices(w.experts_down_bias, m.down_bias);
  }
  return m;
}

// Rows [r, r + n) of the MLP's gate and up projections, [n, 2I] (each row gate | up) by one GEMM
// with [W_gate; W_up] (adjacent in the flat buffer, ParamInfo::joined_to_next): in the tile buffer
// when tiled, else in the layer's whole-sequence one, which backward reads as forward left it
// (compute = false).
void* DecoderModel::mlp_gate_up(int l, ParamStore& p, LayerActs& s, int64_t r, int64_t n, bool compute) {
  const bool tiled = mlp_tile(opts_) < opts_.micro_batch * opts_.seq_len;
  void* gate_up = tiled ? acts_->gate_up_t.data() : s.gate_up.data();
  if (compute || tiled) {
    const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size;
    linear(at(s.h2.data(), r * H, opts_.dtype), p.weight(layout_.layers[l].gate), gate_up, n, 2 * I, H, 0.0f);
  }
  return gate_up;
}

// x_out += down(silu(gate(h2)) * up(h2)), tile by tile. Untiled (one tile), gate and up stay in
// the layer's set for backward; tiled, they live only as long as their tile.
void DecoderModel::mlp_forward(int l, ParamStore& p, LayerActs& s, void* x_out) {
  Activations& a = *acts_;
  const DType dt = opts_.dtype;
  const int64_t T = opts_.micro_batch * opts_.seq_len, H = cfg_.hidden_size, I = cfg_.intermediate_size;
  const int64_t M = mlp_tile(opts_);
  for (int64_t r = 0; r < T; r += M) {
    const int64_t n = std::min(M, T - r);
    ops_.swiglu_rows_forward(stream_, a.act.data(), mlp_gate_up(l, p, s, r, n, true), n, I, dt);
    if (!dropping_) {
      linear(a.act.data(), p.weight(layout_.layers[l].down), at(x_out, r * H, dt), n, H, I, 1.0f);
      continue;
    }
    void* branch = at(a.branch.data(), r * H, dt);
    linear(a.act.data(), p.weight(layout_.layers[l].down), branch, n, H, I, 0.0f);
    ops_.dropout_add(stream_, at(x_out, r * H, dt), branch, n, H, residual_mask(l, 1, r), dt);
  }
}

// On entry a.dx holds dL/d(x_out) of the MLP's rows; leaves dL/d(h2) in a.dh. Tiled, each tile's
// gate and up are recomputed from h2 first; the activation always is. The gate and up gradients,
// [n, 2I] like their forward, make dh with one GEMM (K = 2I) and [W_gate; W_up]'s gradient with one.
void DecoderModel::mlp_backward(int l, ParamStore& p, LayerActs& s) {
  Activations& a = *acts_;
  const LayerParamIds& w = layout_.layers[l];
  const DType dt = opts_.dtype;
  const int64_t T = opts_.micro_batch * opts_.seq_len, H = cfg_.hidden_size, I = cfg_.intermediate_size;
  const int64_t M = mlp_tile(opts_);
  for (int64_t r = 0; r < T; r += M) {
    const int64_t n = std::min(M, T - r);
    const void* gate_up = mlp_gate_up(l, p, s, r, n, false);
    const void* h2 = at(s.h2.data(), r * H, dt);
    ops_.swiglu_rows_forward(stream_, a.act.data(), gate_up, n, I, dt);
    const void* dy = at(a.dx.data(), r * H, dt);  // the branch's output gradient: masked when dropped
    if (dropping_) {
      ops_.dropout_backward(stream_, at(a.branch.data(), r * H, dt), dy, n, H, residual_mask(l, 1, r), dt);
      dy = at(a.branch.data(), r * H, dt);
    }
    linear_backward(dy, a.act.data(), p.weight(w.down), a.dact.data(), p.grad(w.down), n, H, I, 0.0f);
    ops_.swiglu_rows_backward(stream_, a.dgate_up.data(), a.dact.data(), gate_up, n, I, dt);
    linear_backward(a.dgate_up.data(), h2, p.weight(w.gate), at(a.dh.data(), r * H, dt), p.grad(w.gate), n, 2 * I, H,
                    0.0f);
  }
}

// q [T, q], k and v [T, kv] out of acts_->qkv's rows [T, q + 2 kv] (each row q | k | v), or, with
// to_rows, into them.
void DecoderModel::qkv_columns(void* q, void* k, void* v, bool to_rows) {
  const int64_t T = opts_.micro_batch * opts_.seq_len, qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), N = qd + 2 * kvd;
  const DType dt = opts_.dtype;
  struct Part {
    void* data;
    int64_t column, width;
  };
  for (const Part& part : {Part{q, 0, qd}, Part{k, qd, kvd}, Part{v, qd + kvd, kvd}}) {
    void* block = at(acts_->qkv.data(), part.column, dt);
    if (to_rows)
      ops_.copy_columns(stream_, block, N, part.data, part.width, T, part.width, dt);
    else
      ops_.copy_columns(stream_, part.data, part.width, block, N, T, part.width, dt);
  }
}

// On entry acts_->dx holds dL/d(layer output); on exit dL/d(layer input).
void DecoderModel::layer_backward(int l, ParamStore& p, LayerActs& s, const void* x_in) {
  Activations& a = *acts_;
  const LayerParamIds& w = layout_.layers[l];
  const DType dt = opts_.dtype;
  const int64_t T = opts_.micro_batch * opts_.seq_len, H = cfg_.hidden_size;
  const int64_t qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), D = cfg_.head_dim;

  // MLP: x_out = x_mid + down(silu(gate(h2)) * up(h2)), or x_mid + moe(h2).
  if (moe_of_layer_[l] >= 0)
    moe_block(l).backward(stream_, *moe_scratch_, a.dh.data(), moe_params(l, p, false), moe_params(l, p, true),
                          a.dx.data(), s.h2.data(), false, cfg_.moe.aux_loss ? aux_dprob_.as<float>() : nullptr);
  else
    mlp_backward(l, p, s);
  ops_.rmsnorm_backward(stream_, rmsnorm_shape(T, H),
                        {.dx = a.dx.data(), .dw_acc = p.grad(w.mlp_norm), .accumulate = true}, a.dh.data(),
                        s.x_mid.data(), p.weight(w.mlp_norm), s.rstd2.as<float>());

  // Attention: x_mid = x_in + o(attn(rope(q), rope(k), v)).
  const void* dy = a.dx.data();
  if (dropping_) {
    ops_.dropout_backward(stream_, a.branch.data(), dy, T, H, residual_mask(l, 0, 0), dt);
    dy = a.branch.data();
  }
  linear_backward(dy, s.attn.data(), p.weight(w.o), a.dattn.data(), p.grad(w.o), T, H, qd, 0.0f,
                  grad_or_null(p, w.o_bias));
  const AttentionMask mask = attention_mask(l, p);
  const int64_t P = sp_size();
  const AttentionShape sh = attention_shape(cfg_, opts_, P);
  if (P == 1) {
    ops_.attention_backward(stream_, sh, mask, sh.inputs(dt, s.q.data(), s.k.data(), s.v.data()),
                            sh.query_view(s.attn.data(), dt), sh.lse_view(s.lse.data()),
                            sh.query_view(a.dattn.data(), dt),
                            sh.grads(dt, a.dq.data(), a.dk.data(), a.dv.data(), sinks_grad(l, p)));
  } else {
    const int64_t kv_heads = cfg_.num_kv_heads * kv_copies_;
    scatter_heads(a.dattn_f.data(), a.dattn.data(), cfg_.num_heads);
    ops_.attention_backward(stream_, sh, mask, sh.inputs(dt, s.q_f.data(), s.k_f.data(), s.v_f.data()),
                            sh.query_view(s.attn_f.data(), dt), sh.lse_view(s.lse.data()),
                            sh.query_view(a.dattn_f.data(), dt),
                            sh.grads(dt, a.dq_f.data(), a.dk_f.data(), a.dv_f.data(), sinks_grad(l, p)));
    gather_heads(a.dq.data(), a.dq_f.data(), cfg_.num_heads);
    for (auto [local, full] : {std::pair{a.dk.data(), a.dk_f.data()}, std::pair{a.dv.data(), a.dv_f.data()}}) {
      if (kv_copies_ == 1) {
        gather_heads(local, full, kv_heads);
        continue;
      }
      // Every replica's gradient flows back to its KV head.
      gather_heads(a.kv_rep.data(), full, kv_heads);
      ops_.replicate_heads(stream_, kv_replication(), local, a.kv_rep.data(), true);
    }
  }
  ops_.rope(stream_, rope_of(cfg_.num_heads), a.dq.data(), true);
  ops_.rope(stream_, rope_of(cfg_.num_kv_heads), a.dk.data(), true);
  void* dq_proj = a.dq.data();
  void* dk_proj = a.dk.data();
  if (cfg_.qk_norm) {
    ops_.rmsnorm_backward(stream_, rmsnorm_shape(T * cfg_.num_heads, D),
                          {.dx = a.dq_raw.data(), .dw_acc = p.grad(w.q_norm), .accumulate = false}, a.dq.data(),
                          s.q_raw.data(), p.weight(w.q_norm), s.q_rstd.as<float>());
    ops_.rmsnorm_backward(stream_, rmsnorm_shape(T * cfg_.num_kv_heads, D),
                          {.dx = a.dk_raw.data(), .dw_acc = p.grad(w.k_norm), .accumulate = false}, a.dk.data(),
                          s.k_raw.data(), p.weight(w.k_norm), s.k_rstd.as<float>());
    dq_proj = a.dq_raw.data();
    dk_proj = a.dk_raw.data();
  }
  // [dq | dk | dv] rows, then dh (one GEMM, K = q + 2 kv) and [W_q; W_k; W_v]'s gradient (one GEMM).
  qkv_columns(dq_proj, dk_proj, a.dv.data(), true);
  linear_backward(a.qkv.data(), s.h1.data(), p.weight(w.q), a.dh.data(), p.grad(w.q), T, qd + 2 * kvd, H, 0.0f,
                  grad_or_null(p, w.q_bias));
  ops_.rmsnorm_backward(stream_, rmsnorm_shape(T, H),
                        {.dx = a.dx.data(), .dw_acc = p.grad(w.attn_norm), .accumulate = true}, a.dh.data(), x_in,
                        p.weight(w.attn_norm), s.rstd1.as<float>());
}

// Final norm, then output projection + cross-entropy chunk by chunk. With backward, the chunks'
// logit gradients fill one group of grad_chunk rows, which then becomes dhn and lm_head's gradient
// with one GEMM each (fewer, larger GEMMs than one pair per chunk; one group when all tokens fit).
void DecoderModel::head_forward_backward(ParamStore& p, float loss_scale, bool backward) {
  Activations& a = *acts_;
  const DType dt = opts_.dtype;
  const int64_t T = opts_.micro_batch * opts_.seq_len, H = cfg_.hidden_size, V = cfg_.vocab_size;
  const int64_t L = cfg_.num_layers;
  ops_.rmsnorm_forward(stream_, rmsnorm_shape(T, H), a.hn.data(), a.rstd_final.as<float>(), residual(L),
                       p.weight(layout_.final_norm));
  const void* w_out = p.weight(layout_.lm_head);
  void* dw_out = backward ? p.grad(layout_.lm_head) : nullptr;
  for (int64_t g0 = 0; g0 < T; g0 += a.grad_chunk) {
    const int64_t ng = std::min(a.grad_chunk, T - g0);
    for (int64_t c0 = g0; c0 < g0 + ng; c0 += a.chunk) {
      const int64_t n = std::min(a.chunk, g0 + ng - c0);
      ops_.gemm(stream_, Gemm::nt(n, V, H, at(a.hn.data(), c0 * H, dt), w_out, a.logits.data(), dt).out_as(DType::F32));
      ops_.cross_entropy(stream_, {.rows = n, .V = V, .scale = loss_scale, .z_loss = opts_.z_loss, .dtype = dt},
                         a.loss.as<float>(), backward ? at(a.dlogits.data(), (c0 - g0) * V, dt) : nullptr,
                         a.logits.as<float>(), a.targets.as<int32_t>() + c0);
    }
    if (!backward) continue;
    const void* hn_g = at(a.hn.data(), g0 * H, dt);
    ops_.gemm(stream_, Gemm::nn(ng, H, V, a.dlogits.data(), w_out, at(a.dhn.data(), g0 * H, dt), dt));
    ops_.gemm(stream_, Gemm::tn(V, H, ng, a.dlogits.data(), hn_g, dw_out, dt, 1.0f));
  }
}

void DecoderModel::scatter_heads(void* full, const void* local, int64_t heads) {
  const int64_t P = sp_size(), B = opts_.micro_batch, Sl = opts_.seq_len, C = heads / P * cfg_.head_dim;
  Activations& a = *acts_;
  ops_.transpose_blocks(stream_, a.a2a_send.data(), local, B * Sl, P, C, opts_.dtype);  // -> [P][B*Sl][C]
  opts_.sequence_parallel->all_to_all(stream_, a.a2a_recv.data(), a.a2a_send.data(), B * Sl * C, opts_.dtype);
  ops_.transpose_blocks(stream_, full, a.a2a_recv.data(), P, B, Sl * C, opts_.dtype);  // [P][B][Sl*C] -> [B][S][C]
}

void DecoderModel::gather_heads(void* local, const void* full, int64_t heads) {
  const int64_t P = sp_size(), B = opts_.micro_batch, Sl = opts_.seq_len, C = heads / P * cfg_.head_dim;
  Activations& a = *acts_;
  ops_.transpose_blocks(stream_, a.a2a_send.data(), full, B, P, Sl * C, opts_.dtype);  // -> [P][B][Sl*C]
  opts_.sequence_parallel->all_to_all(stream_, a.a2a_recv.data(), a.a2a_send.data(), B * Sl * C, opts_.dtype);
  ops_.transpose_blocks(stream_, local, a.a2a_recv.data(), P, B * Sl, C, opts_.dtype);  // -> [B*Sl][P][C]
}

}  // namespace so
