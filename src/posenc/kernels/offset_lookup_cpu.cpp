// Causal attention with a query-dependent term per offset, on CPU, in query tiles: for query i (at position
// start + i) and key j at offset d = start + i − j,
//   logit_ij = scale · (c_i·k_j + [d < N]·l_i·table_h[d]),   out_i = Σ_j p_ij (v_j + [d < N]·values_h[d]),
// with c the content queries, l the lookup queries and table_h (values_h) row d of head h's table (one table for
// every head when it has one). Transformer-XL: c = q + u, l = q + v, table_h[d] = W_R,h·r_d over N ≥ Tk offsets
// (the paper's "relative shift" done as an index), no values. Shaw's band: c = l = q and the K nearest offsets'
// key and value differences (``kernels.band``). A tile holds its logits in a buffer of tile × keys and its lookups
// l·tableᵀ in one of tile × min(N, keys), so no (B, H, Tq, Tk) tensor exists; the backward recomputes them from
// the saved log-sum-exp.
//
// Shapes: B batch, H heads, Tq queries, Tk keys (start = Tk − Tq), Dh head width, Dv value width, N table rows
// (offsets 0..N−1), H_t = 1 or H tables. Products run on the BLAS torch links (cpu_tiles.h).
#include "kernel_api.h"

#include "cpu_tiles.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

using namespace posenc_tiles;

constexpr int64_t QUERY_TILE = 32;

struct Geometry {
  int64_t batch, heads, queries, keys, width, value_width, entries, table_heads;
  bool has_values;
  int64_t start() const { return keys - queries; }
  int64_t allowed(int64_t i) const { return start() + i + 1; }  // keys 0..allowed-1 (offsets allowed-1..0)
  int64_t table_of(int64_t h) const { return table_heads == 1 ? 0 : h; }
};

// One query tile's logits (rows × key_end, row stride key_end), recomputed identically by forward and backward,
// and its lookups (rows × reach, row stride reach): l_i·table[d] for the offsets d < reach = min(N, key_end).
template <typename T>
struct Tile {
  const Geometry& g;
  T scale;
  int64_t q0, rows, key_end, reach;  // queries q0..q0+rows-1, keys 0..key_end-1, offsets 0..reach-1
  std::vector<T> logits, lookups;

  Tile(const Geometry& g, T scale) : g(g), scale(scale) {
    logits.resize(QUERY_TILE * g.keys);
    lookups.resize(QUERY_TILE * std::min(g.entries, g.keys));
  }

  // Offsets below this row's in_table(r) are in the table: key j = n − 1 − d reads lookups[r · reach + d].
  int64_t in_table(int64_t r) const { return std::min(g.allowed(q0 + r), reach); }

  void compute(int64_t tile_q0, const T* c_rows, int64_t c_stride, const T* l_rows, int64_t l_stride,
               const T* k_rows, int64_t k_stride, const T* table) {
    q0 = tile_q0;
    rows = std::min(QUERY_TILE, g.queries - q0);
    key_end = g.allowed(q0 + rows - 1);
    reach = std::min(g.entries, key_end);
    gemm(TransposeType::Transpose, TransposeType::NoTranspose, key_end, rows, g.width, T(1), k_rows, k_stride,
         c_rows, c_stride, T(0), logits.data(), key_end);
    gemm(TransposeType::Transpose, TransposeType::NoTranspose, reach, rows, g.width, T(1), table, g.width, l_rows,
         l_stride, T(0), lookups.data(), reach);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = g.allowed(q0 + r), past_table = n - in_table(r);  // keys before it lie past the table
      T* s = logits.data() + r * key_end;
      const T* by_offset = lookups.data() + r * reach + (n - 1);  // key j reads offset n − 1 − j
#pragma omp simd
      for (int64_t j = 0; j < past_table; ++j) s[j] *= scale;
#pragma omp simd
      for (int64_t j = past_table; j < n; ++j) s[j] = (s[j] + by_offset[-j]) * scale;
    }
  }

  // out (rows × reach): the tile's entries at each row's offsets d < in_table(r), zero past them.
  void by_offset(const T* tile, T* out) const {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = g.allowed(q0 + r), m = in_table(r);
      const T* row_end = tile + r * key_end + (n - 1);
      T* o = out + r * reach;
      for (int64_t d = 0; d < m; ++d) o[d] = row_end[-d];
      std::fill(o + m, o + reach, T(0));
    }
  }
};

