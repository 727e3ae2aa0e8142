// RoPE on CPU in one pass over the bytes: every row of (B, H, T, Dh) is read once and
// written once (in place, or into an output), with cos/sin read from a small (B or 1, T, F)
// table that stays in cache. The plain PyTorch form in rope.py is the reference it must equal.
#include "kernel_api.h"

namespace {

template <typename scalar_t, typename math_t>
void rotate_rows(const at::Tensor& x, at::Tensor& out, const at::Tensor& cos, const at::Tensor& sin,
                 bool interleaved, bool inverse) {
  const int64_t heads = x.size(1), length = x.size(2), width = x.size(3), pairs = cos.size(-1);
  const int64_t rows = x.size(0) * heads * length;
  const int64_t table_batch_stride = cos.size(0) == 1 ? 0 : length * pairs;
  const scalar_t* source = x.data_ptr<scalar_t>();
  scalar_t* target = out.data_ptr<scalar_t>();
  const math_t* cos_table = cos.data_ptr<math_t>();
  const math_t* sin_table = sin.data_ptr<math_t>();
  const math_t sign = inverse ? math_t(-1) : math_t(1);  // the backward pass rotates by -angle
  const bool copy_rest = source != target && 2 * pairs < width;
  const int64_t in_b = x.stride(0), in_h = x.stride(1), in_t = x.stride(2);
  const int64_t out_b = out.stride(0), out_h = out.stride(1), out_t = out.stride(2);
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t t = r % length, head = (r / length) % heads, batch = r / (length * heads);
      const scalar_t* in = source + batch * in_b + head * in_h + t * in_t;
      scalar_t* o = target + batch * out_b + head * out_h + t * out_t;
      const math_t* c = cos_table + batch * table_batch_stride + t * pairs;
      const math_t* s = sin_table + batch * table_batch_stride + t * pairs;
      const int64_t second = interleaved ? 1 : pairs;  // offset of a pair's second member
      const int64_t step = interleaved ? 2 : 1;        // distance between consecutive pairs
#pragma omp simd
      for (int64_t f = 0; f < pairs; ++f) {
        const math_t x1 = static_cast<math_t>(in[f * step]), x2 = static_cast<math_t>(in[f * step + second]);
        const math_t sine = sign * s[f];
        o[f * step] = static_cast<scalar_t>(x1 * c[f] - x2 * sine);
        o[f * step + second] = static_cast<scalar_t>(x2 * c[f] + x1 * sine);
      }
      if (copy_rest) {
        for (int64_t d = 2 * pairs; d < width; ++d) o[d] = in[d];
      }
    }
  });
}

}  // namespace

// x, out: (B, H, T, Dh) with unit stride along Dh (out may be x); cos, sin: contiguous (B or 1, 1, T, F),
// float32 or float64, the math dtype.
void rotate_pairs_cpu(at::Tensor x, at::Tensor out, at::Tensor cos, at::Tensor sin, bool interleaved,
                      bool inverse) {
  TORCH_CHECK(x.stride(3) == 1 && out.stride(3) == 1, "rotate_pairs_cpu: the head width must have unit stride");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous(), "rotate_pairs_cpu: cos and sin must be contiguous");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rotate_pairs_cpu", [&] {
    if (cos.scalar_type() == at::kDouble) {
      rotate_rows<scalar_t, double>(x, out, cos, sin, interleaved, inverse);
    } else {
      rotate_rows<scalar_t, float>(x, out, cos, sin, interleaved, inverse);
    }
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rotate_pairs_cpu", &rotate_pairs_cpu, "rotate the pairs of x by (cos, sin) into out (which may be x)");
}
