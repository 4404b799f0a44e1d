// cuDNN fused SDPA through the frontend's graph API (cudnn_sdpa.h). Built with
// NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING and CUDNN_FRONTEND_SKIP_JSON_LIB (src/CMakeLists.txt):
// cuDNN is dlopen'ed here, and the frontend's JSON serialisers (float as a hex string, ...) never
// meet the project's nlohmann::json.
#include "cudnn_sdpa.h"

#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include <cudnn_frontend.h>

#include "cuda_check.h"
#include "so/core/error.h"

namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;  // the frontend resolves every cuDNN symbol through it
}

namespace so::cuda {

namespace fe = cudnn_frontend;

namespace {

std::string shape_text(const SdpaShape& s) {
  return str_cat("B=", s.B, " S=", s.S, " Hq=", s.Hq, " Hkv=", s.Hkv, " D=", s.D,
                 s.window > 0 ? str_cat(" window=", s.window) : std::string(), s.lengths ? " lengths" : "",
                 s.sequences > 0 ? str_cat(" ragged ", s.sequences, "x", s.longest) : std::string(),
                 s.sinks ? " sinks" : "");
}

// Frontend calls return an error_object; a failure names the call, the stage and the shape.
#define SO_CUDNN_FE(call, ...)                                                                                       \
  do {                                                                                                               \
    auto so_fe_status_ = (call);                                                                                     \
    SO_CHECK(so_fe_status_.is_good(), "cuDNN: ", #call, " failed: ", so_fe_status_.get_message(), " [", __VA_ARGS__, \
             "]");                                                                                                   \
  } while (0)
#define SO_CUDNN_CHECK(call, ...)                                                                \
  do {                                                                                           \
    const cudnnStatus_t so_cudnn_status_ = (call);                                               \
    SO_CHECK(so_cudnn_status_ == CUDNN_STATUS_SUCCESS, "cuDNN: ", #call, " failed with status ", \
             static_cast<int>(so_cudnn_status_), " [", __VA_ARGS__, "]");                        \
  } while (0)

// libcudnn.so.9 loaded once per process; "" or why it could not be.
const std::string& load_cudnn() {
  static const std::string error = [] {
    // The frontend dlopens the CUDA runtime itself, trying 12 before 13: ours, the one we link.
    ::setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", str_cat("libcudart.so.", CUDART_VERSION / 1000).c_str(),
             /*overwrite=*/0);
    fe::cudnn_dlhandle = ::dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
    if (fe::cudnn_dlhandle == nullptr)
      return str_cat("cuDNN 9 is not installed where the loader looks (", ::dlerror(), ")");
    const size_t v = fe::detail::get_backend_version();
    if (v < 90000) return str_cat("cuDNN ", fe::detail::convert_version_to_str(v), " is older than 9.0");
    // 9.10.0 and 9.10.1 have SDPA bugs the frontend itself refuses.
    if (v == 91000 || v == 91001)
      return str_cat("cuDNN ", fe::detail::convert_version_to_str(v), " has known SDPA bugs");
    // The deterministic backward on Hopper: from cuDNN 9.25 the frontend can order the dQ
    // accumulation (workspace B*Hq*S*D*4, linear in S) instead of materialising dP (B*Hq*S^2*2),
    // but takes that path only when this limit is below dP's size: 0 asks for it at every S (read
    // when a graph is built; the atomic backward ignores it). A limit set by the user is kept.
    ::setenv("CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT", "0", /*overwrite=*/0);
    return std::string();
  }();
  return error;
}

// Fixed tensor ids: execute() binds device pointers by id.
enum : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kdO,
  kdQ,
  kdK,
  kdV,
  kSeqQ,
  kSeqKV,
  kOffsetQ,
  kOffsetKV,
  kOffsetStats,
  kSink
};

