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
                 s.window > 0 ? str_cat(" window=", s.window) : std::string());
}

// Frontend calls return an error_object; a failure names the call, the stage and the shape.
#define SO_CUDNN_FE(call, ...)                                                                      \
  do {                                                                                              \
    auto so_fe_status_ = (call);                                                                    \
    SO_CHECK(so_fe_status_.is_good(), "cuDNN: ", #call, " failed: ", so_fe_status_.get_message(), \
             " [", __VA_ARGS__, "]");                                                               \
  } while (0)
#define SO_CUDNN_CHECK(call, ...)                                                                    \
  do {                                                                                               \
    const cudnnStatus_t so_cudnn_status_ = (call);                                                   \
    SO_CHECK(so_cudnn_status_ == CUDNN_STATUS_SUCCESS, "cuDNN: ", #call, " failed with status ",    \
             static_cast<int>(so_cudnn_status_), " [", __VA_ARGS__, "]");                            \
  } while (0)

// libcudnn.so.9 loaded once per process; "" or why it could not be.
const std::string& load_cudnn() {
  static const std::string error = [] {
    // The frontend dlopens the CUDA runtime itself, trying 12 before 13: ours, the one we link.
    ::setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", str_cat("libcudart.so.", CUDART_VERSION / 1000).c_str(), /*overwrite=*/0);
    fe::cudnn_dlhandle = ::dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
    if (fe::cudnn_dlhandle == nullptr) return str_cat("cuDNN 9 is not installed where the loader looks (", ::dlerror(), ")");
    const size_t v = fe::detail::get_backend_version();
    if (v < 90000) return str_cat("cuDNN ", fe::detail::convert_version_to_str(v), " is older than 9.0");
    // 9.10.0 and 9.10.1 have SDPA bugs the frontend itself refuses.
    if (v == 91000 || v == 91001) return str_cat("cuDNN ", fe::detail::convert_version_to_str(v), " has known SDPA bugs");
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
enum : int64_t { kQ = 1, kK, kV, kO, kStats, kdO, kdQ, kdK, kdV };

// Row-major [B*S, H*D] is cuDNN's logical [B, H, S, D] with these strides.
std::vector<int64_t> dims(const SdpaShape& s, int64_t H) { return {s.B, H, s.S, s.D}; }
std::vector<int64_t> strides(const SdpaShape& s, int64_t H) { return {s.S * H * s.D, s.D, H * s.D, 1}; }
// lse [B, Hq, S] fp32, packed: the only stats layout every cuDNN 9 honours.
std::vector<int64_t> stats_dims(const SdpaShape& s) { return {s.B, s.Hq, s.S, 1}; }
std::vector<int64_t> stats_strides(const SdpaShape& s) { return {s.Hq * s.S, s.S, 1, 1}; }

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;
TensorPtr input(fe::graph::Graph& g, const char* name, int64_t uid, std::vector<int64_t> d, std::vector<int64_t> st,
                fe::DataType_t type = fe::DataType_t::BFLOAT16) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(d).set_stride(st).set_data_type(type));
}

std::shared_ptr<fe::graph::Graph> new_graph() {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

// Causal with the diagonal at the top left: query i sees keys 0..i (S_q == S_kv); a sliding window
// is the band's left bound: cuDNN keeps key j when j + window > i, transformers' i - j < window.
std::shared_ptr<fe::graph::Graph> forward_graph(const SdpaShape& s) {
  auto g = new_graph();
  auto q = input(*g, "Q", kQ, dims(s, s.Hq), strides(s, s.Hq));
  auto k = input(*g, "K", kK, dims(s, s.Hkv), strides(s, s.Hkv));
  auto v = input(*g, "V", kV, dims(s, s.Hkv), strides(s, s.Hkv));
  auto attrs = fe::graph::SDPA_attributes()
                   .set_name("sdpa_forward")
                   .set_generate_stats(true)
                   .set_attn_scale(s.scale)
                   .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                   .set_diagonal_band_right_bound(0);
  if (s.window > 0) attrs.set_diagonal_band_left_bound(static_cast<int>(s.window));
  auto [o, stats] = g->sdpa(q, k, v, attrs);
  o->set_output(true).set_uid(kO).set_dim(dims(s, s.Hq)).set_stride(strides(s, s.Hq));
  stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim(stats_dims(s)).set_stride(
      stats_strides(s));
  return g;
}

std::shared_ptr<fe::graph::Graph> backward_graph(const SdpaShape& s, bool deterministic) {
  auto g = new_graph();
  auto q = input(*g, "Q", kQ, dims(s, s.Hq), strides(s, s.Hq));
  auto k = input(*g, "K", kK, dims(s, s.Hkv), strides(s, s.Hkv));
  auto v = input(*g, "V", kV, dims(s, s.Hkv), strides(s, s.Hkv));
  auto o = input(*g, "O", kO, dims(s, s.Hq), strides(s, s.Hq));
  auto d_o = input(*g, "dO", kdO, dims(s, s.Hq), strides(s, s.Hq));
  auto stats = input(*g, "Stats", kStats, stats_dims(s), stats_strides(s), fe::DataType_t::FLOAT);
  auto attrs = fe::graph::SDPA_backward_attributes()
                   .set_name("sdpa_backward")
                   .set_attn_scale(s.scale)
                   .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                   .set_diagonal_band_right_bound(0)
                   .set_deterministic_algorithm(deterministic);
  if (s.window > 0) attrs.set_diagonal_band_left_bound(static_cast<int>(s.window));
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, d_o, stats, attrs);
  dq->set_output(true).set_uid(kdQ).set_dim(dims(s, s.Hq)).set_stride(strides(s, s.Hq));
  dk->set_output(true).set_uid(kdK).set_dim(dims(s, s.Hkv)).set_stride(strides(s, s.Hkv));
  dv->set_output(true).set_uid(kdV).set_dim(dims(s, s.Hkv)).set_stride(strides(s, s.Hkv));
  return g;
}

}  // namespace

