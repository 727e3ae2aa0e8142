// Attention with a score bias that is a function of (head, offset) alone, on CPU, in query and key tiles with
// an online softmax (the flash-attention scheme): the bias of a tile is read from a small per-head table
// indexed by offset, so no (B, H, Tq, Tk) tensor exists, forward or backward, and the gradient of a learned
// bias is summed per offset. The eager backend in attention.py is the reference it must equal.
//
// Shapes: B batch, H heads, Tq queries at positions q_start..q_start+Tq-1, Tk keys at 0..Tk-1, Dh and Dv head
// widths, N table entries: the bias of query i and key j in head h is table[h][(q_start + i - j) + origin],
// plus, with token values (FoX's cumulative log forget gates c, float64 (B, H, T)), c_i − c_j formed in double,
// and with FIRE's segments (H, 3P + 2) its bias of the pair's distance and the query's position (fire_cpu.h; the
// first key at position key_position). Products run on the BLAS torch links (cpu_tiles.h).
#include "kernel_api.h"

#include "cpu_tiles.h"
#include "fire_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

using namespace posenc_tiles;

constexpr int64_t QUERY_TILE = 64;
constexpr int64_t KEY_TILE = 128;

template <typename T>
T lowest() { return -std::numeric_limits<T>::infinity(); }

struct Geometry {
  int64_t batch, heads, queries, keys, width, value_width, entries;
  int64_t q_start, origin;
  bool causal;
  int64_t key_position;  // the position of key 0: FIRE's bias reads the query's own position
  // keys a query tile reads: all, or those up to its last query when causal
  int64_t key_end(int64_t q0, int64_t rows) const {
    return causal ? std::min(keys, q_start + q0 + rows) : keys;
  }
  // keys of query (q0 + r) allowed in the key tile starting at k0 with `cols` keys
  int64_t allowed(int64_t q0, int64_t r, int64_t k0, int64_t cols) const {
    return causal ? std::max<int64_t>(0, std::min(cols, q_start + q0 + r - k0 + 1)) : cols;
  }
};

// The token values of one (b, h): c of the queries (from q0) and of the keys (from k0), or null for none.
struct TokenValues {
  const double* queries;
  const double* keys;
};

// Token values of every (b, h): (B, H, Tq) and (B, H, Tk) contiguous float64, or null for none.
struct Tokens {
  const double* queries;
  const double* keys;
  TokenValues at(const Geometry& g, int64_t task, int64_t q0, int64_t k0) const {
    if (queries == nullptr) return {nullptr, nullptr};
    return {queries + task * g.queries + q0, keys + task * g.keys + k0};
  }
};

// FIRE's bias for the tiles of one head, or none: its segments and distance tables (shared) and a row's scratch.
template <typename T>
struct FireTiles {
  const posenc_fire::Head<T>* head;
  posenc_fire::Row<T>& row;
};

// Each head's FIRE tables, or none without segments.
template <typename T>
std::vector<posenc_fire::Head<T>> fire_heads(const c10::optional<at::Tensor>& fire, const Geometry& g,
                                             bool with_gradients) {
  std::vector<posenc_fire::Head<T>> heads;
  if (!fire.has_value()) return heads;
  const int64_t entries = fire->size(1), distances = std::max(g.keys, g.q_start + g.queries);
  for (int64_t h = 0; h < g.heads; ++h)
    heads.emplace_back(fire->data_ptr<T>() + h * entries, entries, distances, with_gradients);
  return heads;
}

