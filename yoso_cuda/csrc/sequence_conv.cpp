// The depthwise convolution along the sequence that YOSO-C and Nystromformer add to their output, on the CPU:
//
//   out[b, h, i, :] = sum_t w[h, t] x[b, h, i + t - r, :],   r = (width - 1) / 2, x = 0 outside [0, n)
//
// F.conv2d of the (batch, heads, n, c) layout with one (width, 1) kernel per head (groups = heads, a
// cross-correlation). Its gradients are sums of the same form:
//
//   grad_x[b, h, j, :] = sum_t w[h, width - 1 - t] grad_out[b, h, j + t - r, :]   (the reversed taps)
//   grad_w[h, t]       = sum_{b, i} grad_out[b, h, i, :] . x[b, h, i + t - r, :]
//
// A head row's n x c values are contiguous, so rows [lo, hi) shifted by t - r are one contiguous span: four taps are
// one pass of multiply-adds over a block of rows that stays in L1 with the rows it reads.
// oneDNN's depthwise convolution of this layout is memory-bound on the scattered taps: at the paper's ListOps shape
// (32, 2, 2048, 32) with 33 taps it took 56 ms forward and 149 ms forward + backward on the 2-core VM.
//
// Each head row is one thread's, and grad_w's sums are kept per head row and added over the batch in a fixed order:
// the results are bitwise the same on any number of threads. The tests' oracle is F.conv2d in float64.

// The headers of the operators used, not ATen/ATen.h (see softmax_dropout.cpp).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "simd.h"

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

