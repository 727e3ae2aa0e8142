// Stick-breaking attention on CPU (Tan et al., ICLR 2025), causal, in query tiles: a tile's logits, their
// log-sigmoids and the weights live in a per-thread buffer of tile × keys, so no (B, H, Tq, Tk) tensor exists,
// forward or backward (which recomputes them from q and k). The eager backend in attention.py is the reference
// it must equal (the same order of summation: from the query's nearest allowed key back to the first).
//
// Shapes: B batch, H heads, Tq queries at positions start..start+Tq-1 (start = Tk − Tq), Tk keys at 0..Tk-1,
// Dh head width, Dv value width. For query i the allowed keys are j < start + i (j ≤ start + i with
// attend_current); with z_ij = scale·q_i·k_j,
//   log A_ij = log σ(z_ij) + Σ_{allowed l > j} log σ(−z_il),   out_i = Σ_j A_ij v_j.
// Products run on the BLAS torch links (cpu_tiles.h).
#include "kernel_api.h"

#include "cpu_tiles.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

using namespace posenc_tiles;

constexpr int64_t QUERY_TILE = 32;

// log(y) for float y ≥ 1 in a form the compiler vectorizes: y = 2^e·m with m in [√½, √2), log m = 2·atanh(s) with
// s = (m − 1)/(m + 1), |s| ≤ 0.172, by its series to s^11 (relative error below 1e-9 before rounding).
inline float log_of(float y) {
  int32_t bits;
  std::memcpy(&bits, &y, sizeof bits);
  int32_t exponent = ((bits >> 23) & 0xFF) - 127;
  int32_t mantissa_bits = (bits & 0x007FFFFF) | 0x3F800000;  // m in [1, 2)
  float m;
  std::memcpy(&m, &mantissa_bits, sizeof m);
  const bool high = m > 1.41421356f;
  m = high ? m * 0.5f : m;
  exponent += high ? 1 : 0;
  const float s = (m - 1.0f) / (m + 1.0f), s2 = s * s;
  float p = 1.0f / 11.0f;
  p = p * s2 + 1.0f / 9.0f;
  p = p * s2 + 1.0f / 7.0f;
  p = p * s2 + 1.0f / 5.0f;
  p = p * s2 + 1.0f / 3.0f;
  p = p * s2 + 1.0f;
  return 2.0f * s * p + static_cast<float>(exponent) * 0.6931471805599453f;
}

// log(1 + e) for e in [0, 1]: log σ(x) = min(x, 0) − log(1 + e^−|x|), stable for any x (Tile::weights)
inline float log_one_plus(float e) { return log_of(1.0f + e); }
inline double log_one_plus(double e) { return std::log1p(e); }

struct Geometry {
  int64_t batch, heads, queries, keys, width, value_width;
  bool attend_current;
  int64_t start() const { return keys - queries; }
  int64_t allowed(int64_t i) const { return start() + i + (attend_current ? 1 : 0); }  // keys 0..allowed-1
};

// One query tile's numbers, recomputed identically by forward and backward.
template <typename T>
struct Tile {
  const Geometry& g;
  T scale;
  int64_t q0, rows, key_end;  // queries q0..q0+rows-1, keys 0..key_end-1
  std::vector<T> logits, own;  // rows × key_end: z, then the weights A; log σ(z)

  Tile(const Geometry& g, T scale) : g(g), scale(scale) {
    logits.resize(QUERY_TILE * g.keys);
    own.resize(QUERY_TILE * g.keys);
  }

  // logits = z = scale·q·kᵀ and own = log σ(z), then the weights A written over the logits
  void weights(int64_t tile_q0, const T* q_rows, int64_t q_stride, const T* k_rows, int64_t k_stride) {
    q0 = tile_q0;
    rows = std::min(QUERY_TILE, g.queries - q0);
    key_end = std::max<int64_t>(1, g.allowed(q0 + rows - 1));
    gemm(TransposeType::Transpose, TransposeType::NoTranspose, key_end, rows, g.width, scale, k_rows, k_stride,
         q_rows, q_stride, T(0), logits.data(), key_end);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = g.allowed(q0 + r);
      T* z = logits.data() + r * key_end;
      T* ls = own.data() + r * key_end;
      // log σ(z) in two loops: GCC 12 vectorizes each, not the two in one (nor with std::min)
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) ls[j] = exp_of(-std::abs(z[j]));
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) ls[j] = (z[j] < T(0) ? z[j] : T(0)) - log_one_plus(ls[j]);
      double later = 0;  // Σ log σ(−z_l) over the allowed keys after j, in double as torch's cumsum for a float
      for (int64_t j = n - 1; j >= 0; --j) {
        const T log_weight = ls[j] + static_cast<T>(later);
        later += ls[j] - z[j];  // log σ(−z) = log σ(z) − z
        z[j] = log_weight;
      }
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) z[j] = exp_of(z[j]);
      std::fill(z + std::max<int64_t>(n, 0), z + key_end, T(0));
    }
  }
};

template <typename T>
void forward_tiles(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out,
                   const Geometry& g, T scale) {
  const Rows<T> Q(q), K(k), V(v), O(out);
  const int64_t tiles = (g.queries + QUERY_TILE - 1) / QUERY_TILE;
  at::parallel_for(0, g.batch * g.heads * tiles, 1, [&](int64_t begin, int64_t end) {
    Tile<T> tile(g, scale);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t index = task % tiles, h = (task / tiles) % g.heads, b = task / (tiles * g.heads);
      const int64_t q0 = index * QUERY_TILE;
      tile.weights(q0, Q.at(b, h) + q0 * Q.row_stride, Q.row_stride, K.at(b, h), K.row_stride);
      gemm(TransposeType::NoTranspose, TransposeType::NoTranspose, g.value_width, tile.rows, tile.key_end, T(1),
           V.at(b, h), V.row_stride, tile.logits.data(), tile.key_end, T(0), O.at(b, h) + q0 * O.row_stride,
           O.row_stride);
    }
  });
}

