// Row-wise and elementwise kernels of the decoder layer (everything but GEMM and attention).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu_exp.h"
#include "cpu_kernels.h"
#include "so/core/error.h"

namespace so::cpu {

template <typename T>
void embedding_forward(T* out, const T* table, const int32_t* tokens, int64_t T_, int64_t V, int64_t H) {
  for (int64_t t = 0; t < T_; ++t) {
    const int32_t id = tokens[t];
    SO_CHECK(id >= 0 && id < V, "embedding: token id ", id, " at position ", t, " is outside the vocabulary [0, ", V,
             ")");
    std::memcpy(out + t * H, table + static_cast<int64_t>(id) * H, sizeof(T) * H);
  }
}

template <typename T>
void embedding_backward(T* dtable, const T* dout, const int32_t* tokens, int64_t T_, int64_t V, int64_t H,
                        int64_t padding_idx) {
  for (int64_t t = 0; t < T_; ++t) {
    const int32_t id = tokens[t];
    SO_CHECK(id >= 0 && id < V, "embedding backward: token id ", id, " outside [0, ", V, ")");
    if (id == padding_idx) continue;
    T* row = dtable + static_cast<int64_t>(id) * H;
    const T* g = dout + t * H;
    for (int64_t i = 0; i < H; ++i) row[i] = from_f32<T>(to_f32(row[i]) + to_f32(g[i]));
  }
}

template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* x, const T* w, int64_t rows, int64_t dim, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    double ss = 0.0;
    for (int64_t i = 0; i < dim; ++i) {
      const double xi = to_f32(xr[i]);
      ss += xi * xi;
    }
    const float rs = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps));
    rstd[r] = rs;
    T* o = out + r * dim;
    for (int64_t i = 0; i < dim; ++i) o[i] = from_f32<T>(to_f32(w[i]) * (to_f32(xr[i]) * rs));
  }
}

// y = w * x * r with r = (mean(x^2) + eps)^-1/2:
//   dx_i = r * w_i dy_i - x_i * r^3 / dim * sum_j w_j dy_j x_j,   dw_i += dy_i x_i r
template <typename T>
void rmsnorm_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const float* rstd, int64_t rows, int64_t dim,
                      bool accumulate) {
  std::vector<double> dw_acc(static_cast<size_t>(dim), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    const T* dy = dout + r * dim;
    const double rs = rstd[r];
    double dot = 0.0;
    for (int64_t i = 0; i < dim; ++i) dot += to_f32(w[i]) * to_f32(dy[i]) * static_cast<double>(to_f32(xr[i]));
    const double c = rs * rs * rs * dot / static_cast<double>(dim);
    T* dxr = dx + r * dim;
    for (int64_t i = 0; i < dim; ++i) {
      const double xi = to_f32(xr[i]);
      const double g = rs * to_f32(w[i]) * to_f32(dy[i]) - xi * c;
      dxr[i] = from_f32<T>(static_cast<float>(accumulate ? to_f32(dxr[i]) + g : g));
      dw_acc[i] += to_f32(dy[i]) * xi * rs;
    }
  }
  for (int64_t i = 0; i < dim; ++i) dw[i] = from_f32<T>(static_cast<float>(to_f32(dw[i]) + dw_acc[i]));
}

template <typename T>
void rope(T* x, const int32_t* positions, int64_t T_, int64_t heads, int64_t head_dim, const double* inv_freq,
          float attention_scale, bool inverse) {
  SO_CHECK(head_dim % 2 == 0, "rope: head_dim ", head_dim, " must be even");
  const int64_t half = head_dim / 2;
  std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
  const double scale = attention_scale, sign = inverse ? -scale : scale;
  for (int64_t t = 0; t < T_; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(positions[t]) * inv_freq[i];
      cs[i] = static_cast<float>(scale * std::cos(a));
      sn[i] = static_cast<float>(sign * std::sin(a));
    }
    for (int64_t h = 0; h < heads; ++h) {
      T* v = x + (t * heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = to_f32(v[i]), x2 = to_f32(v[i + half]);
        v[i] = from_f32<T>(x1 * cs[i] - x2 * sn[i]);
        v[i + half] = from_f32<T>(x2 * cs[i] + x1 * sn[i]);
      }
    }
  }
}

