// Attention through cuDNN's SDPA for every mask of a fine-tuning row (cudnn_attention.h).
#include "cudnn_attention.h"

#include <algorithm>
#include <cstdint>

#include "cuda_attention.h"
#include "cuda_kernels.h"
#include "cudnn_attention_kernels.h"
#include "cudnn_sdpa.h"
#include "so/core/error.h"

namespace so::cuda {

namespace {

int64_t next_pow2(int64_t x) {
  int64_t p = 1;
  while (p < x) p <<= 1;
  return p;
}

// The graph a call with `mask` runs. Packed rows: the sequence count and longest sequence rounded
// up to powers of two (at least the rows / 128 tokens; at most the tokens / S), so batches of
// similar documents share a graph; `largest` (or counts the mask does not give) takes the most the
// shape allows, the bound every smaller graph's workspace stays within. `smallest` takes the
// least a batch can ask for (a support check of both ends).
enum class Extent { Call, Largest, Smallest };
SdpaShape sdpa_shape(const AttentionShape& a, const AttentionMask& m, Extent e) {
  SdpaShape s;
  s.B = a.B, s.S = a.S, s.Hq = a.Hq, s.Hkv = a.Hkv, s.D = a.D, s.scale = a.scale, s.window = m.window;
  s.lengths = m.key_end != nullptr || m.doc_start != nullptr;
  if (m.doc_start != nullptr) {
    const int64_t tokens = a.B * a.S, rows = std::min(tokens, next_pow2(a.B)), short_rows = std::min<int64_t>(a.S, 128);
    if (e == Extent::Smallest) {
      s.sequences = rows, s.longest = short_rows;
    } else {
      s.sequences =
          e == Extent::Largest || m.documents <= 0 ? tokens : std::clamp(next_pow2(m.documents), rows, tokens);
      s.longest = e == Extent::Largest || m.longest_document <= 0
                      ? a.S
                      : std::clamp(next_pow2(m.longest_document), short_rows, a.S);
    }
  }
  s.sinks = m.sinks != nullptr;
  return s;
}

// Our part of a call's workspace, after cuDNN's (which starts at the base): lengths and offsets,
// staged stats (ragged: token-major; padded with windows: lse with +inf for rows that see no
// key), the sinks in fp32 (forward) and the rows' dout.out (backward, for the sinks' gradient).
bool staged_stats(const SdpaShape& s, const AttentionMask& m, bool backward) {
  return s.sequences > 0 || (backward && m.key_end != nullptr && m.window > 0);
}

struct Carved {
  int32_t *seq_q = nullptr, *seq_kv = nullptr;
  int64_t *offset_q = nullptr, *offset_kv = nullptr, *offset_stats = nullptr;
  float *stats = nullptr, *sinks = nullptr, *drow = nullptr;
  size_t bytes = 0;
};

// With base null, only the size.
Carved carve(const SdpaShape& s, const AttentionMask& m, bool backward, size_t cudnn_bytes, void* base) {
  constexpr size_t kAlign = 256;
  const auto up = [](size_t n) { return (n + kAlign - 1) / kAlign * kAlign; };
  Carved c;
  c.bytes = up(cudnn_bytes);
  auto take = [&](size_t n) -> void* {
    void* p = base != nullptr ? static_cast<char*>(base) + c.bytes : nullptr;
    c.bytes += up(n);
    return p;
  };
  const auto n = static_cast<size_t>(s.sequences > 0 ? s.sequences : s.B);
  const auto rows = static_cast<size_t>(s.B * s.Hq * s.S);
  if (s.lengths) c.seq_q = static_cast<int32_t*>(take(n * sizeof(int32_t)));
  if (s.sequences > 0) {
    c.seq_kv = static_cast<int32_t*>(take(n * sizeof(int32_t)));
    c.offset_q = static_cast<int64_t*>(take((n + 1) * sizeof(int64_t)));
    c.offset_kv = static_cast<int64_t*>(take((n + 1) * sizeof(int64_t)));
    c.offset_stats = static_cast<int64_t*>(take((n + 1) * sizeof(int64_t)));
  }
  if (staged_stats(s, m, backward)) c.stats = static_cast<float*>(take(rows * sizeof(float)));
  if (s.sinks && !backward) c.sinks = static_cast<float*>(take(static_cast<size_t>(s.Hq) * sizeof(float)));
  if (s.sinks && backward) c.drow = static_cast<float*>(take(rows * sizeof(float)));
  return c;
}

}  // namespace

CudnnAttention::CudnnAttention(bool deterministic_backward, DeviceError* err)
    : sdpa_(std::make_unique<CudnnSdpa>(deterministic_backward)), err_(err) {}

CudnnAttention::~CudnnAttention() = default;

std::string CudnnAttention::version() const { return sdpa_->version(); }

std::string CudnnAttention::mask_text(const AttentionMask& kind) {
  std::string t;
  const auto add = [&](const std::string& part) { t += (t.empty() ? "" : ", ") + part; };
  if (kind.doc_start != nullptr) add("packed documents as ragged sequences");
  if (kind.key_end != nullptr) add("padding as sequence lengths");
  if (kind.window > 0) add(str_cat("sliding window ", kind.window));
  if (kind.sinks != nullptr) add("sinks");
  return t;
}

std::string CudnnAttention::refusal(const AttentionShape& a, const AttentionMask& kind, DType dt) {
  if (dt != DType::BF16) return str_cat("cuDNN's fused attention takes bf16, this run is ", dtype_name(dt));
  // cuDNN's dropout draws Philox bits of its own (or reads a materialised B x H x S x S mask);
  // the CPU reference, recompute and Ulysses shards share our counter-based bits
  // (docs/architecture.md, attention), which cuDNN cannot reproduce.
  if (kind.dropout.p > 0.0f) return "attention dropout uses our counter-based masks, not cuDNN's Philox dropout";
  std::string why = sdpa_->check_support(sdpa_shape(a, kind, Extent::Largest));
  if (why.empty() && kind.doc_start != nullptr) why = sdpa_->check_support(sdpa_shape(a, kind, Extent::Smallest));
  return why;
}

size_t CudnnAttention::workspace_bytes(const AttentionShape& a, const AttentionMask& kind) {
  const SdpaShape s = sdpa_shape(a, kind, Extent::Largest);
  return std::max(carve(s, kind, false, sdpa_->forward_workspace(s), nullptr).bytes,
                  carve(s, kind, true, sdpa_->backward_workspace(s), nullptr).bytes);
}

size_t CudnnAttention::forward_workspace(const AttentionShape& a, const AttentionMask& mask) {
  const SdpaShape s = sdpa_shape(a, mask, Extent::Call);
  return carve(s, mask, false, sdpa_->forward_workspace(s), nullptr).bytes;
}

size_t CudnnAttention::backward_workspace(const AttentionShape& a, const AttentionMask& mask) {
  const SdpaShape s = sdpa_shape(a, mask, Extent::Call);
  return carve(s, mask, true, sdpa_->backward_workspace(s), nullptr).bytes;
}

size_t CudnnAttention::cudnn_backward_workspace(const AttentionShape& a, const AttentionMask& kind) {
  return sdpa_->backward_workspace(sdpa_shape(a, kind, Extent::Largest));
}

namespace {

// Lengths (and, ragged, offsets) of the call's sequences, made on the device.
void prepare_lengths(cudaStream_t stream, const SdpaShape& s, const AttentionShape& a, const AttentionMask& mask,
                     const Carved& w, SdpaTensors& t, DeviceError* err) {
  if (!s.lengths) return;
  if (s.sequences > 0) {
    const RaggedSequences r{w.seq_q, w.seq_kv, w.offset_q, w.offset_kv, w.offset_stats, s.sequences, s.longest};
    launch_ragged_sequences(stream, r, mask.doc_start, mask.key_end, a, err);
    t.seq_q = w.seq_q, t.seq_kv = w.seq_kv;
    t.offset_q = w.offset_q, t.offset_kv = w.offset_kv, t.offset_stats = w.offset_stats;
  } else {
    launch_fill_row_lengths(stream, w.seq_q, a.B, a.S);
    t.seq_q = w.seq_q, t.seq_kv = mask.key_end;
  }
}

}  // namespace

void CudnnAttention::forward(cudaStream_t stream, const AttentionShape& a, const AttentionMask& mask,
                             const AttentionInputs& in, void* out, float* lse, void* workspace) {
  const SdpaShape s = sdpa_shape(a, mask, Extent::Call);
  const Carved w = carve(s, mask, false, sdpa_->forward_workspace(s), workspace);
  SdpaTensors t;
  t.q = in.q.data, t.k = in.k.data, t.v = in.v.data, t.out = out;
  t.stats = s.sequences > 0 ? w.stats : lse;
  prepare_lengths(stream, s, a, mask, w, t, err_);
  if (s.sinks) {
    launch_cast(stream, w.sinks, DType::F32, mask.sinks, in.q.dtype, a.Hq);
    t.sinks = w.sinks;
  }
  sdpa_->forward(stream, s, t, workspace);
  if (s.sequences > 0 || (mask.key_end != nullptr && mask.window > 0))
    launch_forward_fixup(stream, out, lse, s.sequences > 0 ? w.stats : nullptr, mask, t.sinks, a, in.q.dtype);
}

void CudnnAttention::backward(cudaStream_t stream, const AttentionShape& a, const AttentionMask& mask,
                              const AttentionInputs& in, const void* out, const float* lse, const void* dout,
                              const AttentionGrads& g, void* workspace) {
  const SdpaShape s = sdpa_shape(a, mask, Extent::Call);
  const Carved w = carve(s, mask, true, sdpa_->backward_workspace(s), workspace);
  SdpaTensors t;
  t.q = in.q.data, t.k = in.k.data, t.v = in.v.data, t.out = const_cast<void*>(out), t.dout = dout;
  t.dq = g.dq.data, t.dk = g.dk.data, t.dv = g.dv.data;
  prepare_lengths(stream, s, a, mask, w, t, err_);
  if (w.stats != nullptr) {
    launch_backward_stats(stream, w.stats, lse, s.sequences > 0, mask, a);
    t.stats = w.stats;
  } else {
    t.stats = const_cast<float*>(lse);  // read only
  }
  sdpa_->backward(stream, s, t, workspace);
  if (mask.key_end != nullptr) launch_backward_fixup(stream, g.dq.data, g.dk.data, g.dv.data, mask, a, in.q.dtype);
  if (s.sinks) attention_sink_grad(stream, a, mask.sinks, g.dsinks_acc.data, lse, dout, out, w.drow, in.q.dtype);
}

}  // namespace so::cuda