// The graph's sequences and their longest: the rows, or the ragged sequences.
int64_t graph_b(const SdpaShape& s) { return s.sequences > 0 ? s.sequences : s.B; }
int64_t graph_s(const SdpaShape& s) { return s.sequences > 0 ? s.longest : s.S; }

// Row-major [B*S, H*D] is cuDNN's logical [b, H, s, D] with these strides (ragged: the batch
// stride is replaced by each sequence's offset; token-major THD).
std::vector<int64_t> dims(const SdpaShape& s, int64_t H) { return {graph_b(s), H, graph_s(s), s.D}; }
std::vector<int64_t> strides(const SdpaShape& s, int64_t H) { return {graph_s(s) * H * s.D, s.D, H * s.D, 1}; }
// lse [B, Hq, S] fp32, packed: the only non-ragged stats layout every cuDNN 9 honours. Ragged
// stats are token-major [B*S, Hq] (the layout NVIDIA's own ragged tests use).
std::vector<int64_t> stats_dims(const SdpaShape& s) { return {graph_b(s), s.Hq, graph_s(s), 1}; }
std::vector<int64_t> stats_strides(const SdpaShape& s) {
  if (s.sequences > 0) return {s.longest * s.Hq, 1, s.Hq, 1};
  return {s.Hq * s.S, s.S, 1, 1};
}

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;
TensorPtr input(fe::graph::Graph& g, const char* name, int64_t uid, std::vector<int64_t> d, std::vector<int64_t> st,
                fe::DataType_t type = fe::DataType_t::BFLOAT16) {
  return g.tensor(
      fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(d).set_stride(st).set_data_type(type));
}

