// CoPE attention on CPU (Golovneva et al. 2024), causal, in query tiles: the gates, their counts, the
// interpolated position logits and the softmax of one tile live in a per-thread buffer of tile × keys, so no
// (B, H, Tq, Tk) tensor exists, forward or backward. The eager backend in attention.py is the reference it must
// equal (the same order of summation for the counts: from the query's own key down to the first).
//
// Shapes: B batch, H heads, Tq queries at positions start..start+Tq-1 (start = Tk − Tq), Tk keys at 0..Tk-1,
// Dh head width, Dv value width, P table rows. For query i and key j ≤ start + i:
//   s_ij = q_i·k_j,  g_ij = σ(gate_scale·s_ij),  p_ij = min(Σ_{t=j..start+i} g_it, P − 1),
//   logit_ij = scale·s_ij + lerp(q_i·e[⌊p_ij⌋], q_i·e[⌈p_ij⌉], p_ij − ⌊p_ij⌋).
// Products run on the BLAS torch links (cpu_tiles.h).
#include "kernel_api.h"

#include "cpu_tiles.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

using namespace posenc_tiles;

constexpr int64_t QUERY_TILE = 32;
constexpr int64_t CHAINS = 4;  // rows whose serial sums run interleaved

struct Geometry {
  int64_t batch, heads, queries, keys, width, value_width, positions;
  int64_t start() const { return keys - queries; }
  int64_t allowed(int64_t i) const { return std::min(keys, start() + i + 1); }  // keys 0..allowed-1
  // table rows a tile can reach: counts never pass the number of keys a query sees
  int64_t rows_used(int64_t key_end) const { return std::min(positions, key_end + 1); }
};

// A count's place in the table: rows below = ⌊p⌋ and above = ⌈p⌉ of p = min(count, last), and p − ⌊p⌋. Counts
// are sums of gates, never negative, so truncation is the floor. Written without std::floor, std::ceil, std::min
// and 64-bit indices, any of which keeps GCC from vectorizing a loop over it (its gathers then take 32-bit indices).
template <typename T>
struct Between {
  int32_t below, above;
  T fraction;
  Between(T count, T last) {
    const T p = count < last ? count : last;
    below = static_cast<int32_t>(p);
    const T floor = static_cast<T>(below);
    above = below + (p > floor ? 1 : 0);
    fraction = p - floor;
  }
};

// One query tile's numbers, recomputed identically by forward and backward.
template <typename T>
struct Tile {
  const Geometry& g;
  T scale, gate_scale;
  int64_t q0, rows, key_end, used;  // queries q0..q0+rows-1, keys 0..key_end-1, table rows 0..used-1
  std::vector<T> dots, gates, counts, per_row;  // rows × key_end (dots, gates, counts), rows × used (q·e)

  Tile(const Geometry& g, T scale, T gate_scale) : g(g), scale(scale), gate_scale(gate_scale) {
    dots.resize(QUERY_TILE * g.keys);
    gates.resize(QUERY_TILE * g.keys);
    counts.resize(QUERY_TILE * g.keys);
    per_row.resize(QUERY_TILE * g.positions);
  }