template <typename T>
void forward_tiles(const at::Tensor& c, const at::Tensor& l, const at::Tensor& k, const at::Tensor& v,
                   const at::Tensor& table, const T* values, at::Tensor& out, at::Tensor& lse,
                   const Geometry& g, T scale) {
  const Rows<T> C(c), L(l), K(k), V(v), O(out);
  const T* tables = table.data_ptr<T>();
  T* lse_data = lse.data_ptr<T>();
  const int64_t tiles = (g.queries + QUERY_TILE - 1) / QUERY_TILE;
  at::parallel_for(0, g.batch * g.heads * tiles, 1, [&](int64_t begin, int64_t end) {
    Tile<T> tile(g, scale);
    std::vector<T> near(g.has_values ? QUERY_TILE * std::min(g.entries, g.keys) : 0);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t index = task % tiles, h = (task / tiles) % g.heads, b = task / (tiles * g.heads);
      const int64_t q0 = index * QUERY_TILE;
      T* o_rows = O.at(b, h) + q0 * O.row_stride;
      tile.compute(q0, C.at(b, h) + q0 * C.row_stride, C.row_stride, L.at(b, h) + q0 * L.row_stride, L.row_stride,
                   K.at(b, h), K.row_stride, tables + g.table_of(h) * g.entries * g.width);
      softmax_rows(tile.logits.data(), tile.rows, tile.key_end, [&](int64_t r) { return g.allowed(q0 + r); },
                   lse_data + (b * g.heads + h) * g.queries + q0);
      gemm(TransposeType::NoTranspose, TransposeType::NoTranspose, g.value_width, tile.rows, tile.key_end, T(1),
           V.at(b, h), V.row_stride, tile.logits.data(), tile.key_end, T(0), o_rows, O.row_stride);
      if (g.has_values) {  // out += P_near·values: each row's weights at the table's offsets
        tile.by_offset(tile.logits.data(), near.data());
        gemm(TransposeType::NoTranspose, TransposeType::NoTranspose, g.value_width, tile.rows, tile.reach, T(1),
             values + g.table_of(h) * g.entries * g.value_width, g.value_width, near.data(), tile.reach, T(1),
             o_rows, O.row_stride);
      }
    }
  });
}