std::shared_ptr<fe::graph::Graph> new_graph() {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

// The inputs every graph of a shape shares: lengths and offsets (null where the shape has none).
struct VarLen {
  TensorPtr seq_q, seq_kv, offset_q, offset_kv, offset_stats;
};
VarLen var_len_inputs(fe::graph::Graph& g, const SdpaShape& s) {
  VarLen v;
  if (!s.lengths) return v;
  const int64_t b = graph_b(s);
  v.seq_q = input(g, "seq_q", kSeqQ, {b, 1, 1, 1}, {1, 1, 1, 1}, fe::DataType_t::INT32);
  v.seq_kv = input(g, "seq_kv", kSeqKV, {b, 1, 1, 1}, {1, 1, 1, 1}, fe::DataType_t::INT32);
  if (s.sequences > 0) {
    v.offset_q = input(g, "offset_q", kOffsetQ, {b + 1, 1, 1, 1}, {1, 1, 1, 1}, fe::DataType_t::INT64);
    v.offset_kv = input(g, "offset_kv", kOffsetKV, {b + 1, 1, 1, 1}, {1, 1, 1, 1}, fe::DataType_t::INT64);
    v.offset_stats = input(g, "offset_stats", kOffsetStats, {b + 1, 1, 1, 1}, {1, 1, 1, 1}, fe::DataType_t::INT64);
  }
  return v;
}
void set_offset(const TensorPtr& t, const TensorPtr& offset) {
  if (offset) t->set_ragged_offset(offset);
}

// Causal with the diagonal at the top left of each sequence: query i sees keys 0..i (and, with
// lengths, none at or past the sequence's key length: a padding query still sees the sequence's
// tokens, as transformers' attention_mask gives); a sliding window is the band's left bound:
// cuDNN keeps key j when j + window > i, transformers' i - j < window.
template <typename Attrs>
void set_mask(Attrs& attrs, const SdpaShape& s, const VarLen& v) {
  attrs.set_attn_scale(s.scale)
      .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
      .set_diagonal_band_right_bound(0);
  if (s.window > 0) attrs.set_diagonal_band_left_bound(static_cast<int>(s.window));
  if (s.lengths) attrs.set_padding_mask(true).set_seq_len_q(v.seq_q).set_seq_len_kv(v.seq_kv);
  // The token axis's extent: cuDNN sizes ragged workspaces by it instead of sequences x longest.
  if (s.sequences > 0) attrs.set_max_total_seq_len_q(s.B * s.S).set_max_total_seq_len_kv(s.B * s.S);
}

std::shared_ptr<fe::graph::Graph> forward_graph(const SdpaShape& s) {
  auto g = new_graph();
  const VarLen vl = var_len_inputs(*g, s);
  auto q = input(*g, "Q", kQ, dims(s, s.Hq), strides(s, s.Hq));
  auto k = input(*g, "K", kK, dims(s, s.Hkv), strides(s, s.Hkv));
  auto v = input(*g, "V", kV, dims(s, s.Hkv), strides(s, s.Hkv));
  set_offset(q, vl.offset_q);
  set_offset(k, vl.offset_kv);
  set_offset(v, vl.offset_kv);
  auto attrs = fe::graph::SDPA_attributes().set_name("sdpa_forward").set_generate_stats(true);
  set_mask(attrs, s, vl);
  if (s.sinks) attrs.set_sink_token(input(*g, "sink", kSink, {1, s.Hq, 1, 1}, {s.Hq, 1, 1, 1}, fe::DataType_t::FLOAT));
  auto [o, stats] = g->sdpa(q, k, v, attrs);
  o->set_output(true).set_uid(kO).set_dim(dims(s, s.Hq)).set_stride(strides(s, s.Hq));
  set_offset(o, vl.offset_q);
  stats->set_output(true)
      .set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim(stats_dims(s))
      .set_stride(stats_strides(s));
  set_offset(stats, vl.offset_stats);
  return g;
}

// The sinks enter the backward only through the forward's stats (P = exp(score - lse), lse the
// sink's included); their own gradient is the caller's (cudnn_attention.cpp), so the graph has none.
std::shared_ptr<fe::graph::Graph> backward_graph(const SdpaShape& s, bool deterministic) {
  auto g = new_graph();
  const VarLen vl = var_len_inputs(*g, s);
  auto q = input(*g, "Q", kQ, dims(s, s.Hq), strides(s, s.Hq));
  auto k = input(*g, "K", kK, dims(s, s.Hkv), strides(s, s.Hkv));
  auto v = input(*g, "V", kV, dims(s, s.Hkv), strides(s, s.Hkv));
  auto o = input(*g, "O", kO, dims(s, s.Hq), strides(s, s.Hq));
  auto d_o = input(*g, "dO", kdO, dims(s, s.Hq), strides(s, s.Hq));
  auto stats = input(*g, "Stats", kStats, stats_dims(s), stats_strides(s), fe::DataType_t::FLOAT);
  for (const TensorPtr& t : {q, o, d_o}) set_offset(t, vl.offset_q);
  for (const TensorPtr& t : {k, v}) set_offset(t, vl.offset_kv);
  set_offset(stats, vl.offset_stats);
  auto attrs =
      fe::graph::SDPA_backward_attributes().set_name("sdpa_backward").set_deterministic_algorithm(deterministic);
  set_mask(attrs, s, vl);
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, d_o, stats, attrs);
  dq->set_output(true).set_uid(kdQ).set_dim(dims(s, s.Hq)).set_stride(strides(s, s.Hq));
  dk->set_output(true).set_uid(kdK).set_dim(dims(s, s.Hkv)).set_stride(strides(s, s.Hkv));
  dv->set_output(true).set_uid(kdV).set_dim(dims(s, s.Hkv)).set_stride(strides(s, s.Hkv));
  set_offset(dq, vl.offset_q);
  set_offset(dk, vl.offset_kv);
  set_offset(dv, vl.offset_kv);
  return g;
}

