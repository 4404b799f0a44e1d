#include "so/model/llama_model.h"

#include <cmath>

#include "so/core/error.h"

namespace so {

namespace {
void* at(void* p, int64_t elems, DType dt) { return static_cast<char*>(p) + elems * dtype_size(dt); }
}  // namespace

// Everything one layer's backward needs from its forward. With activation checkpointing a
// single set is reused: backward recomputes the layer's forward into it first.
struct LlamaModel::LayerActs {
  DeviceBuffer h1, rstd1, q_raw, q_rstd, k_raw, k_rstd, q, k, v, attn, lse, x_mid, h2, rstd2, gate, up;
  DeviceBuffer q_f, k_f, v_f, attn_f;  // Ulysses: whole sequence, this rank's heads (lse is lse_f then)
};

struct LlamaModel::Activations {
  DeviceBuffer tokens, targets, positions;  // int32 [T]
  std::vector<DeviceBuffer> x;              // residual stream: x[l] is layer l's input, x[L] the last output
  std::vector<LayerActs> layer;             // per layer, or one set when checkpointing
  DeviceBuffer hn, rstd_final, dhn;         // final norm output and its gradient
  DeviceBuffer logits, dlogits;             // one chunk: fp32 [C, V] and its gradient in dtype
  DeviceBuffer act, dact, dgate, dup;       // MLP scratch [T, I]
  DeviceBuffer dx, dh, dq, dk, dv, dattn, dq_raw, dk_raw;
  DeviceBuffer dq_f, dk_f, dv_f, dattn_f, kv_rep, a2a_send, a2a_recv;  // Ulysses scratch
  DeviceBuffer loss;                        // fp32 accumulator
  TokenBatch staged;                        // host copy being uploaded
  std::unique_ptr<Event> uploaded;
  int64_t chunk = 0;
};

LlamaModel::LlamaModel(Backend& backend, const ModelConfig& cfg, const ModelOptions& opts)
    : backend_(backend),
      ops_(backend.ops()),
      stream_(backend.stream(StreamKind::Compute)),
      cfg_(cfg),
      opts_(opts),
      layout_(ParamLayout::for_model(cfg)),
      acts_(std::make_unique<Activations>()) {
  SO_CHECK(opts.micro_batch > 0 && opts.seq_len > 0, "model: micro_batch (", opts.micro_batch, ") and seq_len (",
           opts.seq_len, ") must be positive");
  const DType dt = opts.dtype;
  const int64_t T = opts.micro_batch * opts.seq_len, H = cfg.hidden_size, I = cfg.intermediate_size;
  const int64_t qd = cfg.q_dim(), kvd = cfg.kv_dim(), V = cfg.vocab_size;
  auto buf = [&](int64_t n, DType t, const char* tag) { return backend.alloc(n * dtype_size(t), tag); };
  auto ids = [&](const char* tag) { return backend.alloc(T * sizeof(int32_t), tag); };
  // Ulysses: P ranks hold 1/P of every sequence; attention runs on all tokens for Hq/P heads, and
  // on max(1, Hkv/P) KV heads (replicated when P exceeds the KV-head count).
  const int64_t P = sp_size(), Hq = cfg.num_heads, Hkv = cfg.num_kv_heads, D = cfg.head_dim;
  SO_CHECK(P == 1 || Hq % P == 0, "num_attention_heads (", Hq, ") is not divisible by sequence_parallel_size (", P,
           ")");
  SO_CHECK(P == 1 || Hkv % P == 0 || P % Hkv == 0, "num_key_value_heads (", Hkv, ") and sequence_parallel_size (", P,
           "): one must divide the other (KV heads are split over the ranks, or replicated)");
  kv_copies_ = P > Hkv ? P / Hkv : 1;
  Activations& a = *acts_;
  a.tokens = ids("tokens");
  a.targets = ids("targets");
  a.positions = ids("positions");
  for (int64_t l = 0; l <= cfg.num_layers; ++l) a.x.push_back(buf(T * H, dt, "residual stream"));
  const int64_t sets = opts.activation_checkpointing ? 1 : cfg.num_layers;
  for (int64_t l = 0; l < sets; ++l) {
    LayerActs s;
    s.h1 = buf(T * H, dt, "attn norm out");
    s.rstd1 = buf(T, DType::F32, "attn norm rstd");
    if (cfg.qk_norm) {
      s.q_raw = buf(T * qd, dt, "q before norm");
      s.q_rstd = buf(T * cfg.num_heads, DType::F32, "q norm rstd");
      s.k_raw = buf(T * kvd, dt, "k before norm");
      s.k_rstd = buf(T * cfg.num_kv_heads, DType::F32, "k norm rstd");
    }
    s.q = buf(T * qd, dt, "q");
    s.k = buf(T * kvd, dt, "k");
    s.v = buf(T * kvd, dt, "v");
    s.attn = buf(T * qd, dt, "attention out");
    s.lse = buf(T * cfg.num_heads, DType::F32, "attention lse");
    if (P > 1) {
      s.q_f = buf(T * qd, dt, "q (all tokens, local heads)");
      s.k_f = buf(T * Hkv * kv_copies_ * D, dt, "k (all tokens, local heads)");
      s.v_f = buf(T * Hkv * kv_copies_ * D, dt, "v (all tokens, local heads)");
      s.attn_f = buf(T * qd, dt, "attention out (all tokens, local heads)");
    }
    s.x_mid = buf(T * H, dt, "residual after attention");
    s.h2 = buf(T * H, dt, "mlp norm out");
    s.rstd2 = buf(T, DType::F32, "mlp norm rstd");
    s.gate = buf(T * I, dt, "mlp gate");
    s.up = buf(T * I, dt, "mlp up");
    a.layer.push_back(std::move(s));
  }
  a.hn = buf(T * H, dt, "final norm out");
  a.rstd_final = buf(T, DType::F32, "final norm rstd");
  a.dhn = buf(T * H, dt, "final norm grad");
  // Chunk so one chunk's fp32 logits stay near 64 MiB whatever the vocabulary.
  a.chunk = opts.loss_chunk_tokens > 0 ? opts.loss_chunk_tokens : std::max<int64_t>(1, (int64_t{16} << 20) / V);
  a.chunk = std::min(a.chunk, T);
  a.logits = buf(a.chunk * V, DType::F32, "logits chunk");
  a.dlogits = buf(a.chunk * V, dt, "logits grad chunk");
  a.act = buf(T * I, dt, "mlp activation");
  a.dact = buf(T * I, dt, "mlp activation grad");
  a.dgate = buf(T * I, dt, "mlp gate grad");
  a.dup = buf(T * I, dt, "mlp up grad");
  a.dx = buf(T * H, dt, "residual grad");
  a.dh = buf(T * H, dt, "norm out grad");
  a.dq = buf(T * qd, dt, "q grad");
  a.dk = buf(T * kvd, dt, "k grad");
  a.dv = buf(T * kvd, dt, "v grad");
  a.dattn = buf(T * qd, dt, "attention out grad");
  if (cfg.qk_norm) {
    a.dq_raw = buf(T * qd, dt, "q before norm grad");
    a.dk_raw = buf(T * kvd, dt, "k before norm grad");
  }
  if (P > 1) {
    const int64_t kv_sent = T * Hkv * kv_copies_ * D;
    a.dq_f = buf(T * qd, dt, "q grad (all tokens, local heads)");
    a.dattn_f = buf(T * qd, dt, "attention out grad (all tokens, local heads)");
    a.dk_f = buf(kv_sent, dt, "k grad (all tokens, local heads)");
    a.dv_f = buf(kv_sent, dt, "v grad (all tokens, local heads)");
    if (kv_copies_ > 1) a.kv_rep = buf(kv_sent, dt, "replicated kv heads");
    a.a2a_send = buf(std::max(T * qd, kv_sent), dt, "all-to-all send");
    a.a2a_recv = buf(std::max(T * qd, kv_sent), dt, "all-to-all receive");
  }
  a.loss = buf(1, DType::F32, "loss");
  a.uploaded = backend.create_event();
  backend.record(*a.uploaded, stream_);
}

LlamaModel::~LlamaModel() {
  // Enqueued ops reference the activations: let them finish (errors were reported already).
  try {
    backend_.synchronize(stream_);
  } catch (...) {
  }
}

void LlamaModel::zero_loss() { backend_.memset_zero(acts_->loss.data(), sizeof(float), stream_); }

float LlamaModel::read_loss() {
  float loss = 0.0f;
  backend_.copy_d2h(&loss, acts_->loss.data(), sizeof(float), stream_);
  backend_.synchronize(stream_);
  return loss;
}

const void* LlamaModel::final_hidden() const { return acts_->hn.data(); }

void LlamaModel::linear(const void* in, const void* w, void* out, int64_t rows, int64_t out_dim, int64_t in_dim,
                        float beta) {
  ops_.gemm(stream_, false, true, rows, out_dim, in_dim, 1.0f, in, w, opts_.dtype, beta, out, opts_.dtype);
}

// y = x W^T:  dW += dy^T x,  dx = dy W (+ din_beta * dx)
void LlamaModel::linear_backward(const void* dout, const void* in, const void* w, void* din, void* dw, int64_t rows,
                                 int64_t out_dim, int64_t in_dim, float din_beta) {
  const DType dt = opts_.dtype;
  ops_.gemm(stream_, true, false, out_dim, in_dim, rows, 1.0f, dout, in, dt, 1.0f, dw, dt);
  ops_.gemm(stream_, false, false, rows, in_dim, out_dim, 1.0f, dout, w, dt, din_beta, din, dt);
}

void LlamaModel::forward_backward(const TokenBatch& batch, ParamStore& p, ModelHooks& hooks, float loss_scale,
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
  backend_.record(*a.uploaded, stream_);

  hooks.before_unit(0);
  ops_.embedding_forward(stream_, a.x[0].data(), p.weight(layout_.embedding), a.tokens.as<int32_t>(), T,
                         cfg_.vocab_size, cfg_.hidden_size, opts_.dtype);
  for (int64_t l = 0; l < L; ++l) {
    hooks.before_unit(static_cast<int>(l) + 1);
    layer_forward(static_cast<int>(l), p, a.layer[opts_.activation_checkpointing ? 0 : l], a.x[l].data(),
                  a.x[l + 1].data());
  }
  hooks.before_unit(static_cast<int>(L) + 1);
  head_forward_backward(p, loss_scale, backward);
  if (!backward) return;

  const int head_unit = static_cast<int>(L) + 1;
  ops_.rmsnorm_backward(stream_, a.dx.data(), p.grad(layout_.final_norm), a.dhn.data(), a.x[L].data(),
                        p.weight(layout_.final_norm), a.rstd_final.as<float>(), T, cfg_.hidden_size, false,
                        opts_.dtype);
  hooks.after_backward(head_unit);
  for (int64_t l = L - 1; l >= 0; --l) {
    LayerActs& acts = a.layer[opts_.activation_checkpointing ? 0 : l];
    if (opts_.activation_checkpointing) {
      hooks.before_unit(static_cast<int>(l) + 1);
      layer_forward(static_cast<int>(l), p, acts, a.x[l].data(), a.x[l + 1].data());
    }
    hooks.before_backward(static_cast<int>(l) + 1);
    layer_backward(static_cast<int>(l), p, acts, a.x[l].data());
    hooks.after_backward(static_cast<int>(l) + 1);
  }
  hooks.before_backward(0);
  ops_.embedding_backward(stream_, p.grad(layout_.embedding), a.dx.data(), a.tokens.as<int32_t>(), T,
                          cfg_.vocab_size, cfg_.hidden_size, opts_.dtype);
  hooks.after_backward(0);
}

void LlamaModel::layer_forward(int l, ParamStore& p, LayerActs& s, const void* x_in, void* x_out) {
  const LayerParamIds& w = layout_.layers[l];
  const DType dt = opts_.dtype;
  const int64_t T = opts_.micro_batch * opts_.seq_len, H = cfg_.hidden_size, I = cfg_.intermediate_size;
  const int64_t qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), D = cfg_.head_dim;
  const float theta = static_cast<float>(cfg_.rope_theta);
  const int32_t* pos = acts_->positions.as<int32_t>();