  // dots = q·kᵀ, the gates and counts, per_row = q·eᵀ over the table rows the counts reach, then the logits
  // (written over dots) of the tile
  void logits(int64_t tile_q0, const T* q_rows, int64_t q_stride, const T* k_rows, int64_t k_stride, const T* table) {
    q0 = tile_q0;
    rows = std::min(QUERY_TILE, g.queries - q0);
    key_end = g.allowed(q0 + rows - 1);
    gemm(TransposeType::Transpose, TransposeType::NoTranspose, key_end, rows, g.width, T(1), k_rows, k_stride,
         q_rows, q_stride, T(0), dots.data(), key_end);
    const T last = T(g.positions - 1);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = g.allowed(q0 + r);
      const T* s = dots.data() + r * key_end;
      T* gate = gates.data() + r * key_end;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) gate[j] = T(1) / (T(1) + exp_of(-gate_scale * s[j]));
    }
    for (int64_t r = 0; r < rows; r += CHAINS) count_rows(r, std::min(CHAINS, rows - r));
    T reached = 0;  // the tile's largest count: a row's first key's, which counts every gate of the row
    for (int64_t r = 0; r < rows; ++r) {
      if (g.allowed(q0 + r) > 0) reached = std::max(reached, counts[r * key_end]);
    }
    // rows 0..⌈min(reached, P − 1)⌉: with gates well below 1 (what CoPE learns) far fewer than the keys
    used = std::min(g.rows_used(key_end), static_cast<int64_t>(std::ceil(std::min(reached, last))) + 1);
    gemm(TransposeType::Transpose, TransposeType::NoTranspose, used, rows, g.width, T(1), table, g.width, q_rows,
         q_stride, T(0), per_row.data(), used);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = g.allowed(q0 + r);
      T* s = dots.data() + r * key_end;
      const T* count = counts.data() + r * key_end;
      const T* e = per_row.data() + r * used;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        const Between<T> at(count[j], last);
        s[j] = s[j] * scale + lerp(e[at.below], e[at.above], at.fraction);
      }
    }
  }

  // counts[r][j] = Σ_{t=j..n_r−1} gates[r][t] for the rows first..first+chains−1: in double and in that order, as
  // torch's cumsum of the flipped gates accumulates a float on CPU. A row's sum is a chain of dependent additions;
  // CHAINS rows at a time, their chains interleaved, keep the adder busy.
  void count_rows(int64_t first, int64_t chains) {
    double running[CHAINS] = {};
    int64_t shared = g.keys;  // the keys every row of the group sees
    for (int64_t c = 0; c < chains; ++c) shared = std::min(shared, g.allowed(q0 + first + c));
    for (int64_t c = 0; c < chains; ++c) {  // each row's keys past the shared ones, alone
      const T* gate = gates.data() + (first + c) * key_end;
      T* count = counts.data() + (first + c) * key_end;
      for (int64_t j = g.allowed(q0 + first + c) - 1; j >= shared; --j) {
        running[c] += gate[j];
        count[j] = static_cast<T>(running[c]);
      }
    }
    const T* gate = gates.data() + first * key_end;
    T* count = counts.data() + first * key_end;
    for (int64_t j = shared - 1; j >= 0; --j) {
      for (int64_t c = 0; c < chains; ++c) {
        running[c] += gate[c * key_end + j];
        count[c * key_end + j] = static_cast<T>(running[c]);
      }
    }
  }

  // torch.lerp's formula, so values agree with eager to the last bit where the arithmetic does
  static T lerp(T lo, T hi, T w) { return w < T(0.5) ? lo + w * (hi - lo) : hi - (hi - lo) * (T(1) - w); }
};

template <typename T>
void forward_tiles(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
                   at::Tensor& out, at::Tensor& lse, const Geometry& g, T scale, T gate_scale) {
  const Rows<T> Q(q), K(k), V(v), O(out);
  const T* table_data = table.data_ptr<T>();
  T* lse_data = lse.data_ptr<T>();
  const int64_t tiles = (g.queries + QUERY_TILE - 1) / QUERY_TILE;
  at::parallel_for(0, g.batch * g.heads * tiles, 1, [&](int64_t begin, int64_t end) {
    Tile<T> tile(g, scale, gate_scale);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t index = task % tiles, h = (task / tiles) % g.heads, b = task / (tiles * g.heads);
      const T* q_rows = Q.at(b, h) + index * QUERY_TILE * Q.row_stride;
      tile.logits(index * QUERY_TILE, q_rows, Q.row_stride, K.at(b, h), K.row_stride, table_data);
      softmax_rows(tile.dots.data(), tile.rows, tile.key_end, [&](int64_t r) { return g.allowed(tile.q0 + r); },
                   lse_data + (b * g.heads + h) * g.queries + tile.q0);
      gemm(TransposeType::NoTranspose, TransposeType::NoTranspose, g.value_width, tile.rows, tile.key_end, T(1),
           V.at(b, h), V.row_stride, tile.dots.data(), tile.key_end, T(0), O.at(b, h) + tile.q0 * O.row_stride,
           O.row_stride);
    }
  });
}