// The device pointers of one call, by tensor id (those the graph has).
std::unordered_map<int64_t, void*> variant_pack(const SdpaShape& s, const SdpaTensors& t, bool backward) {
  auto m = [](const void* p) { return const_cast<void*>(p); };
  std::unordered_map<int64_t, void*> pack = {{kQ, m(t.q)}, {kK, m(t.k)}, {kV, m(t.v)}, {kO, t.out}, {kStats, t.stats}};
  if (backward) {
    pack.insert({{kdO, m(t.dout)}, {kdQ, t.dq}, {kdK, t.dk}, {kdV, t.dv}});
  } else if (s.sinks) {
    pack.insert({kSink, m(t.sinks)});
  }
  if (s.lengths) pack.insert({{kSeqQ, m(t.seq_q)}, {kSeqKV, m(t.seq_kv)}});
  if (s.sequences > 0)
    pack.insert({{kOffsetQ, m(t.offset_q)}, {kOffsetKV, m(t.offset_kv)}, {kOffsetStats, m(t.offset_stats)}});
  return pack;
}

}  // namespace

std::string cudnn_sdpa_shape_refusal(const SdpaShape& s) {
  if (s.B <= 0 || s.S <= 0 || s.Hq <= 0 || s.Hkv <= 0 || s.D <= 0) return "a dimension is not positive";
  if (s.S < 2) return "one token per sequence (cuDNN's backward needs S >= 2)";
  if (s.Hq % s.Hkv != 0) return "query heads are not a multiple of key/value heads";
  if (s.D % 8 != 0 || s.D > 256) return str_cat("head dimension ", s.D, " (cuDNN takes multiples of 8 up to 256)");
  if (!std::isfinite(s.scale)) return "the attention scale is not finite";
  if (s.window < 0 || s.window > INT32_MAX) return str_cat("sliding window ", s.window, " out of range");
  if (s.sequences > 0 && !s.lengths) return "ragged sequences without lengths";
  // cuDNN sizes a ragged backward's workspace by the token count only for D a multiple of 16
  // (otherwise sequences x longest x heads x D floats).
  if (s.sequences > 0 && s.D % 16 != 0)
    return str_cat("head dimension ", s.D, " with packed documents (cuDNN's ragged layout needs a multiple of 16)");
  if (s.sequences > 0 && (s.longest < 2 || s.longest > s.S))
    return str_cat("longest sequence ", s.longest, " outside [2, S]");
  return "";
}

struct CudnnSdpa::Impl {
  using Key =
      std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, uint32_t, bool, bool, int64_t, int64_t, bool>;
  struct Graph {
    std::shared_ptr<fe::graph::Graph> graph;
    int64_t workspace = 0;
  };
  cudnnHandle_t handle = nullptr;
  int device = -1;
  std::mutex mu;
  std::map<Key, Graph> graphs;

  ~Impl() {
    graphs.clear();  // plans refer to the handle
    if (handle != nullptr) fe::detail::destroy_handle(handle);
  }

