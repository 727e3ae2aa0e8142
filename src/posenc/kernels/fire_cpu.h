// FIRE's bias inside the CPU tiles of offset_bias_cpu.cpp: for query position i and key position j,
//   bias = f_h(x),  x = ψ(|i − j|) / (ψ(max(i, L)) + ε),  ψ(u) = log(1 + c·u),
// with the MLP f_h read as its linear segments (kernels/fire_segments.py): per head a row
// [keys (P), slopes (P), intercepts (P), c, L], P a power of two whose last key is +inf, and f_h(x) =
// slopes[s]·x + intercepts[s] on segment s = #{r : keys[r] < x}. ψ is a table over distances, built once per call
// and head; a row's x are its table entries times one reciprocal. The backward adds Σ ds and Σ ds·x per segment
// (the intercepts' and slopes' gradients) and each row's Σ ds·∂bias/∂c and Σ ds·∂bias/∂L, as the Triton tiles do
// (tiles_terms.py), so autograd carries them through the segments into the MLP, c and L.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace posenc_fire {

constexpr double EPSILON = 1e-6;  // encodings/fire.py's ε, added to ψ(max(i, L))

// One head's segments and its tables of ψ(u) and ∂ψ(u)/∂c = u / (1 + c·u) over distances u = 0 .. U − 1.
template <typename T>
struct Head {
  const T* keys;
  const T* slopes;
  const T* intercepts;
  T c, threshold;
  int64_t count;
  std::vector<T> psi, psi_by_c;

  Head(const T* row, int64_t entries, int64_t distances, bool with_gradients)
      : count((entries - 2) / 3), psi(distances), psi_by_c(with_gradients ? distances : 0) {
    keys = row;
    slopes = row + count;
    intercepts = row + 2 * count;
    c = row[entries - 2];
    threshold = row[entries - 1];
    for (int64_t u = 0; u < distances; ++u) psi[u] = std::log1p(c * static_cast<T>(u));
    for (int64_t u = 0; u < static_cast<int64_t>(psi_by_c.size()); ++u) {
      psi_by_c[u] = static_cast<T>(u) / (1 + c * static_cast<T>(u));
    }
  }

  // #{r : keys[r] < x}: a binary search over the sorted keys, whose last is +inf, so it lands in 0 .. count − 1
  int64_t segment(T x) const {
    int64_t s = 0;
    for (int64_t half = count / 2; half > 0; half /= 2) s += keys[s + half - 1] < x ? half : 0;
    return s;
  }
};

// One row's pairs within a key tile: x (and, for the backward, ∂ψ/∂c) per allowed column, and the least and
// greatest segment they reach.
template <typename T>
struct Row {
  T normalizer, inverse;  // max(i, L) and 1 / (ψ(max(i, L)) + ε)
  int64_t low = 0, high = 0;
  std::vector<T> x, psi_by_c, bias;

  explicit Row(int64_t columns) : x(columns), psi_by_c(columns), bias(columns) {}

  // Columns 0 .. valid − 1 at offsets i − j = d0, d0 − 1, ...: those at d ≥ 0 read the tables backwards, the rest
  // (bidirectional) forwards.
  void load(const Head<T>& head, int64_t query_position, int64_t d0, int64_t valid, bool with_gradients) {
    normalizer = std::max(static_cast<T>(query_position), head.threshold);
    inverse = T(1) / (std::log1p(head.c * normalizer) + static_cast<T>(EPSILON));
    const int64_t ahead = std::clamp<int64_t>(d0 + 1, 0, valid);
    const T* psi = head.psi.data();
#pragma omp simd
    for (int64_t col = 0; col < ahead; ++col) x[col] = psi[d0 - col] * inverse;
#pragma omp simd
    for (int64_t col = ahead; col < valid; ++col) x[col] = psi[col - d0] * inverse;
    if (with_gradients) {
      const T* by_c = head.psi_by_c.data();
      for (int64_t col = 0; col < ahead; ++col) psi_by_c[col] = by_c[d0 - col];
      for (int64_t col = ahead; col < valid; ++col) psi_by_c[col] = by_c[col - d0];
    }
    if (valid == 0) return;
    // x grows with the distance |d0 − col|: least where the key is nearest the query, greatest at an end
    low = head.segment(x[std::clamp<int64_t>(d0, 0, valid - 1)]);
    high = head.segment(std::max(x[0], x[valid - 1]));
  }