template <typename T>
void backward_tiles(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                    const at::Tensor& v, const at::Tensor& table, const at::Tensor& lse,
                    const at::Tensor& row_terms, at::Tensor& grad_q, at::Tensor& grad_k, at::Tensor& grad_v,
                    at::Tensor& grad_table, const Geometry& g, T scale, T gate_scale) {
  const Rows<T> dO(grad_out), Q(q), K(k), V(v), dQ(grad_q), dK(grad_k), dV(grad_v);
  const T* table_data = table.data_ptr<T>();
  const T* lse_data = lse.data_ptr<T>();
  const T* row_term_data = row_terms.data_ptr<T>();  // (B, H, Tq): Σ_d dout·out
  T* grad_tables = grad_table.data_ptr<T>();       // (B·H, P, Dh): each (b, h) task owns its table
  const T last = T(g.positions - 1);
  at::parallel_for(0, g.batch * g.heads, 1, [&](int64_t begin, int64_t end) {
    Tile<T> tile(g, scale, gate_scale);
    std::vector<T> grad_logits(QUERY_TILE * g.keys), grad_per_row(QUERY_TILE * g.positions), passed_row(g.keys);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t h = task % g.heads, b = task / g.heads;
      for (int64_t q0 = 0; q0 < g.queries; q0 += QUERY_TILE) {
        const T* q_rows = Q.at(b, h) + q0 * Q.row_stride;
        const T* do_rows = dO.at(b, h) + q0 * dO.row_stride;
        tile.logits(q0, q_rows, Q.row_stride, K.at(b, h), K.row_stride, table_data);
        const int64_t rows = tile.rows, keys = tile.key_end, used = tile.used;
        const T* lse_rows = lse_data + task * g.queries + q0;
        const T* terms = row_term_data + task * g.queries + q0;
        T* probs = tile.dots.data();
        probabilities(probs, rows, keys, [&](int64_t r) { return g.allowed(q0 + r); }, lse_rows);
        // dV += Pᵀ·dO; dP = dO·Vᵀ
        gemm(TransposeType::NoTranspose, TransposeType::Transpose, g.value_width, keys, rows, T(1), do_rows,
             dO.row_stride, probs, keys, T(1), dV.at(b, h), dV.row_stride);
        gemm(TransposeType::Transpose, TransposeType::NoTranspose, keys, rows, g.value_width, T(1), V.at(b, h),
             V.row_stride, do_rows, dO.row_stride, T(0), grad_logits.data(), keys);
        std::fill(grad_per_row.begin(), grad_per_row.begin() + rows * used, T(0));
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t n = g.allowed(q0 + r);
          const T* p = probs + r * keys;
          const T* gate = tile.gates.data() + r * keys;
          const T* count = tile.counts.data() + r * keys;
          const T* e = tile.per_row.data() + r * used;
          T* de = grad_per_row.data() + r * used;
          T* dl = grad_logits.data() + r * keys;  // dP, then ∂loss/∂logit, then the gradient of the dots q·k
          T* passed = passed_row.data();
          const T term = terms[r];
          // Three loops, so that the two with no chain from key to key vectorize. ∂loss/∂logit (over dP), and what
          // each count passes to its gates: nothing where it lands on a row, ⌊p⌋ = ⌈p⌉, as torch's lookups pass
          // nothing there, so nothing past the clamp either ...
#pragma omp simd
          for (int64_t j = 0; j < n; ++j) {
            dl[j] = p[j] * (dl[j] - term);
            const Between<T> at(count[j], last);
            passed[j] = dl[j] * (e[at.above] - e[at.below]);
          }
          // ... the table's gradient, and the gradient of gate j, Σ_{t ≤ j} passed_t (every count p_it with t ≤ j
          // holds the gate), summed in double in key order ...
          double carried = 0;
          for (int64_t j = 0; j < n; ++j) {
            const Between<T> at(count[j], last);
            de[at.below] += dl[j] * (T(1) - at.fraction);
            de[at.above] += dl[j] * at.fraction;
            carried += passed[j];
            passed[j] = static_cast<T>(carried);
          }
          // ... and the gradient of the dots q·k
#pragma omp simd
          for (int64_t j = 0; j < n; ++j) {
            dl[j] = dl[j] * scale + passed[j] * gate[j] * (T(1) - gate[j]) * gate_scale;
          }
          std::fill(dl + n, dl + keys, T(0));
        }
        // dQ = dDots·K + dE_rows·E; dK += dDotsᵀ·Q; dTable += dE_rowsᵀ·Q
        T* dq_rows = dQ.at(b, h) + q0 * dQ.row_stride;
        gemm(TransposeType::NoTranspose, TransposeType::NoTranspose, g.width, rows, keys, T(1), K.at(b, h),
             K.row_stride, grad_logits.data(), keys, T(0), dq_rows, dQ.row_stride);
        gemm(TransposeType::NoTranspose, TransposeType::NoTranspose, g.width, rows, used, T(1), table_data, g.width,
             grad_per_row.data(), used, T(1), dq_rows, dQ.row_stride);
        gemm(TransposeType::NoTranspose, TransposeType::Transpose, g.width, keys, rows, T(1), q_rows, Q.row_stride,
             grad_logits.data(), keys, T(1), dK.at(b, h), dK.row_stride);
        gemm(TransposeType::NoTranspose, TransposeType::Transpose, g.width, used, rows, T(1), q_rows, Q.row_stride,
             grad_per_row.data(), used, T(1), grad_tables + task * g.positions * g.width, g.width);
      }
    }
  });
}