  // The graph of a shape and direction, built on first use (every check and message then; a cached
  // graph costs one lookup per call). Caller holds mu.
  Graph& get(const SdpaShape& s, bool backward, bool deterministic) {
    int current = -1;
    SO_CUDA_CHECK(cudaGetDevice(&current));
    SO_CHECK(current == device, "cuDNN SDPA ", shape_text(s), ": called on device ", current, "; the handle is device ",
             device, "'s");
    uint32_t scale_bits = 0;
    std::memcpy(&scale_bits, &s.scale, sizeof scale_bits);
    const Key key{s.B,        s.S,      s.Hq,      s.Hkv,       s.D,       s.window,
                  scale_bits, backward, s.lengths, s.sequences, s.longest, s.sinks && !backward};
    if (auto it = graphs.find(key); it != graphs.end()) return it->second;
    const std::string what = str_cat("cuDNN SDPA ", backward ? "backward" : "forward", " ", shape_text(s));
    const std::string refusal = cudnn_sdpa_shape_refusal(s);
    SO_CHECK(refusal.empty(), what, ": ", refusal);
    SO_CHECK(load_cudnn().empty(), what, ": ", load_cudnn());
    if (handle == nullptr) SO_CUDNN_CHECK(fe::detail::create_handle(&handle), what);
    Graph g;
    g.graph = backward ? backward_graph(s, deterministic) : forward_graph(s);
    SO_CUDNN_FE(g.graph->validate(), what);
    SO_CUDNN_FE(g.graph->build_operation_graph(handle), what);
    SO_CUDNN_FE(g.graph->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), what);
    SO_CUDNN_FE(g.graph->check_support(), what);
    SO_CUDNN_FE(g.graph->build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), what);
    SO_CUDNN_FE(g.graph->get_workspace_size(g.workspace), what);
    return graphs.emplace(key, std::move(g)).first->second;
  }

  // Messages name the call: "cuDNN SDPA forward|backward <shape>", built only when one fails.
  void run(Graph& g, cudaStream_t stream, std::unordered_map<int64_t, void*>& pack, void* workspace, const SdpaShape& s,
           const char* direction) {
    const auto what = [&] { return str_cat("cuDNN SDPA ", direction, " ", shape_text(s)); };  // called on failure only
    SO_CHECK(g.workspace == 0 || workspace != nullptr, what(), ": needs ", g.workspace, " bytes of workspace");
    for (const auto& [uid, p] : pack) {
      SO_CHECK(p != nullptr, what(), ": tensor ", uid, " is null");
      // cuDNN's kernels load bf16 tensors 16 bytes at a time
      SO_CHECK(uid > kdV || uid == kStats || (reinterpret_cast<uintptr_t>(p) & 15u) == 0, what(), ": tensor ", uid,
               " is not 16-byte aligned");
    }
    SO_CUDNN_CHECK(fe::detail::set_stream(handle, stream), what());
    SO_CUDNN_FE(g.graph->execute(handle, pack, workspace), what());
  }
};

CudnnSdpa::CudnnSdpa(bool deterministic_backward)
    : deterministic_(deterministic_backward), impl_(std::make_unique<Impl>()) {
  SO_CUDA_CHECK(cudaGetDevice(&impl_->device));
}

CudnnSdpa::~CudnnSdpa() = default;

std::string CudnnSdpa::version() const {
  return load_cudnn().empty() ? fe::detail::get_backend_version_string() : "none";
}

std::string CudnnSdpa::check_support(const SdpaShape& s) {
  if (std::string refusal = cudnn_sdpa_shape_refusal(s); !refusal.empty()) return refusal;
  if (const std::string& error = load_cudnn(); !error.empty()) return error;
  int major = 0;
  SO_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, impl_->device));
  if (major == 9 && graph_s(s) % 128 == 64 && fe::detail::get_backend_version() < 92600)
    return str_cat("S=", graph_s(s), " is 64 mod 128, where cuDNN ", version(),
                   "'s Hopper backward can return NaN (fixed in cuDNN 9.26)");
  std::lock_guard<std::mutex> lock(impl_->mu);
  try {
    impl_->get(s, false, deterministic_);
    impl_->get(s, true, deterministic_);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

size_t CudnnSdpa::forward_workspace(const SdpaShape& s) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return static_cast<size_t>(impl_->get(s, false, deterministic_).workspace);
}

size_t CudnnSdpa::backward_workspace(const SdpaShape& s) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return static_cast<size_t>(impl_->get(s, true, deterministic_).workspace);
}

void CudnnSdpa::forward(cudaStream_t stream, const SdpaShape& s, const SdpaTensors& t, void* workspace) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl::Graph& g = impl_->get(s, false, deterministic_);
  std::unordered_map<int64_t, void*> pack = variant_pack(s, t, false);
  impl_->run(g, stream, pack, workspace, s, "forward");
}

void CudnnSdpa::backward(cudaStream_t stream, const SdpaShape& s, const SdpaTensors& t, void* workspace) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl::Graph& g = impl_->get(s, true, deterministic_);
  std::unordered_map<int64_t, void*> pack = variant_pack(s, t, true);
  impl_->run(g, stream, pack, workspace, s, "backward");
}

}  // namespace so::cuda
