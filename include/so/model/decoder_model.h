#pragma once
// The one decoder of every family (so/model/model_family.h: Llama, Qwen3, Qwen2, Mistral, Phi-3, Seed-OSS,
// Qwen3-MoE, GPT-OSS) with explicit forward and backward, layer by layer, enqueued on the backend's compute
// stream. It owns activations, never parameters.
#include <memory>
#include <utility>
#include <vector>

#include "so/backend/backend.h"
#include "so/backend/host_buffer.h"
#include "so/data/token_batch.h"
#include "so/model/model_config.h"
#include "so/model/model_interfaces.h"
#include "so/model/moe_block.h"
#include "so/model/param_layout.h"

namespace so {

struct ModelOptions {
  DType dtype = DType::F32;
  int64_t micro_batch = 1;                // sequences per micro-batch
  int64_t seq_len = 0;                    // tokens per sequence held by this rank (1/P of it under Ulysses)
  bool activation_checkpointing = false;  // keep only each layer's input; recompute in backward
  // With checkpointing: each layer's input (its checkpoint) is copied to pinned host memory on the
  // D2H stream during forward and brought back on the H2D stream one layer ahead of its recompute;
  // the device holds two of them (double buffering) instead of one per layer.
  bool offload_checkpoints = false;
  int numa_node = -1;  // host checkpoints' NUMA node; -1 = local
  // The MLP runs in tiles of this many tokens, forward and backward (recomputed per tile), so its
  // [tokens x intermediate] tensors never exist whole; 0 or >= tokens = one tile, nothing recomputed.
  int64_t mlp_tile_tokens = 0;
  int64_t loss_chunk_tokens = 0;  // tokens per output-projection + cross-entropy chunk; 0 = auto
  // Tokens per lm_head weight-gradient (and dhn) GEMM, at least one chunk; 0 = auto.
  int64_t loss_grad_chunk_tokens = 0;
  float z_loss = 0.0f;                            // OLMo's z-loss: each token's loss adds z_loss * logsumexp(logits)^2
  SequenceParallel* sequence_parallel = nullptr;  // Ulysses group; null = the whole sequence is here
  uint64_t dropout_seed = 0;  // dropout's masks (residual_dropout, attention_dropout): the run's seed
};

// What a device buffer of the model holds, for the memory planner's table.
enum class ActivationTerm {
  Inputs,           // token ids, targets, positions
  Checkpoints,      // the residual stream: every layer's input, or two slots when offloaded
  LayerWorkingSet,  // one layer's saved tensors (one set with checkpointing, else one per layer)
  Mlp,              // [tokens x intermediate] tensors (MLP tiles when tiled)
  Ulysses,          // whole-sequence head slices and all-to-all buffers
  LossChunk,        // the final norm and one chunk of logits
  BackwardScratch,  // gradients of one layer's tensors
};
const char* activation_term_name(ActivationTerm t);

struct ActivationBuffer {
  const char* tag;
  ActivationTerm term;
  size_t bytes;
};

class DecoderModel {
 public:
  DecoderModel(Backend& backend, const ModelConfig& cfg, const ModelOptions& opts);
  ~DecoderModel();

  // Every device buffer the constructor allocates, in order (the same code decides both), with
  // sp_size ranks in the Ulysses group (opts.sequence_parallel is not read).
  static std::vector<ActivationBuffer> activation_buffers(const ModelConfig& cfg, const ModelOptions& opts,
                                                          int64_t sp_size);
  // Pinned host bytes for offloaded checkpoints (0 when not offloaded).
  static size_t host_checkpoint_bytes(const ModelConfig& cfg, const ModelOptions& opts);
  // Tokens per logits chunk, and per lm_head weight-gradient GEMM (a multiple of the chunk, or
  // all tokens), from ModelOptions or from fixed byte budgets.
  struct LossChunks {
    int64_t chunk, grad_chunk;
  };
  static LossChunks loss_chunks(const ModelConfig& cfg, const ModelOptions& opts);
  // Tokens per MLP tile for this model's T tokens (T when untiled).
  static int64_t mlp_tile(const ModelOptions& opts);
  // The shape every attention call has: all tokens of a sequence, this rank's heads under Ulysses
  // with sp_size ranks (kv heads replicated when there are fewer than ranks).
  using AttentionShape = so::AttentionShape;
  static AttentionShape attention_shape(const ModelConfig& cfg, const ModelOptions& opts, int64_t sp_size);
  // The most attention workspace any layer's mask (window or not, packed rows or not) draws (the
  // memory planner's term).
  static size_t attention_workspace_bytes(Ops& ops, const ModelConfig& cfg, const ModelOptions& opts, int64_t sp_size);