template <typename T>
void backward_tiles(const at::Tensor& grad_out, const at::Tensor& c, const at::Tensor& l,
                    const at::Tensor& k, const at::Tensor& v, const at::Tensor& table, const T* values,
                    const at::Tensor& lse, const at::Tensor& row_terms, at::Tensor& grad_c,
                    at::Tensor& grad_l, at::Tensor& grad_k, at::Tensor& grad_v, at::Tensor& grad_table,
                    T* grad_values, const Geometry& g, T scale) {
  const Rows<T> dO(grad_out), C(c), L(l), K(k), V(v), dC(grad_c), dL(grad_l), dK(grad_k), dV(grad_v);
  const T* tables = table.data_ptr<T>();
  const T* lse_data = lse.data_ptr<T>();
  const T* row_term_data = row_terms.data_ptr<T>();  // (B, H, Tq): Σ_d dout·(out − value_floor)
  T* grad_tables = grad_table.data_ptr<T>();       // (B, H, N, Dh): each (b, h) task owns its table
  const int64_t reach_max = std::min(g.entries, g.keys);
  at::parallel_for(0, g.batch * g.heads, 1, [&](int64_t begin, int64_t end) {
    Tile<T> tile(g, scale);
    std::vector<T> grad_logits(QUERY_TILE * g.keys), grad_lookups(QUERY_TILE * reach_max);
    std::vector<T> near(g.has_values ? QUERY_TILE * reach_max : 0);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t h = task % g.heads, b = task / g.heads;
      const T* table_h = tables + g.table_of(h) * g.entries * g.width;
      const T* values_h = g.has_values ? values + g.table_of(h) * g.entries * g.value_width : nullptr;
      for (int64_t q0 = 0; q0 < g.queries; q0 += QUERY_TILE) {
        const T* c_rows = C.at(b, h) + q0 * C.row_stride;
        const T* l_rows = L.at(b, h) + q0 * L.row_stride;
        const T* do_rows = dO.at(b, h) + q0 * dO.row_stride;
        tile.compute(q0, c_rows, C.row_stride, l_rows, L.row_stride, K.at(b, h), K.row_stride, table_h);
        const int64_t rows = tile.rows, keys = tile.key_end, reach = tile.reach;
        const T* lse_rows = lse_data + task * g.queries + q0;
        const T* terms = row_term_data + task * g.queries + q0;
        T* probs = tile.logits.data();
        probabilities(probs, rows, keys, [&](int64_t r) { return g.allowed(q0 + r); }, lse_rows);
        // dV += Pᵀ·dO; dP = dO·Vᵀ
        gemm(TransposeType::NoTranspose, TransposeType::Transpose, g.value_width, keys, rows, T(1), do_rows,
             dO.row_stride, probs, keys, T(1), dV.at(b, h), dV.row_stride);
        gemm(TransposeType::Transpose, TransposeType::NoTranspose, keys, rows, g.value_width, T(1), V.at(b, h),
             V.row_stride, do_rows, dO.row_stride, T(0), grad_logits.data(), keys);
        if (g.has_values) {  // dValues += P_nearᵀ·dO; dP at the table's offsets += dO·valuesᵀ
          tile.by_offset(probs, near.data());
          gemm(TransposeType::NoTranspose, TransposeType::Transpose, g.value_width, reach, rows, T(1), do_rows,
               dO.row_stride, near.data(), reach, T(1), grad_values + task * g.entries * g.value_width,
               g.value_width);
          gemm(TransposeType::Transpose, TransposeType::NoTranspose, reach, rows, g.value_width, T(1), values_h,
               g.value_width, do_rows, dO.row_stride, T(0), near.data(), reach);
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t n = g.allowed(q0 + r), m = tile.in_table(r);
            T* dp_end = grad_logits.data() + r * keys + (n - 1);
            const T* by_offset = near.data() + r * reach;
            for (int64_t d = 0; d < m; ++d) dp_end[-d] += by_offset[d];
          }
        }
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t n = g.allowed(q0 + r);
          const T* p = probs + r * keys;
          T* ds = grad_logits.data() + r * keys;  // dP, then scale·dS: the gradient of c·k and of the lookups
          const T term = terms[r];
#pragma omp simd
          for (int64_t j = 0; j < n; ++j) ds[j] = p[j] * (ds[j] - term) * scale;
          std::fill(ds + n, ds + keys, T(0));
        }
        tile.by_offset(grad_logits.data(), grad_lookups.data());
        // dC = dS·K; dK += dSᵀ·C; dL = dLookups·table; dTable += dLookupsᵀ·L
        gemm(TransposeType::NoTranspose, TransposeType::NoTranspose, g.width, rows, keys, T(1), K.at(b, h),
             K.row_stride, grad_logits.data(), keys, T(0), dC.at(b, h) + q0 * dC.row_stride, dC.row_stride);
        gemm(TransposeType::NoTranspose, TransposeType::Transpose, g.width, keys, rows, T(1), c_rows, C.row_stride,
             grad_logits.data(), keys, T(1), dK.at(b, h), dK.row_stride);
        gemm(TransposeType::NoTranspose, TransposeType::NoTranspose, g.width, rows, reach, T(1), table_h, g.width,
             grad_lookups.data(), reach, T(0), dL.at(b, h) + q0 * dL.row_stride, dL.row_stride);
        gemm(TransposeType::NoTranspose, TransposeType::Transpose, g.width, reach, rows, T(1), l_rows, L.row_stride,
             grad_lookups.data(), reach, T(1), grad_tables + task * g.entries * g.width, g.width);
      }
    }
  });
}