template <typename T>
void swiglu_forward(T* out, const T* gate, const T* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = to_f32(gate[i]);
    out[i] = from_f32<T>(g / (1.0f + std::exp(-g)) * to_f32(up[i]));
  }
}

// Calls f(i, kept) for every element i of a [rows x cols] tensor under the mask m.
template <typename F>
void for_each_dropout(int64_t rows, int64_t cols, const DropoutMask& m, F f) {
  const uint32_t threshold = m.threshold();
  for (int64_t r = 0; r < rows; ++r) {
    const uint64_t token = dropout_token(m, m.row0 + r);
    for (int64_t c = 0; c < cols; ++c) f(r * cols + c, dropout_keep(m.key, token, static_cast<uint64_t>(c), threshold));
  }
}

template <typename T>
void dropout_add(T* x, const T* y, int64_t rows, int64_t cols, const DropoutMask& m) {
  const float scale = m.scale();
  for_each_dropout(rows, cols, m, [&](int64_t i, bool kept) {
    if (kept) x[i] = from_f32<T>(std::fma(to_f32(y[i]), scale, to_f32(x[i])));
  });
}

template <typename T>
void dropout_backward(T* dy, const T* dx, int64_t rows, int64_t cols, const DropoutMask& m) {
  const float scale = m.scale();
  for_each_dropout(rows, cols, m,
                   [&](int64_t i, bool kept) { dy[i] = from_f32<T>(kept ? to_f32(dx[i]) * scale : 0.0f); });
}

template <typename T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = to_f32(gate[i]), u = to_f32(up[i]), dy = to_f32(dout[i]);
    const float sig = 1.0f / (1.0f + std::exp(-g));
    dgate[i] = from_f32<T>(dy * u * sig * (1.0f + g * (1.0f - sig)));
    dup[i] = from_f32<T>(dy * g * sig);
  }
}

namespace {

// The maximum and the sum of a row in kLanes independent fp32 lanes, so that the loops vectorise
// (one running value is a chain of dependent operations); the sum's lanes hold V / kLanes terms
// each and are added in fp64.
constexpr int64_t kLanes = 16;

float row_max(const float* z, int64_t n) {
  float lane[kLanes];
  std::fill(lane, lane + kLanes, -INFINITY);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) lane[j] = lane[j] < z[i + j] ? z[i + j] : lane[j];
  float mx = -INFINITY;
  for (; i < n; ++i) mx = std::max(mx, z[i]);
  for (int64_t j = 0; j < kLanes; ++j) mx = std::max(mx, lane[j]);
  return mx;
}

double row_sum(const float* e, int64_t n) {
  float lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) lane[j] += e[i + j];
  double sum = 0.0;
  for (; i < n; ++i) sum += e[i];
  for (int64_t j = 0; j < kLanes; ++j) sum += lane[j];
  return sum;
}

}  // namespace