  // bias[col] = slopes[s]·x + intercepts[s], s the column's segment: from the least segment on, each key inside
  // the row's range of x moves the columns past it to the next (a tile far from the diagonal mostly spans none).
  void biases(const Head<T>& head, int64_t valid) {
    const T slope = head.slopes[low], intercept = head.intercepts[low];
#pragma omp simd
    for (int64_t col = 0; col < valid; ++col) bias[col] = slope * x[col] + intercept;
    for (int64_t r = low; r < high; ++r) {
      const T key = head.keys[r], next_slope = head.slopes[r + 1], next_intercept = head.intercepts[r + 1];
#pragma omp simd
      for (int64_t col = 0; col < valid; ++col)
        bias[col] = key < x[col] ? next_slope * x[col] + next_intercept : bias[col];
    }
  }

  // Adds Σ ds and Σ ds·x per segment to grad_row (its slopes at count + s, intercepts at 2·count + s) and this
  // row's Σ ds·∂bias/∂c and Σ ds·∂bias/∂L to grad_row's last two entries.
  void add_gradients(const Head<T>& head, const T* ds, int64_t valid, int64_t query_position, T* grad_row) {
    T along = 0, by_c = 0;  // Σ ds·slope·x and Σ ds·slope·∂ψ(|d|)/∂c, each column with its segment's slope
    if (low == high) {  // one segment, one pass: most tiles away from the diagonal
      T sum = 0, weighted = 0, pulled_by_c = 0;
#pragma omp simd reduction(+ : sum, weighted, pulled_by_c)
      for (int64_t col = 0; col < valid; ++col) {
        sum += ds[col];
        weighted += ds[col] * x[col];
        pulled_by_c += ds[col] * psi_by_c[col];
      }
      grad_row[head.count + low] += weighted;
      grad_row[2 * head.count + low] += sum;
      along = head.slopes[low] * weighted;
      by_c = head.slopes[low] * pulled_by_c;
    } else {
      add_segment_sums(head, ds, valid, grad_row, along, by_c);
    }
    const T grown = normalizer / (1 + head.c * normalizer) * inverse;  // ∂ log(ψ(max(i, L)) + ε) / ∂c
    const T position = static_cast<T>(query_position);
    const T chosen = head.threshold > position ? T(1) : head.threshold == position ? T(0.5) : T(0);  // as torch's max
    grad_row[3 * head.count] += by_c * inverse - along * grown;
    grad_row[3 * head.count + 1] -= along * chosen * head.c / (1 + head.c * normalizer) * inverse;
  }

  // add_gradients' sums over several segments; reuses bias for each column's slope.
  void add_segment_sums(const Head<T>& head, const T* ds, int64_t valid, T* grad_row, T& along, T& by_c) {
    constexpr T infinity = std::numeric_limits<T>::infinity();
    T* slope_of = bias.data();
    const T first_slope = head.slopes[low];
#pragma omp simd
    for (int64_t col = 0; col < valid; ++col) slope_of[col] = first_slope;
    for (int64_t s = low; s <= high; ++s) {  // the columns of segment s: past keys low .. s − 1, not past key s
      const T below = s > low ? head.keys[s - 1] : -infinity, above = s < high ? head.keys[s] : infinity;
      const T slope = head.slopes[s];
      T sum = 0, weighted = 0;
#pragma omp simd reduction(+ : sum, weighted)
      for (int64_t col = 0; col < valid; ++col) {
        const bool inside = below < x[col] && !(above < x[col]);
        sum += inside ? ds[col] : T(0);
        weighted += inside ? ds[col] * x[col] : T(0);
        slope_of[col] = inside ? slope : slope_of[col];
      }
      grad_row[head.count + s] += weighted;
      grad_row[2 * head.count + s] += sum;
    }
    T pulled_along = 0, pulled_by_c = 0;
#pragma omp simd reduction(+ : pulled_along, pulled_by_c)
    for (int64_t col = 0; col < valid; ++col) {
      const T pulled = ds[col] * slope_of[col];  // ds · ∂bias/∂x
      pulled_along += pulled * x[col];
      pulled_by_c += pulled * psi_by_c[col];
    }
    along = pulled_along;
    by_c = pulled_by_c;
  }
};

}  // namespace posenc_fire