// scores (rows × cols, row stride KEY_TILE) = scale·q_tile·k_tileᵀ + bias, for the allowed columns of each row
template <typename T>
void tile_logits(T* scores, const T* q_rows, int64_t q_stride, const T* k_rows, int64_t k_stride, int64_t rows,
                 int64_t cols, int64_t q0, int64_t k0, const T* table_row, TokenValues values, FireTiles<T> fire,
                 const Geometry& g, T scale) {
  gemm(TransposeType::Transpose, TransposeType::NoTranspose, cols, rows, g.width, T(1), k_rows, k_stride, q_rows,
       q_stride, T(0), scores, KEY_TILE);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t valid = g.allowed(q0, r, k0, cols);
    T* s = scores + r * KEY_TILE;
    const T* bias = table_row + (g.q_start + q0 + r - k0) + g.origin;  // bias of column c is bias[-c]
#pragma omp simd
    for (int64_t c = 0; c < valid; ++c) s[c] = s[c] * scale + bias[-c];
    if (values.queries != nullptr) {
      const double query_value = values.queries[r];
#pragma omp simd
      for (int64_t c = 0; c < valid; ++c) s[c] += static_cast<T>(query_value - values.keys[c]);
    }
    if (fire.head != nullptr) {
      fire.row.load(*fire.head, g.key_position + g.q_start + q0 + r, g.q_start + q0 + r - k0, valid, false);
      fire.row.biases(*fire.head, valid);
      const T* bias = fire.row.bias.data();
#pragma omp simd
      for (int64_t c = 0; c < valid; ++c) s[c] += bias[c];
    }
  }
}

template <typename T>
void forward_tiles(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
                   Tokens tokens, const c10::optional<at::Tensor>& fire, at::Tensor& out, at::Tensor& lse,
                   const Geometry& g, T scale) {
  const Rows<T> Q(q), K(k), V(v), O(out);
  const T* tables = table.data_ptr<T>();
  T* lse_data = lse.data_ptr<T>();
  const int64_t tiles = (g.queries + QUERY_TILE - 1) / QUERY_TILE;
  const auto heads = fire_heads<T>(fire, g, false);
  at::parallel_for(0, g.batch * g.heads * tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> scores(QUERY_TILE * KEY_TILE), acc(QUERY_TILE * g.value_width);
    std::vector<T> row_max(QUERY_TILE), row_sum(QUERY_TILE);
    posenc_fire::Row<T> fire_row(KEY_TILE);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t tile = task % tiles, h = (task / tiles) % g.heads, b = task / (tiles * g.heads);
      const int64_t q0 = tile * QUERY_TILE, rows = std::min(QUERY_TILE, g.queries - q0);
      const T* q_rows = Q.at(b, h) + q0 * Q.row_stride;
      const T* table_row = tables + h * g.entries;
      std::fill(row_max.begin(), row_max.end(), lowest<T>());
      std::fill(row_sum.begin(), row_sum.end(), T(0));
      std::fill(acc.begin(), acc.end(), T(0));
      const int64_t key_end = g.key_end(q0, rows);
      for (int64_t k0 = 0; k0 < key_end; k0 += KEY_TILE) {
        const int64_t cols = std::min(KEY_TILE, key_end - k0);
        const T* k_rows = K.at(b, h) + k0 * K.row_stride;
        tile_logits(scores.data(), q_rows, Q.row_stride, k_rows, K.row_stride, rows, cols, q0, k0, table_row,
                    tokens.at(g, b * g.heads + h, q0, k0), FireTiles<T>{heads.empty() ? nullptr : &heads[h], fire_row},
                    g, scale);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t valid = g.allowed(q0, r, k0, cols);
          T* s = scores.data() + r * KEY_TILE;
          const T new_max = std::max(row_max[r], largest(s, valid));
          T sum = 0;
          if (valid > 0) {
#pragma omp simd reduction(+ : sum)
            for (int64_t c = 0; c < valid; ++c) {
              s[c] = exp_of(s[c] - new_max);
              sum += s[c];
            }
          }
          std::fill(s + valid, s + cols, T(0));
          const T rescale = row_max[r] == lowest<T>() ? T(0) : exp_of(row_max[r] - new_max);
          row_sum[r] = row_sum[r] * rescale + sum;
          row_max[r] = new_max;
          T* a = acc.data() + r * g.value_width;
#pragma omp simd
          for (int64_t d = 0; d < g.value_width; ++d) a[d] *= rescale;
        }
        gemm(TransposeType::NoTranspose, TransposeType::NoTranspose, g.value_width, rows, cols,
                                  T(1), V.at(b, h) + k0 * V.row_stride, V.row_stride, scores.data(), KEY_TILE, T(1),
                                  acc.data(), g.value_width);
      }
      T* o_rows = O.at(b, h) + q0 * O.row_stride;
      T* lse_rows = lse_data + (b * g.heads + h) * g.queries + q0;
      for (int64_t r = 0; r < rows; ++r) {
        const bool empty = row_sum[r] == T(0);  // no allowed key: zeros, as SDPA returns
        const T inverse = empty ? T(0) : T(1) / row_sum[r];
        for (int64_t d = 0; d < g.value_width; ++d) o_rows[r * O.row_stride + d] = acc[r * g.value_width + d] * inverse;
        lse_rows[r] = empty ? T(0) : row_max[r] + std::log(row_sum[r]);
      }
    }
  });
}