  ops_.rmsnorm_forward(stream_, s.h1.data(), s.rstd1.as<float>(), x_in, p.weight(w.attn_norm), T, H,
                       cfg_.rms_norm_eps, dt);
  if (cfg_.qk_norm) {
    linear(s.h1.data(), p.weight(w.q), s.q_raw.data(), T, qd, H, 0.0f);
    ops_.rmsnorm_forward(stream_, s.q.data(), s.q_rstd.as<float>(), s.q_raw.data(), p.weight(w.q_norm),
                         T * cfg_.num_heads, D, cfg_.rms_norm_eps, dt);
    linear(s.h1.data(), p.weight(w.k), s.k_raw.data(), T, kvd, H, 0.0f);
    ops_.rmsnorm_forward(stream_, s.k.data(), s.k_rstd.as<float>(), s.k_raw.data(), p.weight(w.k_norm),
                         T * cfg_.num_kv_heads, D, cfg_.rms_norm_eps, dt);
  } else {
    linear(s.h1.data(), p.weight(w.q), s.q.data(), T, qd, H, 0.0f);
    linear(s.h1.data(), p.weight(w.k), s.k.data(), T, kvd, H, 0.0f);
  }
  linear(s.h1.data(), p.weight(w.v), s.v.data(), T, kvd, H, 0.0f);
  ops_.rope(stream_, s.q.data(), pos, T, cfg_.num_heads, D, theta, false, dt);
  ops_.rope(stream_, s.k.data(), pos, T, cfg_.num_kv_heads, D, theta, false, dt);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t P = sp_size();
  if (P == 1) {
    ops_.attention_forward(stream_, s.attn.data(), s.lse.as<float>(), s.q.data(), s.k.data(), s.v.data(),
                           opts_.micro_batch, opts_.seq_len, cfg_.num_heads, cfg_.num_kv_heads, D, scale, dt);
  } else {
    const int64_t kv_heads = cfg_.num_kv_heads * kv_copies_;
    scatter_heads(s.q_f.data(), s.q.data(), cfg_.num_heads);
    for (auto [full, local] : {std::pair{s.k_f.data(), s.k.data()}, std::pair{s.v_f.data(), s.v.data()}}) {
      if (kv_copies_ > 1) {
        ops_.replicate_heads(stream_, acts_->kv_rep.data(), local, T, cfg_.num_kv_heads, kv_copies_, D, false, dt);
        local = acts_->kv_rep.data();
      }
      scatter_heads(full, local, kv_heads);
    }
    ops_.attention_forward(stream_, s.attn_f.data(), s.lse.as<float>(), s.q_f.data(), s.k_f.data(), s.v_f.data(),
                           opts_.micro_batch, opts_.seq_len * P, cfg_.num_heads / P, kv_heads / P, D, scale, dt);
    gather_heads(s.attn.data(), s.attn_f.data(), cfg_.num_heads);
  }
  backend_.copy_d2d(s.x_mid.data(), x_in, T * H * dtype_size(dt), stream_);
  linear(s.attn.data(), p.weight(w.o), s.x_mid.data(), T, H, qd, 1.0f);