std::string cudnn_sdpa_shape_refusal(const SdpaShape& s) {
  if (s.B <= 0 || s.S <= 0 || s.Hq <= 0 || s.Hkv <= 0 || s.D <= 0) return "a dimension is not positive";
  if (s.S < 2) return "one token per sequence (cuDNN's backward needs S >= 2)";
  if (s.Hq % s.Hkv != 0) return "query heads are not a multiple of key/value heads";
  if (s.D % 8 != 0 || s.D > 256) return str_cat("head dimension ", s.D, " (cuDNN takes multiples of 8 up to 256)");
  if (!std::isfinite(s.scale)) return "the attention scale is not finite";
  if (s.window < 0 || s.window > INT32_MAX) return str_cat("sliding window ", s.window, " out of range");
  return "";
}

struct CudnnSdpa::Impl {
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, uint32_t, bool>;
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
    const Key key{s.B, s.S, s.Hq, s.Hkv, s.D, s.window, scale_bits, backward};
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
  void run(Graph& g, cudaStream_t stream, std::unordered_map<int64_t, void*>& pack, void* workspace,
           const SdpaShape& s, const char* direction) {
    const auto what = [&] { return str_cat("cuDNN SDPA ", direction, " ", shape_text(s)); };  // called on failure only
    SO_CHECK(g.workspace == 0 || workspace != nullptr, what(), ": needs ", g.workspace, " bytes of workspace");
    for (const auto& [uid, p] : pack)  // cuDNN's kernels load bf16 tensors 16 bytes at a time
      SO_CHECK(uid == kStats || (reinterpret_cast<uintptr_t>(p) & 15u) == 0, what(), ": tensor ", uid,
               " is not 16-byte aligned");
    SO_CUDNN_CHECK(fe::detail::set_stream(handle, stream), what());
    SO_CUDNN_FE(g.graph->execute(handle, pack, workspace), what());
  }
};

CudnnSdpa::CudnnSdpa(bool deterministic_backward) : deterministic_(deterministic_backward), impl_(std::make_unique<Impl>()) {
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
  if (major == 9 && s.S % 128 == 64 && fe::detail::get_backend_version() < 92600)
    return str_cat("S=", s.S, " is 64 mod 128, where cuDNN ", version(),
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

void CudnnSdpa::forward(cudaStream_t stream, const SdpaShape& s, void* out, float* lse, const void* q, const void* k,
                        const void* v, void* workspace) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl::Graph& g = impl_->get(s, false, deterministic_);
  std::unordered_map<int64_t, void*> pack = {{kQ, const_cast<void*>(q)}, {kK, const_cast<void*>(k)},
                                             {kV, const_cast<void*>(v)}, {kO, out}, {kStats, lse}};
  impl_->run(g, stream, pack, workspace, s, "forward");
}

void CudnnSdpa::backward(cudaStream_t stream, const SdpaShape& s, void* dq, void* dk, void* dv, const void* dout,
                         const void* q, const void* k, const void* v, const void* out, const float* lse,
                         void* workspace) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl::Graph& g = impl_->get(s, true, deterministic_);
  std::unordered_map<int64_t, void*> pack = {
      {kQ, const_cast<void*>(q)},     {kK, const_cast<void*>(k)},          {kV, const_cast<void*>(v)},
      {kO, const_cast<void*>(out)},   {kdO, const_cast<void*>(dout)},      {kStats, const_cast<float*>(lse)},
      {kdQ, dq},                      {kdK, dk},                           {kdV, dv}};
  impl_->run(g, stream, pack, workspace, s, "backward");
}

}  // namespace so::cuda