Geometry geometry(const at::Tensor& c, const at::Tensor& l, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& table, const std::optional<at::Tensor>& values) {
  TORCH_CHECK(c.dim() == 4 && l.sizes() == c.sizes() && k.dim() == 4 && v.dim() == 4,
              "offset_lookup_attention: content and lookup queries, k, v must be 4-D, the queries alike");
  TORCH_CHECK(k.size(1) == c.size(1) && v.size(1) == c.size(1), "offset_lookup_attention: equal heads");
  TORCH_CHECK(c.stride(3) == 1 && l.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1,
              "offset_lookup_attention: unit stride along D");
  TORCH_CHECK(c.size(2) <= k.size(2), "offset_lookup_attention: more queries than keys");
  TORCH_CHECK(table.dim() == 3 && (table.size(0) == 1 || table.size(0) == c.size(1)) && table.size(1) >= 1 &&
              table.size(2) == c.size(3) && table.is_contiguous(),
              "offset_lookup_attention: table must be contiguous (1 or H, N >= 1, Dh)");
  TORCH_CHECK(!values || (values->dim() == 3 && values->size(0) == table.size(0) &&
                          values->size(1) == table.size(1) && values->size(2) == v.size(3) &&
                          values->is_contiguous() && values->scalar_type() == table.scalar_type()),
              "offset_lookup_attention: values must be contiguous (like the table, N, Dv)");
  return Geometry{c.size(0), c.size(1), c.size(2), k.size(2), c.size(3), v.size(3), table.size(1), table.size(0),
                  values.has_value()};
}

}  // namespace

// Returns (out (B, H, Tq, Dv) laid out token-major, lse (B, H, Tq)), in the queries' dtype.
std::vector<at::Tensor> offset_lookup_forward(at::Tensor c, at::Tensor l, at::Tensor k, at::Tensor v,
                                                 at::Tensor table, std::optional<at::Tensor> values,
                                                 double scale) {
  const Geometry g = geometry(c, l, k, v, table, values);
  auto out = at::empty({g.batch, g.queries, g.heads, g.value_width}, c.options()).transpose(1, 2);
  auto lse = at::empty({g.batch, g.heads, g.queries}, c.options());
  AT_DISPATCH_FLOATING_TYPES(c.scalar_type(), "offset_lookup_forward", [&] {
    forward_tiles<scalar_t>(c, l, k, v, table, values ? values->data_ptr<scalar_t>() : nullptr, out, lse, g,
                            static_cast<scalar_t>(scale));
  });
  return {out, lse};
}

// Returns (dc, dl, dk, dv, dtable, dvalues), the tables' gradients shaped like them (dvalues empty without
// values). row_terms: (B, H, Tq) contiguous, Σ_d dout·(out − value_floor): Σ_j p_ij·dP_ij.
std::vector<at::Tensor> offset_lookup_backward(at::Tensor grad_out, at::Tensor c, at::Tensor l,
                                                  at::Tensor k, at::Tensor v, at::Tensor table,
                                                  std::optional<at::Tensor> values, at::Tensor lse,
                                                  at::Tensor row_terms, double scale) {
  const Geometry g = geometry(c, l, k, v, table, values);
  TORCH_CHECK(grad_out.stride(3) == 1 && lse.is_contiguous() && row_terms.is_contiguous(),
              "offset_lookup_backward: layouts");
  auto grad_c = at::empty_like(c), grad_l = at::empty_like(l);
  auto grad_k = at::zeros_like(k), grad_v = at::zeros_like(v);
  auto grad_table = at::zeros({g.batch, g.heads, g.entries, g.width}, table.options());
  auto grad_values = at::zeros({g.has_values ? g.batch : 0, g.heads, g.entries, g.value_width}, table.options());
  AT_DISPATCH_FLOATING_TYPES(c.scalar_type(), "offset_lookup_backward", [&] {
    backward_tiles<scalar_t>(grad_out, c, l, k, v, table, values ? values->data_ptr<scalar_t>() : nullptr, lse,
                             row_terms, grad_c, grad_l, grad_k, grad_v, grad_table,
                             grad_values.data_ptr<scalar_t>(), g, static_cast<scalar_t>(scale));
  });
  // each (b, h) task summed into its own copy; a table every head shares gathers the heads' copies too
  auto gathered = [&](const at::Tensor& per_task) {
    auto per_head = per_task.sum(0);
    return g.table_heads == 1 ? per_head.sum(0, /*keepdim=*/true) : per_head;
  };
  return {grad_c, grad_l, grad_k, grad_v, gathered(grad_table),
          g.has_values ? gathered(grad_values) : at::Tensor()};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("offset_lookup_forward", &offset_lookup_forward,
        "causal attention with l·table[offset] terms (and values[offset] in the output): out, lse");
  m.def("offset_lookup_backward", &offset_lookup_backward, "its backward: dc, dl, dk, dv, dtable, dvalues");
}
