// What posenc's tiled CPU attention kernels share: torch's BLAS for the tile products, a vectorizable float
// exp, row access to (B, H, T, D) tensors with unit stride along D, and the softmax of a tile whose rows see all
// their keys at once (forward) and its probabilities again from the log-sum-exp (backward).
#pragma once

#include "kernel_api.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

extern "C" {
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*, const float*, const int*,
            const float*, const int*, const float*, float*, const int*);
void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*, const double*, const int*,
            const double*, const int*, const double*, double*, const int*);
}

namespace posenc_tiles {

enum class TransposeType : char { NoTranspose = 'N', Transpose = 'T' };

// C (m×n, column-major) = alpha·op(A)·op(B) + beta·C, on the Fortran sgemm_/dgemm_ torch links (row-major tiles
// are passed as their column-major transposes); a torch without those symbols fails to load the kernel, and
// posenc then uses the PyTorch form.
template <typename T>
void gemm(TransposeType ta, TransposeType tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
          const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  const char transa = static_cast<char>(ta), transb = static_cast<char>(tb);
  const int m_ = m, n_ = n, k_ = k, lda_ = lda, ldb_ = ldb, ldc_ = ldc;
  if constexpr (std::is_same_v<T, float>) {
    sgemm_(&transa, &transb, &m_, &n_, &k_, &alpha, a, &lda_, b, &ldb_, &beta, c, &ldc_);
  } else {
    dgemm_(&transa, &transb, &m_, &n_, &k_, &alpha, a, &lda_, b, &ldb_, &beta, c, &ldc_);
  }
}

// Below this, exp of a float is exactly 0. exp(-60) is 9e-27: a weight that small changes no float sum it joins
// (the row's largest weight is 1), yet it is no harmless zero. Multiplied by a value or a gradient, a weight near
// exp(-87) gives a subnormal, and x86 CPUs without flush-to-zero take a microcode assist on every subnormal
// operand: on an Intel Xeon, ALiBi's distant keys made its training step 1.5x NoPE's at 512 tokens (2.9x at
// 2,048) while Sandwich, the same kernel with bounded biases, ran at 0.9x. Any weight left is >= 9e-27, so its
// products stay normal for factors down to 1e-12.
constexpr float FLOAT_FLOOR = -60.0f;

// exp(x) for float in a form the compiler vectorizes: x = n·ln2 + f with n rounded by the 1.5·2^23 trick,
// ln2 split in two (Cody–Waite) so f is exact, e^f by its Taylor series to degree 7 (|f| <= ln2/2: relative
// error below 1e-7), 2^n put into the exponent bits; 0 below FLOAT_FLOOR (masked entries too).
inline float exp_of(float x) {
  const bool vanishes = x < FLOAT_FLOOR;
  x = std::min(std::max(x, FLOAT_FLOOR), 88.0f);
  const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer in the low mantissa bits
  const float shifted = x * 1.4426950408889634f + shifter;
  const float n = shifted - shifter;
  const float f = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.0f / 5040.0f;
  p = p * f + 1.0f / 720.0f;
  p = p * f + 1.0f / 120.0f;
  p = p * f + 1.0f / 24.0f;
  p = p * f + 1.0f / 6.0f;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  bits = (bits - 0x4B400000 + 127) << 23;  // the integer n sits in the low bits of shifted's mantissa
  float power;
  std::memcpy(&power, &bits, sizeof power);
  return vanishes ? 0.0f : p * power;
}

inline double exp_of(double x) { return std::exp(x); }

// A (B, H, T, D) tensor with unit stride along D: the row pointer of (b, h) and the stride between its rows.
template <typename T>
struct Rows {
  T* data;
  int64_t batch_stride, head_stride, row_stride;
  explicit Rows(const at::Tensor& x)
      : data(x.data_ptr<T>()), batch_stride(x.stride(0)), head_stride(x.stride(1)), row_stride(x.stride(2)) {}
  T* at(int64_t b, int64_t h) const { return data + b * batch_stride + h * head_stride; }
};

// The largest of s[0..n), −inf for none: written so that GCC vectorizes it (std::max in the loop it leaves scalar,
// a chain of dependent compares as long as the row).
template <typename T>
T largest(const T* s, int64_t n) {
  T top = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : top)
  for (int64_t j = 0; j < n; ++j) top = s[j] > top ? s[j] : top;
  return top;
}

// Each row r of a rows × stride tile softmaxed in place over its first allowed(r) entries, the rest zeroed;
// lse[r] gets the row's log-sum-exp (the backward's ``probabilities``).
template <typename T, typename Allowed>
void softmax_rows(T* tile, int64_t rows, int64_t stride, Allowed allowed, T* lse) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = allowed(r);
    T* s = tile + r * stride;
    const T top = largest(s, n);
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) {
      s[j] = exp_of(s[j] - top);
      sum += s[j];
    }
    const T inverse = T(1) / sum;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) s[j] *= inverse;
    std::fill(s + n, s + stride, T(0));
    lse[r] = top + std::log(sum);
  }
}

// The tile's logits, each row's first allowed(r) of them, turned back into the forward's probabilities
// exp(s − lse[r]) in place, the rest zeroed.
template <typename T, typename Allowed>
void probabilities(T* tile, int64_t rows, int64_t stride, Allowed allowed, const T* lse) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = allowed(r);
    T* p = tile + r * stride;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) p[j] = exp_of(p[j] - lse[r]);
    std::fill(p + n, p + stride, T(0));
  }
}

}  // namespace posenc_tiles
