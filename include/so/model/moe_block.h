#pragma once
// The mixture-of-experts block of a decoder layer, as transformers' Qwen3MoeSparseMoeBlock and
// GptOssMLP compute it: a router (linear, optional bias) picks k of E experts per token, each
// expert is a gated MLP (optional biases), and the outputs are summed with the routing weights.
// Built only from backend ops (so/backend/ops.h), so every backend runs the same block.
//
// Expert weights are kept as each family's checkpoint holds them (Qwen3-MoE's per-expert
// nn.Linear weights; GPT-OSS's fused, interleaved [E, H, 2I] tensors, one pointer per expert).
#include <cstdint>
#include <vector>

#include "so/backend/backend.h"

namespace so {

struct MoeSpec {
  MoeRouting routing;
  int64_t hidden = 0, intermediate = 0;  // H and the experts' I
  enum class Experts {
    SwiGLU,     // Qwen3-MoE: per expert gate and up [I, H], down [H, I] (nn.Linear weights), silu(gate) * up
    GptOssGLU,  // GPT-OSS: per expert gate_up [H, 2I] (gate, up interleaved in the columns) and down [I, H],
                // applied as x @ W, biases [2I] and [H], the clamped GLU
  } experts = Experts::SwiGLU;
  float glu_alpha = 1.702f, glu_limit = 7.0f;  // GptOssGLU: swiglu_alpha, swiglu_limit
};

// Pointers in the block's storage dtype, one per expert (the engine need not keep experts
// adjacent), shaped as MoeSpec::Experts says: SwiGLU fills gate, up and down; GptOssGLU gate_up,
// down and the biases gate_up_bias, down_bias. router_bias is null when the family has none.
struct MoeParams {
  void* router = nullptr;  // [E, H]
  void* router_bias = nullptr;
  std::vector<void*> gate, up, gate_up, down;
  std::vector<void*> gate_up_bias, down_bias;
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
  // (one forward in flight per block). Nothing comes back to the host: the experts' GEMMs read
  // their row offsets on the device.
  void forward(Stream& s, void* out, const void* x, const MoeParams& w, int64_t T, bool accumulate = false);
  // dx[T, H] (+= when accumulate) and every gradient in g (+=) from dout[T, H], for the last
  // forward's x. aux_dprob [E] (fp32, or null): the load-balancing loss's gradient per token and
  // expert probability.
  void backward(Stream& s, MoeScratch& scratch, void* dx, const MoeParams& w, const MoeParams& g, const void* dout,
                const void* x, bool accumulate, const float* aux_dprob = nullptr);

  // Where each expert's rows start in the last forward ([E + 1] int32, backend memory): the tokens
  // each expert received (moe_expert_stats: the metrics and the aux loss).
  const int32_t* expert_offsets() const { return offsets_.as<int32_t>(); }
  // Router logits [T, E] (fp32) of the last forward.
  const float* router_logits() const { return logits_.as<float>(); }

 private:
  // out[rows, N] = beta * out + in[rows, K] @ op(weight_e) (+ bias_e), per expert's rows;
  // op = transpose for nn.Linear weights [N, K], none for x @ W weights [K, N].
  void expert_gemm(Stream& s, void* out, const void* in, const std::vector<void*>& weight, bool linear,
                   const std::vector<void*>& bias, int64_t N, int64_t K, float beta);
  // dweight_e[M, N] += a_e^T @ b_e (a: [rows, M], b: [rows, N]), per expert.
  void weight_grad(Stream& s, const std::vector<void*>& dweight, const void* a, int64_t M, const void* b, int64_t N);
  // dbias_e[N] += the sum of dout_e's rows [rows, N], per expert.
  void bias_grad(Stream& s, const std::vector<void*>& dbias, const void* dout, int64_t N);
  void check_params(const MoeParams& w, const char* what) const;
  // A GroupedGemm over the experts' rows of the last forward (offsets_ on the device).
  GroupedGemm expert_groups() const;

  Backend& backend_;
  MoeSpec spec_;
  DType dt_;
  int64_t T_ = 0, capacity_ = 0;
  DeviceBuffer logits_, weights_, experts_, slot_of_, row_of_, offsets_, ones_;
  DeviceBuffer xs_, gate_, up_, act_, y_;  // [T*k, *] in expert order
};

}  // namespace so