template <typename T>
void backward_tiles(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                    const at::Tensor& v, at::Tensor& grad_q, at::Tensor& grad_k, at::Tensor& grad_v,
                    const Geometry& g, T scale) {
  const Rows<T> dO(grad_out), Q(q), K(k), V(v), dQ(grad_q), dK(grad_k), dV(grad_v);
  at::parallel_for(0, g.batch * g.heads, 1, [&](int64_t begin, int64_t end) {
    Tile<T> tile(g, scale);
    std::vector<T> grad_logits(QUERY_TILE * g.keys);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t h = task % g.heads, b = task / g.heads;
      for (int64_t q0 = 0; q0 < g.queries; q0 += QUERY_TILE) {
        const T* q_rows = Q.at(b, h) + q0 * Q.row_stride;
        const T* do_rows = dO.at(b, h) + q0 * dO.row_stride;
        tile.weights(q0, q_rows, Q.row_stride, K.at(b, h), K.row_stride);
        const int64_t rows = tile.rows, keys = tile.key_end;
        const T* weights = tile.logits.data();
        // dV += Aᵀ·dO; dA = dO·Vᵀ
        gemm(TransposeType::NoTranspose, TransposeType::Transpose, g.value_width, keys, rows, T(1), do_rows,
             dO.row_stride, weights, keys, T(1), dV.at(b, h), dV.row_stride);
        gemm(TransposeType::Transpose, TransposeType::NoTranspose, keys, rows, g.value_width, T(1), V.at(b, h),
             V.row_stride, do_rows, dO.row_stride, T(0), grad_logits.data(), keys);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t n = g.allowed(q0 + r);
          const T* a = weights + r * keys;
          T* sigmoid = tile.own.data() + r * keys;  // log σ(z), then σ(z)
          T* dz = grad_logits.data() + r * keys;  // dA, then the gradient of z (times scale: of q·k)
#pragma omp simd
          for (int64_t j = 0; j < n; ++j) sigmoid[j] = exp_of(sigmoid[j]);
          // ∂loss/∂z_j = g_j·σ(−z_j) − σ(z_j)·Σ_{m<j} g_m with g = dA ⊙ A (the gradient of log A): z_j enters
          // its own log σ(z_j) and, as log σ(−z_j), the weight of every farther key m < j
          double earlier = 0;
          for (int64_t j = 0; j < n; ++j) {
            const T through_log_weight = dz[j] * a[j];
            dz[j] = (through_log_weight * (T(1) - sigmoid[j]) - sigmoid[j] * static_cast<T>(earlier)) * scale;
            earlier += through_log_weight;
          }
          std::fill(dz + std::max<int64_t>(n, 0), dz + keys, T(0));
        }
        // dQ = dZ·K; dK += dZᵀ·Q
        gemm(TransposeType::NoTranspose, TransposeType::NoTranspose, g.width, rows, keys, T(1), K.at(b, h),
             K.row_stride, grad_logits.data(), keys, T(0), dQ.at(b, h) + q0 * dQ.row_stride, dQ.row_stride);
        gemm(TransposeType::NoTranspose, TransposeType::Transpose, g.width, keys, rows, T(1), q_rows, Q.row_stride,
             grad_logits.data(), keys, T(1), dK.at(b, h), dK.row_stride);
      }
    }
  });
}

Geometry geometry(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool attend_current) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "stick_breaking_attention: q, k, v must be 4-D");
  TORCH_CHECK(k.size(1) == q.size(1) && v.size(1) == q.size(1), "stick_breaking_attention: equal heads");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "stick_breaking_attention: unit stride");
  TORCH_CHECK(q.size(2) <= k.size(2), "stick_breaking_attention: more queries than keys");
  return Geometry{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), v.size(3), attend_current};
}

}  // namespace

// Returns out (B, H, Tq, Dv) laid out token-major, in q's dtype.
at::Tensor sticks_forward(at::Tensor q, at::Tensor k, at::Tensor v, double scale, bool attend_current) {
  const Geometry g = geometry(q, k, v, attend_current);
  auto out = at::empty({g.batch, g.queries, g.heads, g.value_width}, q.options()).transpose(1, 2);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "sticks_forward", [&] {
    forward_tiles<scalar_t>(q, k, v, out, g, static_cast<scalar_t>(scale));
  });
  return out;
}

// Returns (dq, dk, dv).
std::vector<at::Tensor> sticks_backward(at::Tensor grad_out, at::Tensor q, at::Tensor k, at::Tensor v,
                                           double scale, bool attend_current) {
  const Geometry g = geometry(q, k, v, attend_current);
  TORCH_CHECK(grad_out.stride(3) == 1, "sticks_backward: unit stride");
  auto grad_q = at::empty_like(q), grad_k = at::zeros_like(k), grad_v = at::zeros_like(v);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "sticks_backward", [&] {
    backward_tiles<scalar_t>(grad_out, q, k, v, grad_q, grad_k, grad_v, g, static_cast<scalar_t>(scale));
  });
  return {grad_q, grad_k, grad_v};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("sticks_forward", &sticks_forward, "stick-breaking attention, causal: out");
  m.def("sticks_backward", &sticks_backward, "its backward: dq, dk, dv");
}