// One exp per logit (fp32, vectorised), kept for the gradient: p_i = e_i / sum; the log-sum-exp
// in fp64.
template <typename T>
void cross_entropy(float* loss_acc, T* dlogits, const float* logits, const int32_t* targets, int64_t rows, int64_t V,
                   float scale, float z_loss) {
  std::vector<float> e(static_cast<size_t>(V));
  double loss = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = logits + r * V;
    const int32_t y = targets[r];
    T* dz = dlogits ? dlogits + r * V : nullptr;
    if (y < 0) {  // ignored position
      if (dz)
        for (int64_t i = 0; i < V; ++i) dz[i] = from_f32<T>(0.0f);
      continue;
    }
    SO_CHECK(y < V, "cross_entropy: target id ", y, " at row ", r, " is outside the vocabulary [0, ", V, ")");
    const float mx = row_max(z, V);
    exp_shifted(e.data(), z, mx, V);
    const double sum = row_sum(e.data(), V);
    const double lse = mx + std::log(sum);
    loss += lse - z[y];
    if (z_loss != 0.0f) loss += z_loss * lse * lse;  // (skipped at 0: an infinite lse must stay infinite, not NaN)
    if (dz) {
      // d(z_loss lse^2)/dz_i = 2 z_loss lse softmax_i: softmax scaled by this, less the one-hot.
      const float p_scale = static_cast<float>(scale * (1.0 + 2.0 * z_loss * lse) / sum);
      for (int64_t i = 0; i < V; ++i) dz[i] = from_f32<T>(e[i] * p_scale);
      dz[y] = from_f32<T>(static_cast<float>(scale * (e[y] / sum * (1.0 + 2.0 * z_loss * lse) - 1.0)));
    }
  }
  *loss_acc += static_cast<float>(scale * loss);
}

template <typename Dst, typename Src>
void cast(Dst* dst, const Src* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = from_f32<Dst>(to_f32(src[i]));
}

#define SO_INSTANTIATE_LAYER_KERNELS(T)                                                                          \
  template void embedding_forward<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t);                   \
  template void embedding_backward<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t, int64_t);         \
  template void rmsnorm_forward<T>(T*, float*, const T*, const T*, int64_t, int64_t, float);                     \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const float*, int64_t, int64_t, bool); \
  template void rope<T>(T*, const int32_t*, int64_t, int64_t, int64_t, const double*, float, bool);              \
  template void swiglu_forward<T>(T*, const T*, const T*, int64_t);                                              \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, int64_t);                               \
  template void dropout_add<T>(T*, const T*, int64_t, int64_t, const DropoutMask&);                              \
  template void dropout_backward<T>(T*, const T*, int64_t, int64_t, const DropoutMask&);                         \
  template void cross_entropy<T>(float*, T*, const float*, const int32_t*, int64_t, int64_t, float, float);
SO_INSTANTIATE_LAYER_KERNELS(float)
SO_INSTANTIATE_LAYER_KERNELS(bf16)
template void cast<float, float>(float*, const float*, int64_t);
template void cast<float, bf16>(float*, const bf16*, int64_t);
template void cast<bf16, float>(bf16*, const float*, int64_t);
template void cast<bf16, bf16>(bf16*, const bf16*, int64_t);

void transpose_blocks(void* dst, const void* src, int64_t d0, int64_t d1, size_t inner_bytes) {
  auto* out = static_cast<char*>(dst);
  const auto* in = static_cast<const char*>(src);
  for (int64_t i = 0; i < d0; ++i)
    for (int64_t j = 0; j < d1; ++j)
      std::memcpy(out + (j * d0 + i) * inner_bytes, in + (i * d1 + j) * inner_bytes, inner_bytes);
}

void copy_columns(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, int64_t rows, size_t row_bytes) {
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch, row_bytes);
}

template <typename T>
void replicate_heads(T* out, const T* in, int64_t rows, int64_t heads, int64_t copies, int64_t D, bool reverse) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      if (!reverse) {
        const T* src = in + (r * heads + h) * D;
        for (int64_t c = 0; c < copies; ++c) std::memcpy(out + ((r * heads + h) * copies + c) * D, src, D * sizeof(T));
        continue;
      }
      T* dst = out + (r * heads + h) * D;
      for (int64_t d = 0; d < D; ++d) {
        float acc = 0.0f;
        for (int64_t c = 0; c < copies; ++c) acc += to_f32(in[((r * heads + h) * copies + c) * D + d]);
        dst[d] = from_f32<T>(acc);
      }
    }
}
template void replicate_heads<float>(float*, const float*, int64_t, int64_t, int64_t, int64_t, bool);
template void replicate_heads<bf16>(bf16*, const bf16*, int64_t, int64_t, int64_t, int64_t, bool);

}  // namespace so::cpu
