#include "cuda_gemm.h"

#include <cublasLt.h>

#include <compare>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda_check.h"
#include "so/core/log.h"

namespace so::cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// Owner of one cuBLASLt object (handle or descriptor), destroyed with its Destroy function.
template <typename T, cublasStatus_t (*Destroy)(T)>
class LtObject {
 public:
  LtObject() = default;
  LtObject(LtObject&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  LtObject& operator=(LtObject&&) = delete;
  LtObject(const LtObject&) = delete;
  ~LtObject() {
    if (!h_) return;
    const cublasStatus_t st = Destroy(h_);
    if (st != CUBLAS_STATUS_SUCCESS)
      log(LogLevel::Error, str_cat("cuBLASLt destroy failed (ignored during cleanup): ", cublasLtGetStatusName(st)));
  }
  T* out() { return &h_; }  // for the Create call, on an empty owner only
  T get() const { return h_; }

 private:
  T h_ = nullptr;
};

using LtHandle = LtObject<cublasLtHandle_t, cublasLtDestroy>;
using MatmulDesc = LtObject<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using Layout = LtObject<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using Preference = LtObject<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

// A cudaMalloc'd workspace.
class Workspace {
 public:
  Workspace() { SO_CUDA_CHECK(cudaMalloc(&ptr_, kWorkspaceBytes)); }
  ~Workspace() { SO_CUDA_WARN(cudaFree(ptr_)); }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

cudaDataType_t cuda_type(DType t) { return t == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F; }

// Largest power of two dividing the address, capped at 256 (what cuBLASLt assumes by default):
// operands are often views into larger buffers, and an algorithm chosen for 256-byte alignment
// may not run on a less aligned pointer.
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

struct Key {
  int64_t M, N, K;
  bool trans_a, trans_b;
  DType ab, c;
  bool beta_nonzero;
  uint32_t align_a, align_b, align_c;
  auto operator<=>(const Key&) const = default;
};

// Everything cublasLtMatmul needs for one Key besides the pointers.
struct Plan {
  MatmulDesc desc;
  Layout a, b, c;  // cuBLASLt's A, B, C (= D): our B, A, C seen column-major
  cublasLtMatmulAlgo_t algo;
};

}  // namespace

constexpr size_t kMaxPlans = 1024;

struct CublasLtGemm::Impl {
  std::mutex mu;  // guards everything below, and each matmul (it uses a stream's workspace)
  LtHandle handle;
  std::map<Key, Plan> plans;
  // One workspace per stream: GEMMs on different streams may overlap and must not share one.
  // The first is allocated at construction; another stream's on its first GEMM.
  std::vector<std::unique_ptr<Workspace>> workspaces;
  std::unordered_map<cudaStream_t, void*> stream_workspace;