template <typename T>
void backward_tiles(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                    const at::Tensor& v, const at::Tensor& lse, const at::Tensor& row_terms,
                    const at::Tensor& table, Tokens tokens, const c10::optional<at::Tensor>& fire,
                    at::Tensor& grad_q, at::Tensor& grad_k, at::Tensor& grad_v, at::Tensor& grad_table,
                    bool want_table, double* grad_query_values, double* grad_key_values, T* grad_fire,
                    const Geometry& g, T scale) {
  const Rows<T> dO(grad_out), Q(q), K(k), V(v), dQ(grad_q), dK(grad_k), dV(grad_v);
  const T* tables = table.data_ptr<T>();
  const T* lse_data = lse.data_ptr<T>();
  const T* row_term_data = row_terms.data_ptr<T>();  // (B, H, Tq): Σ_d dout·out
  T* grad_tables = grad_table.data_ptr<T>();       // (B, H, N): each (b, h) task owns its row
  const auto heads = fire_heads<T>(fire, g, true);
  const int64_t fire_entries = fire.has_value() ? fire->size(1) : 0;  // grad_fire: (B, H, 3P + 2), a row per task
  at::parallel_for(0, g.batch * g.heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> probs(QUERY_TILE * KEY_TILE), grad_scores(QUERY_TILE * KEY_TILE);
    posenc_fire::Row<T> fire_row(KEY_TILE);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t h = task % g.heads, b = task / g.heads;
      const T* table_row = tables + h * g.entries;
      T* grad_table_row = want_table ? grad_tables + task * g.entries : nullptr;
      const FireTiles<T> fire_tiles{heads.empty() ? nullptr : &heads[h], fire_row};
      for (int64_t q0 = 0; q0 < g.queries; q0 += QUERY_TILE) {
        const int64_t rows = std::min(QUERY_TILE, g.queries - q0);
        const T* q_rows = Q.at(b, h) + q0 * Q.row_stride;
        const T* do_rows = dO.at(b, h) + q0 * dO.row_stride;
        const T* lse_rows = lse_data + task * g.queries + q0;
        const T* terms = row_term_data + task * g.queries + q0;
        const int64_t key_end = g.key_end(q0, rows);
        for (int64_t k0 = 0; k0 < key_end; k0 += KEY_TILE) {
          const int64_t cols = std::min(KEY_TILE, key_end - k0);
          const T* k_rows = K.at(b, h) + k0 * K.row_stride;
          const T* v_rows = V.at(b, h) + k0 * V.row_stride;
          tile_logits(probs.data(), q_rows, Q.row_stride, k_rows, K.row_stride, rows, cols, q0, k0, table_row,
                      tokens.at(g, task, q0, k0), fire_tiles, g, scale);
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t valid = g.allowed(q0, r, k0, cols);
            T* p = probs.data() + r * KEY_TILE;
            const T shift = lse_rows[r];
#pragma omp simd
            for (int64_t c = 0; c < valid; ++c) p[c] = exp_of(p[c] - shift);
            std::fill(p + valid, p + cols, T(0));
          }
          // dV_tile += Pᵀ·dO
          gemm(TransposeType::NoTranspose, TransposeType::Transpose, g.value_width, cols, rows,
                                    T(1), do_rows, dO.row_stride, probs.data(), KEY_TILE, T(1),
                                    dV.at(b, h) + k0 * dV.row_stride, dV.row_stride);
          // dP = dO·Vᵀ, then dS = P ⊙ (dP − rowterm)
          gemm(TransposeType::Transpose, TransposeType::NoTranspose, cols, rows, g.value_width,
                                    T(1), v_rows, V.row_stride, do_rows, dO.row_stride, T(0), grad_scores.data(),
                                    KEY_TILE);
          for (int64_t r = 0; r < rows; ++r) {
            const T* p = probs.data() + r * KEY_TILE;
            T* ds = grad_scores.data() + r * KEY_TILE;
            const T term = terms[r];
#pragma omp simd
            for (int64_t c = 0; c < cols; ++c) ds[c] = p[c] * (ds[c] - term);
            const int64_t valid = g.allowed(q0, r, k0, cols);
            if (want_table) {
              T* bias_grad = grad_table_row + (g.q_start + q0 + r - k0) + g.origin;
              for (int64_t c = 0; c < valid; ++c) bias_grad[-c] += ds[c];
            }
            if (grad_query_values != nullptr) {  // ∂/∂c_i = Σ_j dS_ij, ∂/∂c_j = −Σ_i dS_ij
              double* key_grads = grad_key_values + task * g.keys + k0;
              double row_sum = 0;
              for (int64_t c = 0; c < valid; ++c) {
                row_sum += ds[c];
                key_grads[c] -= ds[c];
              }
              grad_query_values[task * g.queries + q0 + r] += row_sum;
            }
            if (fire_tiles.head != nullptr) {
              const int64_t position = g.key_position + g.q_start + q0 + r;
              fire_row.load(*fire_tiles.head, position, g.q_start + q0 + r - k0, valid, true);
              fire_row.add_gradients(*fire_tiles.head, ds, valid, position, grad_fire + task * fire_entries);
            }
          }
          // dQ_tile += scale·dS·K,  dK_tile += scale·dSᵀ·Q
          gemm(TransposeType::NoTranspose, TransposeType::NoTranspose, g.width, rows, cols, scale,
                                    k_rows, K.row_stride, grad_scores.data(), KEY_TILE, T(1),
                                    dQ.at(b, h) + q0 * dQ.row_stride, dQ.row_stride);
          gemm(TransposeType::NoTranspose, TransposeType::Transpose, g.width, cols, rows, scale,
                                    q_rows, Q.row_stride, grad_scores.data(), KEY_TILE, T(1),
                                    dK.at(b, h) + k0 * dK.row_stride, dK.row_stride);
        }
      }
    }
  });
}