  const ModelConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  const ModelOptions& options() const { return opts_; }

  // Forward of one micro-batch; adds loss_scale * sum of token losses to the device loss
  // accumulator. With backward = true it then runs the backward pass, accumulating every
  // parameter gradient into params.grad(). The output projection and its gradient are
  // computed chunk by chunk in the forward pass, so [tokens x vocab] fp32 logits never exist.
  void forward_backward(const TokenBatch& batch, ParamStore& params, ModelHooks& hooks, float loss_scale,
                        bool backward);

  // The attention implementation the backend runs for this model's shape (all tokens, this rank's
  // heads under Ulysses) and each kind of layer (sliding window or not), for whole and packed
  // rows, and why.
  std::string attention_implementation() const;

  void zero_loss();
  // Synchronises and returns the accumulated loss.
  float read_loss();
  void zero_expert_tokens();
  // A training step's figures, read without draining the device: queue_step_figures() copies the
  // loss accumulator and the expert counts to host memory behind the work enqueued so far;
  // step_figures() waits for that copy alone and returns them (once per queue). The training loop
  // reads a step's figures after the next step's work is enqueued.
  struct StepFigures {
    float loss = 0.0f;  // as read_loss()
    // Tokens each layer sent to each expert ([layer][expert], top-k choices: a token counts once
    // per chosen expert) over the forwards since zero_expert_tokens (recomputes not counted); a
    // dense layer's list is empty.
    std::vector<std::vector<int64_t>> expert_tokens;
  };
  void queue_step_figures();
  StepFigures step_figures();
  // The final hidden states [B*S, H] after the last forward (for tests that compare logits).
  const void* final_hidden() const;