  ops_.rmsnorm_forward(stream_, s.h2.data(), s.rstd2.as<float>(), s.x_mid.data(), p.weight(w.mlp_norm), T, H,
                       cfg_.rms_norm_eps, dt);
  linear(s.h2.data(), p.weight(w.gate), s.gate.data(), T, I, H, 0.0f);
  linear(s.h2.data(), p.weight(w.up), s.up.data(), T, I, H, 0.0f);
  ops_.swiglu_forward(stream_, acts_->act.data(), s.gate.data(), s.up.data(), T * I, dt);
  backend_.copy_d2d(x_out, s.x_mid.data(), T * H * dtype_size(dt), stream_);
  linear(acts_->act.data(), p.weight(w.down), x_out, T, H, I, 1.0f);
}

// On entry acts_->dx holds dL/d(layer output); on exit dL/d(layer input).
void LlamaModel::layer_backward(int l, ParamStore& p, LayerActs& s, const void* x_in) {
  Activations& a = *acts_;
  const LayerParamIds& w = layout_.layers[l];
  const DType dt = opts_.dtype;
  const int64_t T = opts_.micro_batch * opts_.seq_len, H = cfg_.hidden_size, I = cfg_.intermediate_size;
  const int64_t qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), D = cfg_.head_dim;
  const float theta = static_cast<float>(cfg_.rope_theta);
  const int32_t* pos = a.positions.as<int32_t>();

  // MLP: x_out = x_mid + down(silu(gate(h2)) * up(h2)); the activation is recomputed, not kept.
  ops_.swiglu_forward(stream_, a.act.data(), s.gate.data(), s.up.data(), T * I, dt);
  linear_backward(a.dx.data(), a.act.data(), p.weight(w.down), a.dact.data(), p.grad(w.down), T, H, I, 0.0f);
  ops_.swiglu_backward(stream_, a.dgate.data(), a.dup.data(), a.dact.data(), s.gate.data(), s.up.data(), T * I, dt);
  linear_backward(a.dgate.data(), s.h2.data(), p.weight(w.gate), a.dh.data(), p.grad(w.gate), T, I, H, 0.0f);
  linear_backward(a.dup.data(), s.h2.data(), p.weight(w.up), a.dh.data(), p.grad(w.up), T, I, H, 1.0f);
  ops_.rmsnorm_backward(stream_, a.dx.data(), p.grad(w.mlp_norm), a.dh.data(), s.x_mid.data(), p.weight(w.mlp_norm),
                        s.rstd2.as<float>(), T, H, true, dt);

  // Attention: x_mid = x_in + o(attn(rope(q), rope(k), v)).
  linear_backward(a.dx.data(), s.attn.data(), p.weight(w.o), a.dattn.data(), p.grad(w.o), T, H, qd, 0.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t P = sp_size();
  if (P == 1) {
    ops_.attention_backward(stream_, a.dq.data(), a.dk.data(), a.dv.data(), a.dattn.data(), s.q.data(), s.k.data(),
                            s.v.data(), s.attn.data(), s.lse.as<float>(), opts_.micro_batch, opts_.seq_len,
                            cfg_.num_heads, cfg_.num_kv_heads, D, scale, dt);
  } else {
    const int64_t kv_heads = cfg_.num_kv_heads * kv_copies_;
    scatter_heads(a.dattn_f.data(), a.dattn.data(), cfg_.num_heads);
    ops_.attention_backward(stream_, a.dq_f.data(), a.dk_f.data(), a.dv_f.data(), a.dattn_f.data(), s.q_f.data(),
                            s.k_f.data(), s.v_f.data(), s.attn_f.data(), s.lse.as<float>(), opts_.micro_batch,
                            opts_.seq_len * P, cfg_.num_heads / P, kv_heads / P, D, scale, dt);
    gather_heads(a.dq.data(), a.dq_f.data(), cfg_.num_heads);
    for (auto [local, full] : {std::pair{a.dk.data(), a.dk_f.data()}, std::pair{a.dv.data(), a.dv_f.data()}}) {
      if (kv_copies_ == 1) {
        gather_heads(local, full, kv_heads);
        continue;
      }
      // Every replica's gradient flows back to its KV head.
      gather_heads(a.kv_rep.data(), full, kv_heads);
      ops_.replicate_heads(stream_, local, a.kv_rep.data(), T, cfg_.num_kv_heads, kv_copies_, D, true, dt);
    }
  }
  ops_.rope(stream_, a.dq.data(), pos, T, cfg_.num_heads, D, theta, true, dt);
  ops_.rope(stream_, a.dk.data(), pos, T, cfg_.num_kv_heads, D, theta, true, dt);
  void* dq_proj = a.dq.data();
  void* dk_proj = a.dk.data();
  if (cfg_.qk_norm) {
    ops_.rmsnorm_backward(stream_, a.dq_raw.data(), p.grad(w.q_norm), a.dq.data(), s.q_raw.data(),
                          p.weight(w.q_norm), s.q_rstd.as<float>(), T * cfg_.num_heads, D, false, dt);
    ops_.rmsnorm_backward(stream_, a.dk_raw.data(), p.grad(w.k_norm), a.dk.data(), s.k_raw.data(),
                          p.weight(w.k_norm), s.k_rstd.as<float>(), T * cfg_.num_kv_heads, D, false, dt);
    dq_proj = a.dq_raw.data();
    dk_proj = a.dk_raw.data();
  }
  linear_backward(dq_proj, s.h1.data(), p.weight(w.q), a.dh.data(), p.grad(w.q), T, qd, H, 0.0f);
  linear_backward(dk_proj, s.h1.data(), p.weight(w.k), a.dh.data(), p.grad(w.k), T, kvd, H, 1.0f);
  linear_backward(a.dv.data(), s.h1.data(), p.weight(w.v), a.dh.data(), p.grad(w.v), T, kvd, H, 1.0f);
  ops_.rmsnorm_backward(stream_, a.dx.data(), p.grad(w.attn_norm), a.dh.data(), x_in, p.weight(w.attn_norm),
                        s.rstd1.as<float>(), T, H, true, dt);
}