Geometry geometry(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
                  int64_t q_start, int64_t origin, bool causal, const c10::optional<at::Tensor>& fire,
                  int64_t key_position) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "offset_bias_attention: q, k, v must be 4-D");
  TORCH_CHECK(k.size(1) == q.size(1) && v.size(1) == q.size(1), "offset_bias_attention: q, k, v need equal heads");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "offset_bias_attention: unit stride along D");
  TORCH_CHECK(table.dim() == 2 && table.size(0) == q.size(1) && table.is_contiguous(),
              "offset_bias_attention: table must be contiguous (H, N)");
  if (fire.has_value()) {
    const int64_t count = (fire->size(1) - 2) / 3;  // P
    TORCH_CHECK(fire->dim() == 2 && fire->size(0) == q.size(1) && fire->is_contiguous() &&
                    fire->scalar_type() == q.scalar_type() && fire->size(1) == 3 * count + 2 && count >= 2 &&
                    (count & (count - 1)) == 0,
                "offset_bias_attention: FIRE's segments must be contiguous (H, 3P + 2) in q's dtype, P a power of "
                "two >= 2");
  }
  Geometry g{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), v.size(3), table.size(1), q_start, origin, causal,
             key_position};
  // every offset a pair reaches must index the table
  const int64_t low = causal ? 0 : q_start - (g.keys - 1), high = q_start + g.queries - 1;
  TORCH_CHECK(g.queries == 0 || g.keys == 0 || (low + origin >= 0 && high + origin < g.entries),
              "offset_bias_attention: the table does not cover offsets ", low, "..", high);
  return g;
}