namespace yoso {
namespace {

struct Shape {
  int64_t heads, head_rows, n, c, width;
  int64_t radius() const { return width / 2; }
  int64_t row_size() const { return n * c; }  // floats of one head row
  int64_t block() const { return std::max<int64_t>(1, 4096 / std::max<int64_t>(c, 1)); }  // rows: 16 KiB of output
};

// Calls four(lo, hi, t) for the rows [lo, hi) of the block [begin, end) that each of the taps t..t+3 reads, and
// one(lo, hi, t) for the rest of each tap's rows: the rows all four share are read in one pass, with four
// independent chains of multiply-adds (one tap a pass is bound by its stores, or by the latency of its one chain).
template <typename Four, typename One>
YOSO_INLINE void for_each_tap(const Shape& s, int64_t begin, int64_t end, Four four, One one) {
  // Tap t reads the rows i + t - r: those i whose input row is real. Both ends fall as t grows.
  const auto first = [&](int64_t t) { return std::max(begin, s.radius() - t); };
  const auto last = [&](int64_t t) { return std::min(end, s.n + s.radius() - t); };
  int64_t t = 0;
  for (; t + 4 <= s.width; t += 4) {
    const int64_t lo = first(t), hi = last(t + 3);  // the rows of all four
    if (lo < hi) four(lo, hi, t);
    for (int64_t u = t; u < t + 4; ++u) {
      if (lo >= hi) {
        if (first(u) < last(u)) one(first(u), last(u), u);
        continue;
      }
      if (first(u) < lo) one(first(u), lo, u);
      if (hi < last(u)) one(hi, last(u), u);
    }
  }
  for (; t < s.width; ++t)
    if (first(t) < last(t)) one(first(t), last(t), t);
}

// out = sum_t taps[t] x shifted by t - r, over one head row (n rows of c floats).
YOSO_MULTIVERSIONED void correlate(const Shape& s, const float* x, const float* taps, float* out) {
  const int64_t c = s.c, radius = s.radius();
  for (int64_t begin = 0; begin < s.n; begin += s.block()) {
    const int64_t end = std::min(s.n, begin + s.block());
    std::fill(out + begin * c, out + end * c, 0.f);
    const auto four = [&](int64_t lo, int64_t hi, int64_t t) {
      float* o = out + lo * c;
      const float* in = x + (lo + t - radius) * c;  // tap t's rows; tap t + u's are u rows further
      const float w0 = taps[t], w1 = taps[t + 1], w2 = taps[t + 2], w3 = taps[t + 3];
      const int64_t size = (hi - lo) * c;
      int64_t k = 0;
      for (; k + kLanes <= size; k += kLanes)
        store(o + k, load(o + k) + w0 * load(in + k) + w1 * load(in + k + c) + w2 * load(in + k + 2 * c) +
                         w3 * load(in + k + 3 * c));
      for (; k < size; ++k) o[k] += w0 * in[k] + w1 * in[k + c] + w2 * in[k + 2 * c] + w3 * in[k + 3 * c];
    };
    const auto one = [&](int64_t lo, int64_t hi, int64_t t) {
      axpy(out + lo * c, taps[t], x + (lo + t - radius) * c, (hi - lo) * c);
    };
    for_each_tap(s, begin, end, four, one);
  }
}

// sums[t] = sum_i grad_out[i] . x[i + t - r], over one head row.
YOSO_MULTIVERSIONED void tap_gradients(const Shape& s, const float* grad_out, const float* x, double* sums) {
  const int64_t c = s.c, radius = s.radius();
  std::fill(sums, sums + s.width, 0.0);
  for (int64_t begin = 0; begin < s.n; begin += s.block()) {
    const int64_t end = std::min(s.n, begin + s.block());
    const auto four = [&](int64_t lo, int64_t hi, int64_t t) {
      const float* g = grad_out + lo * c;
      const float* in = x + (lo + t - radius) * c;
      const int64_t size = (hi - lo) * c;
      Floats a0{}, a1{}, a2{}, a3{};
      int64_t k = 0;
      for (; k + kLanes <= size; k += kLanes) {
        const Floats gk = load(g + k);
        a0 += gk * load(in + k);
        a1 += gk * load(in + k + c);
        a2 += gk * load(in + k + 2 * c);
        a3 += gk * load(in + k + 3 * c);
      }
      float s0 = horizontal_sum(a0), s1 = horizontal_sum(a1), s2 = horizontal_sum(a2), s3 = horizontal_sum(a3);
      for (; k < size; ++k) {
        s0 += g[k] * in[k];
        s1 += g[k] * in[k + c];
        s2 += g[k] * in[k + 2 * c];
        s3 += g[k] * in[k + 3 * c];
      }
      sums[t] += s0;
      sums[t + 1] += s1;
      sums[t + 2] += s2;
      sums[t + 3] += s3;
    };
    const auto one = [&](int64_t lo, int64_t hi, int64_t t) {
      sums[t] += dot(grad_out + lo * c, x + (lo + t - radius) * c, (hi - lo) * c);
    };
    for_each_tap(s, begin, end, four, one);
  }
}

Shape check_arguments(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK_VALUE(x.dim() == 4, "sequence_conv takes x of shape (batch, heads, n, c), got ", x.sizes());
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.size(0) == x.size(1), "sequence_conv takes weight of shape (heads, width) = (",
                    x.size(1), ", width) for x ", x.sizes(), ", got ", weight.sizes());
  TORCH_CHECK_VALUE(weight.size(1) % 2 == 1, "sequence_conv's width must be odd (the kernel centred on each token), got ",
                    weight.size(1));
  TORCH_CHECK_VALUE(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat,
                    "sequence_conv computes in float32; got x ", x.scalar_type(), " and weight ", weight.scalar_type());
  return Shape{x.size(1), x.size(0) * x.size(1), x.size(2), x.size(3), weight.size(1)};
}

at::Tensor sequence_conv_cpu(const at::Tensor& x_in, const at::Tensor& weight_in) {
  const Shape s = check_arguments(x_in, weight_in);
  const at::Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options());
  const float* xs = x.data_ptr<float>();
  const float* taps = weight.data_ptr<float>();
  float* outs = out.data_ptr<float>();
  at::parallel_for(0, s.head_rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row)
      correlate(s, xs + row * s.row_size(), taps + (row % s.heads) * s.width, outs + row * s.row_size());
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> sequence_conv_backward_cpu(const at::Tensor& grad_out_in, const at::Tensor& x_in,
                                                              const at::Tensor& weight_in) {
  const Shape s = check_arguments(x_in, weight_in);
  TORCH_CHECK_VALUE(grad_out_in.sizes() == x_in.sizes() && grad_out_in.scalar_type() == at::kFloat,
                    "sequence_conv_backward takes a float32 grad_out of x's shape ", x_in.sizes(), ", got ",
                    grad_out_in.scalar_type(), " ", grad_out_in.sizes());
  const at::Tensor grad_out = grad_out_in.contiguous(), x = x_in.contiguous(), weight = weight_in.contiguous();
  at::Tensor grad_x = at::empty_like(x), grad_weight = at::empty_like(weight);
  std::vector<float> reversed(s.heads * s.width);
  const float* taps = weight.data_ptr<float>();
  for (int64_t h = 0; h < s.heads; ++h)
    std::reverse_copy(taps + h * s.width, taps + (h + 1) * s.width, reversed.begin() + h * s.width);
  std::vector<double> sums(s.head_rows * s.width);  // grad_w of each head row
  const float* grads = grad_out.data_ptr<float>();
  const float* xs = x.data_ptr<float>();
  float* grad_xs = grad_x.data_ptr<float>();
  at::parallel_for(0, s.head_rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t offset = row * s.row_size();
      correlate(s, grads + offset, reversed.data() + (row % s.heads) * s.width, grad_xs + offset);
      tap_gradients(s, grads + offset, xs + offset, sums.data() + row * s.width);
    }
  });
  float* grad_taps = grad_weight.data_ptr<float>();
  for (int64_t h = 0; h < s.heads; ++h)
    for (int64_t t = 0; t < s.width; ++t) {
      double total = 0.0;
      for (int64_t row = h; row < s.head_rows; row += s.heads) total += sums[row * s.width + t];
      grad_taps[h * s.width + t] = static_cast<float>(total);
    }
  return {grad_x, grad_weight};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(yoso, m) {
  m.def("sequence_conv(Tensor x, Tensor weight) -> Tensor");
  m.def("sequence_conv_backward(Tensor grad_out, Tensor x, Tensor weight) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(yoso, CPU, m) {
  m.impl("sequence_conv", &sequence_conv_cpu);
  m.impl("sequence_conv_backward", &sequence_conv_backward_cpu);
}

}  // namespace yoso