// Final norm, then output projection + cross-entropy chunk by chunk; with backward, each chunk's
// logit gradient is turned into dhn and lm_head's gradient before the next chunk overwrites it.
void LlamaModel::head_forward_backward(ParamStore& p, float loss_scale, bool backward) {
  Activations& a = *acts_;
  const DType dt = opts_.dtype;
  const int64_t T = opts_.micro_batch * opts_.seq_len, H = cfg_.hidden_size, V = cfg_.vocab_size;
  const int64_t L = cfg_.num_layers;
  ops_.rmsnorm_forward(stream_, a.hn.data(), a.rstd_final.as<float>(), a.x[L].data(), p.weight(layout_.final_norm),
                       T, H, cfg_.rms_norm_eps, dt);
  const void* w_out = p.weight(layout_.lm_head);
  void* dw_out = backward ? p.grad(layout_.lm_head) : nullptr;
  for (int64_t c0 = 0; c0 < T; c0 += a.chunk) {
    const int64_t n = std::min(a.chunk, T - c0);
    const void* hn_c = at(a.hn.data(), c0 * H, dt);
    ops_.gemm(stream_, false, true, n, V, H, 1.0f, hn_c, w_out, dt, 0.0f, a.logits.data(), DType::F32);
    ops_.cross_entropy(stream_, a.loss.as<float>(), backward ? a.dlogits.data() : nullptr, a.logits.as<float>(),
                       a.targets.as<int32_t>() + c0, n, V, loss_scale, dt);
    if (!backward) continue;
    ops_.gemm(stream_, false, false, n, H, V, 1.0f, a.dlogits.data(), w_out, dt, 0.0f, at(a.dhn.data(), c0 * H, dt),
              dt);
    ops_.gemm(stream_, true, false, V, H, n, 1.0f, a.dlogits.data(), hn_c, dt, 1.0f, dw_out, dt);
  }
}

