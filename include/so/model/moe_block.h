#pragma once
// The mixture-of-experts block of a decoder layer, as transformers' Qwen3MoeSparseMoeBlock and
// GptOssMLP compute it: a router (linear, optional bias) picks k of E experts per token, each
// expert is a gated MLP (optional biases), and the outputs are summed with the routing weights.
// Built only from backend ops (so/backend/ops.h), so every backend runs the same block.
//
// Expert weights are nn.Linear weights, one per expert (transformers' per-expert checkpoint
// names); loaders split or transpose the families' fused tensors into them.
#include <cstdint>
#include <vector>

#include "so/backend/backend.h"

namespace so {

struct MoeSpec {
  MoeRouting routing;
  int64_t hidden = 0, intermediate = 0;  // H and the experts' I
  enum class Activation { SwiGLU, ClampedSwiGLU } activation = Activation::SwiGLU;
  float glu_alpha = 1.702f, glu_limit = 7.0f;  // ClampedSwiGLU (GPT-OSS's swiglu_alpha/limit)
};

// Pointers in the block's storage dtype. Each expert's tensors are their own (the engine need not
// keep experts adjacent): gate and up [I, H], down [H, I], biases [I], [I], [H]; the bias lists
// are empty when the family has none, as router_bias is null.
struct MoeParams {
  void* router = nullptr;  // [E, H]
  void* router_bias = nullptr;
  std::vector<void*> gate, up, down;
  std::vector<void*> gate_bias, up_bias, down_bias;
};

// A device buffer of the block, for the memory planner: its name, bytes and whether it is kept
// from forward to backward (per block) or backward scratch (one set shared by every block).
struct MoeBuffer {
  const char* tag;
  size_t bytes;
  bool kept;
};

// Backward's temporaries, shared by every block of a model (one layer's backward runs at a time).
struct MoeScratch {
  MoeScratch(Backend& backend, const MoeSpec& spec, int64_t max_tokens, DType dt);
  DeviceBuffer dy, dweights, dact, dgate, dup, dxs, dlogits, dlogits_dt;
};

class MoeBlock {
 public:
  // Buffers for up to max_tokens tokens per forward, allocated here.
  MoeBlock(Backend& backend, const MoeSpec& spec, int64_t max_tokens, DType dt);
  // Every buffer a block (kept) and the shared scratch allocate, for max_tokens.
  static std::vector<MoeBuffer> buffers(const MoeSpec& spec, int64_t max_tokens, DType dt);

  // out[T, H] = (out +, when accumulate) the block applied to x[T, H]; keeps what backward needs
  // (one forward in flight per block). Synchronises the stream once: the experts' GEMM sizes
  // are read on the host.
  void forward(Stream& s, void* out, const void* x, const MoeParams& w, int64_t T, bool accumulate = false);
  // dx[T, H] (+= when accumulate) and every gradient in g (+=) from dout[T, H], for the last
  // forward's x. aux_dprob [E] (fp32, or null): the load-balancing loss's gradient per token and
  // expert probability.
  void backward(Stream& s, MoeScratch& scratch, void* dx, const MoeParams& w, const MoeParams& g, const void* dout,
                const void* x, bool accumulate, const float* aux_dprob = nullptr);

  // Tokens each expert received in the last forward (for the metrics and the aux loss).
  const std::vector<int64_t>& tokens_per_expert() const { return rows_; }
  // Router logits [T, E] (fp32) of the last forward.
  const float* router_logits() const { return logits_.as<float>(); }

 private:
  void expert_gemm(Stream& s, void* out, const void* in, const std::vector<void*>& weight,
                   const std::vector<void*>& bias, int64_t N, int64_t K, float beta);
  void weight_grad(Stream& s, const std::vector<void*>& dweight, const std::vector<void*>& dbias, const void* dout,
                   const void* in, int64_t M, int64_t N);
  void check_params(const MoeParams& w, const char* what) const;

  Backend& backend_;
  MoeSpec spec_;
  DType dt_;
  int64_t T_ = 0, capacity_ = 0;
  std::vector<int64_t> rows_;  // tokens per expert (host): the grouped GEMMs' sizes
  DeviceBuffer logits_, weights_, experts_, slot_of_, row_of_, offsets_, ones_;
  DeviceBuffer xs_, gate_, up_, act_, y_;  // [T*k, *] in expert order
};

}  // namespace so