Geometry geometry(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "gated_counts_attention: q, k, v must be 4-D");
  TORCH_CHECK(k.size(1) == q.size(1) && v.size(1) == q.size(1), "gated_counts_attention: q, k, v need equal heads");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "gated_counts_attention: unit stride along D");
  TORCH_CHECK(q.size(2) <= k.size(2), "gated_counts_attention: more queries than keys");
  TORCH_CHECK(table.dim() == 2 && table.size(1) == q.size(3) && table.size(0) >= 2 && table.is_contiguous(),
              "gated_counts_attention: table must be contiguous (P >= 2, Dh)");
  return Geometry{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), v.size(3), table.size(0)};
}

}  // namespace

// Returns (out (B, H, Tq, Dv) laid out token-major, lse (B, H, Tq)), in q's dtype.
std::vector<at::Tensor> gated_counts_forward(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor table,
                                                double scale, double gate_scale) {
  const Geometry g = geometry(q, k, v, table);
  auto out = at::empty({g.batch, g.queries, g.heads, g.value_width}, q.options()).transpose(1, 2);
  auto lse = at::empty({g.batch, g.heads, g.queries}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "gated_counts_forward", [&] {
    forward_tiles<scalar_t>(q, k, v, table, out, lse, g, static_cast<scalar_t>(scale),
                            static_cast<scalar_t>(gate_scale));
  });
  return {out, lse};
}

// Returns (dq, dk, dv, dtable (P, Dh)). row_terms: (B, H, Tq) contiguous.
std::vector<at::Tensor> gated_counts_backward(at::Tensor grad_out, at::Tensor q, at::Tensor k,
                                                 at::Tensor v, at::Tensor table, at::Tensor lse,
                                                 at::Tensor row_terms, double scale, double gate_scale) {
  const Geometry g = geometry(q, k, v, table);
  TORCH_CHECK(grad_out.stride(3) == 1 && lse.is_contiguous() && row_terms.is_contiguous(),
              "gated_counts_backward: layouts");
  auto grad_q = at::empty_like(q), grad_k = at::zeros_like(k), grad_v = at::zeros_like(v);
  auto grad_table = at::zeros({g.batch * g.heads, g.positions, g.width}, table.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "gated_counts_backward", [&] {
    backward_tiles<scalar_t>(grad_out, q, k, v, table, lse, row_terms, grad_q, grad_k, grad_v, grad_table, g,
                             static_cast<scalar_t>(scale), static_cast<scalar_t>(gate_scale));
  });
  return {grad_q, grad_k, grad_v, grad_table.sum(0)};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gated_counts_forward", &gated_counts_forward, "CoPE attention, causal: out, lse");
  m.def("gated_counts_backward", &gated_counts_backward, "its backward: dq, dk, dv, dtable");
}