  void* workspace_for(cudaStream_t stream) {
    auto it = stream_workspace.find(stream);
    if (it != stream_workspace.end()) return it->second;
    if (stream_workspace.size() == workspaces.size()) workspaces.push_back(std::make_unique<Workspace>());
    void* ws = workspaces[stream_workspace.size()]->get();
    stream_workspace.emplace(stream, ws);
    return ws;
  }
};

CublasLtGemm::CublasLtGemm() : impl_(std::make_unique<Impl>()) {
  SO_CUBLAS_CHECK(cublasLtCreate(impl_->handle.out()));
  impl_->workspaces.push_back(std::make_unique<Workspace>());
}

CublasLtGemm::~CublasLtGemm() = default;

void CublasLtGemm::gemm(cudaStream_t stream, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                        const void* A, const void* B, DType ab, float beta, void* C, DType c) {
  auto what = [&] {
    return str_cat("gemm M=", M, " N=", N, " K=", K, trans_a ? " A^T" : " A", trans_b ? " B^T" : " B", " (",
                   dtype_name(ab), " inputs, ", dtype_name(c), " C, beta=", beta, ")");
  };
  SO_CHECK(M >= 0 && N >= 0 && K >= 0, what(), ": negative size");
  if (M == 0 || N == 0) return;
  if (K == 0) {
    // An empty product: C = beta * C, as BLAS (and so the CPU backend) defines it.
    SO_CHECK(beta == 0.0f || beta == 1.0f, what(), ": K == 0 is supported only with beta 0 or 1");
    if (beta == 0.0f) {
      const cudaError_t err = cudaMemsetAsync(C, 0, static_cast<size_t>(M * N) * dtype_size(c), stream);
      SO_CHECK(err == cudaSuccess, what(), ": cudaMemsetAsync failed: ", cudaGetErrorName(err), " (",
               cudaGetErrorString(err), ")");
    }
    return;
  }
  auto check = [&](cublasStatus_t st, const char* call) {
    if (st != CUBLAS_STATUS_SUCCESS)
      SO_FAIL(what(), ": ", call, " failed: ", cublasLtGetStatusName(st), " (", cublasLtGetStatusString(st), ")");
  };

  std::lock_guard<std::mutex> lock(impl_->mu);
  const Key key{M, N, K, trans_a, trans_b, ab, c, beta != 0.0f, alignment_of(A), alignment_of(B), alignment_of(C)};
  auto it = impl_->plans.find(key);
  if (it == impl_->plans.end()) {
    // Row-major C[M,N] is column-major C^T[N,M] = op(B)^T op(A)^T: cuBLASLt's A is our B and its
    // B our A, with the same transposes; a row-major [r,c] matrix is column-major [c,r], ld c.
    Plan p;
    check(cublasLtMatmulDescCreate(p.desc.out(), CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const int32_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(p.desc.get(), CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)),
          "cublasLtMatmulDescSetAttribute(TRANSA)");
    check(cublasLtMatmulDescSetAttribute(p.desc.get(), CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)),
          "cublasLtMatmulDescSetAttribute(TRANSB)");
    const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
    const int64_t rows_b = trans_b ? K : N, cols_b = trans_b ? N : K;  // B stored [cols_b, rows_b]
    const int64_t rows_a = trans_a ? M : K, cols_a = trans_a ? K : M;  // A stored [cols_a, rows_a]
    check(cublasLtMatrixLayoutCreate(p.a.out(), cuda_type(ab), u(rows_b), u(cols_b), rows_b),
          "cublasLtMatrixLayoutCreate(B)");
    check(cublasLtMatrixLayoutCreate(p.b.out(), cuda_type(ab), u(rows_a), u(cols_a), rows_a),
          "cublasLtMatrixLayoutCreate(A)");
    check(cublasLtMatrixLayoutCreate(p.c.out(), cuda_type(c), u(N), u(M), N), "cublasLtMatrixLayoutCreate(C)");

    Preference pref;
    check(cublasLtMatmulPreferenceCreate(pref.out()), "cublasLtMatmulPreferenceCreate");
    const uint64_t max_ws = kWorkspaceBytes;
    check(cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws,
                                               sizeof(max_ws)),
          "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
    const uint32_t aligns[4] = {key.align_b, key.align_a, key.align_c, key.align_c};  // cuBLASLt A, B, C, D
    const cublasLtMatmulPreferenceAttributes_t align_attrs[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; ++i)
      check(cublasLtMatmulPreferenceSetAttribute(pref.get(), align_attrs[i], &aligns[i], sizeof(aligns[i])),
            "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)");

    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    check(cublasLtMatmulAlgoGetHeuristic(impl_->handle.get(), p.desc.get(), p.a.get(), p.b.get(), p.c.get(), p.c.get(),
                                         pref.get(), 1, &result, &found),
          "cublasLtMatmulAlgoGetHeuristic");
    SO_CHECK(found > 0 && result.state == CUBLAS_STATUS_SUCCESS, what(),
             ": cuBLASLt has no algorithm for this shape, dtype combination and alignment (A ", key.align_a, " B ",
             key.align_b, " C ", key.align_c, " bytes)");
    p.algo = result.algo;
    // Bounded: a model has a few dozen shapes, but a caller whose sizes vary (a new M per call)
    // would grow the cache without end. Past the bound it starts over (plans are host-side
    // descriptors; launches already made do not read them again).
    if (impl_->plans.size() >= kMaxPlans) impl_->plans.clear();
    it = impl_->plans.emplace(key, std::move(p)).first;
  }
  const Plan& p = it->second;
  void* ws = impl_->workspace_for(stream);
  check(cublasLtMatmul(impl_->handle.get(), p.desc.get(), &alpha, B, p.a.get(), A, p.b.get(), &beta, C, p.c.get(), C,
                       p.c.get(), &p.algo, ws, kWorkspaceBytes, stream),
        "cublasLtMatmul");
}

}  // namespace so::cuda
