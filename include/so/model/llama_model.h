#pragma once
// The Llama-family decoder (Llama, Qwen3) with explicit forward and backward, layer by layer,
// enqueued on the backend's compute stream. It owns activations, never parameters.
#include <memory>
#include <vector>

#include "so/backend/backend.h"
#include "so/model/model_config.h"
#include "so/model/model_interfaces.h"
#include "so/model/param_layout.h"

namespace so {

struct ModelOptions {
  DType dtype = DType::F32;
  int64_t micro_batch = 1;           // sequences per micro-batch
  int64_t seq_len = 0;               // tokens per sequence held by this rank (1/P of it under Ulysses)
  bool activation_checkpointing = false;  // keep only each layer's input; recompute in backward
  int64_t loss_chunk_tokens = 0;     // tokens per output-projection + cross-entropy chunk; 0 = auto
  SequenceParallel* sequence_parallel = nullptr;  // Ulysses group; null = the whole sequence is here
};

// One micro-batch on the host: B*S input ids, targets (-1 = ignore) and RoPE positions.
struct TokenBatch {
  std::vector<int32_t> inputs, targets, positions;
};

class LlamaModel {
 public:
  LlamaModel(Backend& backend, const ModelConfig& cfg, const ModelOptions& opts);
  ~LlamaModel();

  const ModelConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  const ModelOptions& options() const { return opts_; }

  // Forward of one micro-batch; adds loss_scale * sum of token losses to the device loss
  // accumulator. With backward = true it then runs the backward pass, accumulating every
  // parameter gradient into params.grad(). The output projection and its gradient are
  // computed chunk by chunk in the forward pass, so [tokens x vocab] logits never exist.
  void forward_backward(const TokenBatch& batch, ParamStore& params, ModelHooks& hooks, float loss_scale,
                        bool backward);

  void zero_loss();
  // Synchronises and returns the accumulated loss.
  float read_loss();
  // The final hidden states [B*S, H] after the last forward (for tests that compare logits).
  const void* final_hidden() const;

 private:
  struct Activations;
  struct LayerActs;
  void layer_forward(int l, ParamStore& p, LayerActs& a, const void* x_in, void* x_out);
  void layer_backward(int l, ParamStore& p, LayerActs& a, const void* x_in);
  void head_forward_backward(ParamStore& p, float loss_scale, bool backward);
  // Ulysses: [B, S/P, heads, D] (local tokens, all heads) <-> [B, S, heads/P, D] (all tokens,
  // this rank's heads), through the sequence-parallel all-to-all.
  void scatter_heads(void* full, const void* local, int64_t heads);
  void gather_heads(void* local, const void* full, int64_t heads);
  int sp_size() const { return opts_.sequence_parallel ? opts_.sequence_parallel->size() : 1; }
  void linear(const void* in, const void* w, void* out, int64_t rows, int64_t out_dim, int64_t in_dim, float beta);
  void linear_backward(const void* dout, const void* in, const void* w, void* din, void* dw, int64_t rows,
                       int64_t out_dim, int64_t in_dim, float din_beta);

  Backend& backend_;
  Ops& ops_;
  Stream& stream_;
  ModelConfig cfg_;
  ModelOptions opts_;
  ParamLayout layout_;
  std::unique_ptr<Activations> acts_;
  int64_t kv_copies_ = 1;  // Ulysses with more ranks than KV heads: copies of each KV head sent
};

}  // namespace so