void LlamaModel::scatter_heads(void* full, const void* local, int64_t heads) {
  const int64_t P = sp_size(), B = opts_.micro_batch, Sl = opts_.seq_len, C = heads / P * cfg_.head_dim;
  Activations& a = *acts_;
  ops_.transpose_blocks(stream_, a.a2a_send.data(), local, B * Sl, P, C, opts_.dtype);  // -> [P][B*Sl][C]
  opts_.sequence_parallel->all_to_all(stream_, a.a2a_recv.data(), a.a2a_send.data(), B * Sl * C, opts_.dtype);
  ops_.transpose_blocks(stream_, full, a.a2a_recv.data(), P, B, Sl * C, opts_.dtype);  // [P][B][Sl*C] -> [B][S][C]
}

void LlamaModel::gather_heads(void* local, const void* full, int64_t heads) {
  const int64_t P = sp_size(), B = opts_.micro_batch, Sl = opts_.seq_len, C = heads / P * cfg_.head_dim;
  Activations& a = *acts_;
  ops_.transpose_blocks(stream_, a.a2a_send.data(), full, B, P, Sl * C, opts_.dtype);  // -> [P][B][Sl*C]
  opts_.sequence_parallel->all_to_all(stream_, a.a2a_recv.data(), a.a2a_send.data(), B * Sl * C, opts_.dtype);
  ops_.transpose_blocks(stream_, local, a.a2a_recv.data(), P, B * Sl, C, opts_.dtype);  // -> [B*Sl][P][C]
}

}  // namespace so