 private:
  struct Activations;
  struct LayerActs;
  // Calls visit(buffer, elements, dtype, tag, term) for every device buffer, sizing the vectors.
  template <class Visit>
  static void layout_buffers(Activations& a, const ModelConfig& cfg, const ModelOptions& opts, int64_t sp_size,
                             Visit&& visit);
  void layer_forward(int l, ParamStore& p, LayerActs& a, const void* x_in, void* x_out);
  // The one q|k|v projection's rows (Activations::qkv) split into q, k, v, or (to_rows, their
  // gradients) gathered back.
  void qkv_columns(void* q, void* k, void* v, bool to_rows);
  void* mlp_gate_up(int l, ParamStore& p, LayerActs& s, int64_t r, int64_t n, bool compute);
  void mlp_forward(int l, ParamStore& p, LayerActs& s, void* x_out);
  void mlp_backward(int l, ParamStore& p, LayerActs& s);
  // MoE layers: the block that runs layer l (one per MoE layer, or one shared when checkpointing:
  // backward recomputes the layer's forward right before it), and its parameters' pointers.
  MoeBlock& moe_block(int l);
  MoeParams moe_params(int l, ParamStore& p, bool grads) const;
  // The residual stream: layer l reads residual(l) and writes residual(l + 1).
  void* residual(int64_t l);
  // Residual dropout's mask of layer l's attention (site 0) or MLP (site 1) branch, for rows from row0.
  DropoutMask residual_mask(int l, int site, int64_t row0) const;
  // Offloaded checkpoints: residual(l) to host slot l (D2H stream), or back (H2D stream).
  void move_checkpoint(int64_t l, bool to_host, ModelHooks& hooks);
  void layer_backward(int l, ParamStore& p, LayerActs& a, const void* x_in);
  void head_forward_backward(ParamStore& p, float loss_scale, bool backward);
  // Ulysses: [B, S/P, heads, D] (local tokens, all heads) <-> [B, S, heads/P, D] (all tokens,
  // this rank's heads), through the sequence-parallel all-to-all.
  void scatter_heads(void* full, const void* local, int64_t heads);
  void gather_heads(void* local, const void* full, int64_t heads);
  int sp_size() const { return opts_.sequence_parallel ? opts_.sequence_parallel->size() : 1; }
  int sp_rank() const { return opts_.sequence_parallel ? opts_.sequence_parallel->rank() : 0; }
  // The kinds of mask the layers use: per distinct window, without and with packed rows (then
  // with a placeholder doc_start), with sinks (a placeholder) where the model has them.
  static std::vector<AttentionMask> attention_mask_kinds(const ModelConfig& cfg);
  // Layer l's mask for the current batch (the same in forward, recompute and backward), and where
  // its sinks' gradient goes: this rank's heads (a block of Hq/P under Ulysses).
  AttentionMask attention_mask(int l, ParamStore& p) const;
  void* sinks_grad(int l, ParamStore& p) const;
  // The RMSNorm over `rows` rows of `dim` values, the rotary embedding of `heads` heads per token,
  // and the KV heads' copies for Ulysses (kv_copies_ each), of the current micro-batch.
  RmsNormShape rmsnorm_shape(int64_t rows, int64_t dim) const;
  Rope rope_of(int64_t heads) const;
  HeadReplication kv_replication() const;
  // out = in W^T (+ bias) (+ beta * out). A bias is broadcast into out first by a K = 1 GEMM with
  // a column of ones, so the product is added onto it with one rounding and no op of its own.
  void linear(const void* in, const void* w, void* out, int64_t rows, int64_t out_dim, int64_t in_dim, float beta,
              const void* bias = nullptr);
  // dw += dout^T in, din = dout W (+ din_beta * din), dbias += dout^T ones (when given).
  void linear_backward(const void* dout, const void* in, const void* w, void* din, void* dw, int64_t rows,
                       int64_t out_dim, int64_t in_dim, float din_beta, void* dbias = nullptr);

  Backend& backend_;
  Ops& ops_;
  Stream& stream_;
  ModelConfig cfg_;
  ModelOptions opts_;
  ParamLayout layout_;
  std::unique_ptr<Activations> acts_;
  int64_t kv_copies_ = 1;            // Ulysses with more ranks than KV heads: copies of each KV head sent
  float rope_scale_ = 1.0f;          // cos and sin factor of the RoPE table (yarn's attention factor)
  bool dropping_ = false;            // this forward drops residual branches (training with residual_dropout > 0)
  bool dropping_attention_ = false;  // and attention probabilities (training with attention_dropout > 0)
  int64_t first_sample_ = 0;
  std::vector<std::unique_ptr<MoeBlock>> moe_;
  std::vector<int> moe_of_layer_;  // index into moe_, -1 for a dense layer
  DeviceBuffer expert_counts_;     // int64 [layer][E] on the device (dense layers' rows unused)
  // queue_step_figures' copy: the counts (int64 [layer][E]), then the loss (fp32); pinned.
  HostBuffer figures_host_;
  std::unique_ptr<Event> figures_copied_;
  bool figures_queued_ = false;
  // The load-balancing loss (ModelConfig::Moe::aux_loss) of each forward: transformers'
  // load_balancing_loss_func over this micro-batch's MoE layers, computed on the device from the
  // layers' selections and router probabilities (aux_sums_, fp64 [2][E]): its loss-scaled value
  // added to the loss accumulator and its gradient per router probability, the same for every
  // token and layer, in aux_dprob_ [E] for the layers' backward (Ops::moe_aux_loss).
  void aux_loss_forward(float loss_scale);
  DeviceBuffer aux_sums_, aux_dprob_;
  std::unique_ptr<MoeScratch> moe_scratch_;
};

}  // namespace so