Tokens token_values(const Geometry& g, const c10::optional<at::Tensor>& query_values,
                    const c10::optional<at::Tensor>& key_values) {
  TORCH_CHECK(query_values.has_value() == key_values.has_value(), "offset_bias_attention: token values go in pairs");
  if (!query_values.has_value()) return {nullptr, nullptr};
  const auto& queries = *query_values;
  const auto& keys = *key_values;
  TORCH_CHECK(queries.scalar_type() == at::kDouble && keys.scalar_type() == at::kDouble &&
                  queries.is_contiguous() && keys.is_contiguous() &&
                  queries.sizes() == at::IntArrayRef({g.batch, g.heads, g.queries}) &&
                  keys.sizes() == at::IntArrayRef({g.batch, g.heads, g.keys}),
              "offset_bias_attention: token values must be contiguous float64 (B, H, Tq) and (B, H, Tk)");
  return {queries.data_ptr<double>(), keys.data_ptr<double>()};
}

}  // namespace

// Returns (out (B, H, Tq, Dv) laid out token-major, lse (B, H, Tq)), in q's dtype.
std::vector<at::Tensor> offset_bias_forward(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor table,
                                               int64_t q_start, int64_t origin, bool causal, double scale,
                                               c10::optional<at::Tensor> query_values,
                                               c10::optional<at::Tensor> key_values,
                                               c10::optional<at::Tensor> fire, int64_t key_position) {
  const Geometry g = geometry(q, k, v, table, q_start, origin, causal, fire, key_position);
  const Tokens tokens = token_values(g, query_values, key_values);
  auto out = at::empty({g.batch, g.queries, g.heads, g.value_width}, q.options()).transpose(1, 2);
  auto lse = at::empty({g.batch, g.heads, g.queries}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "offset_bias_forward", [&] {
    forward_tiles<scalar_t>(q, k, v, table, tokens, fire, out, lse, g, static_cast<scalar_t>(scale));
  });
  return {out, lse};
}

// Returns (dq, dk, dv, dtable (B, H, N), zeros when not wanted, and with token values their gradients (B, H, Tq),
// (B, H, Tk) in float64, and with FIRE's segments theirs (H, 3P + 2)). row_terms: (B, H, Tq) contiguous.
std::vector<at::Tensor> offset_bias_backward(at::Tensor grad_out, at::Tensor q, at::Tensor k,
                                                at::Tensor v, at::Tensor lse, at::Tensor row_terms,
                                                at::Tensor table, int64_t q_start, int64_t origin, bool causal,
                                                double scale, bool want_table,
                                                c10::optional<at::Tensor> query_values,
                                                c10::optional<at::Tensor> key_values,
                                                c10::optional<at::Tensor> fire, int64_t key_position) {
  const Geometry g = geometry(q, k, v, table, q_start, origin, causal, fire, key_position);
  const Tokens tokens = token_values(g, query_values, key_values);
  TORCH_CHECK(grad_out.stride(3) == 1 && lse.is_contiguous() && row_terms.is_contiguous(),
              "offset_bias_backward: layouts");
  auto grad_q = at::zeros_like(q), grad_k = at::zeros_like(k), grad_v = at::zeros_like(v);
  auto grad_table = at::zeros({want_table ? g.batch : 1, g.heads, g.entries}, table.options());
  const auto doubles = q.options().dtype(at::kDouble);
  const bool with_tokens = tokens.queries != nullptr;
  auto grad_query_values = at::zeros({with_tokens ? g.batch : 0, g.heads, g.queries}, doubles);
  auto grad_key_values = at::zeros({with_tokens ? g.batch : 0, g.heads, g.keys}, doubles);
  auto grad_fire = at::zeros({fire.has_value() ? g.batch : 0, g.heads, fire.has_value() ? fire->size(1) : 0},
                                q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "offset_bias_backward", [&] {
    backward_tiles<scalar_t>(grad_out, q, k, v, lse, row_terms, table, tokens, fire, grad_q, grad_k, grad_v,
                             grad_table, want_table, with_tokens ? grad_query_values.data_ptr<double>() : nullptr,
                             with_tokens ? grad_key_values.data_ptr<double>() : nullptr,
                             grad_fire.data_ptr<scalar_t>(), g, static_cast<scalar_t>(scale));
  });
  return {grad_q, grad_k, grad_v, grad_table, grad_query_values, grad_key_values, grad_fire.sum(0)};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("offset_bias_forward", &offset_bias_forward, "attention with a (head, offset) bias table: out, lse");
  m.def("offset_bias_backward", &offset_bias_backward, "its backward: dq, dk, dv, per-batch dtable, token and "
        "FIRE gradients");
}
