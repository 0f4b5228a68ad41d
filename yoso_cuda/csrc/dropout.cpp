// Dropout with the residual sum after it, on the CPU: the model's dropout between its layers.
//
//   out = residual + y * keep / (1 - p),   keep ~ Bernoulli(1 - p) per element;   grad_y = grad_out * keep / (1 - p)
//
// PyTorch's CPU dropout draws its mask with bernoulli_ from one generator: about 7 ns an element, 29 ms for one
// (32, 2048, 64) activation of the paper's ListOps model on the 2-core VM, where the product takes 1 ms; the model's
// seven dropouts were 40% of its step. Here element i of a call is kept when a hash of (seed, i) is at least
// round(p 2^32) (random.h): eight elements at a time on any number of threads, and the backward makes the same mask
// again from the seed instead of keeping it. The mask has dropout's distribution, not bernoulli_'s random stream.
// yoso_cuda/reference.py (element_keep) computes the same mask; it is the tests' oracle.

// The headers of the operators used, not ATen/ATen.h (see softmax_dropout.cpp).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "random.h"
#include "simd.h"

#include <algorithm>
#include <cstdint>

namespace yoso {
namespace {

constexpr uint32_t kHighStride = 0x9e3779b9u, kElementStride = 0xc2b2ae3du;
constexpr int64_t kGrain = 32768;  // elements a thread takes at least (ATen's grain for element-wise operators)

struct Mask {
  uint64_t seed;
  uint32_t threshold;  // drop_threshold(p)
  float scale;  // 1 / (1 - p)

  // Element i is kept where mix(key(i >> 32) ^ low(i) * kElementStride) >= threshold.
  uint32_t key(uint64_t high) const {
    return mix(mix(static_cast<uint32_t>(seed) + static_cast<uint32_t>(high) * kHighStride) ^ static_cast<uint32_t>(seed >> 32));
  }
};

// out[i] = residual[i] + y[i] * (keep(i) ? scale : 0) over [begin, end) (no residual: 0). Dropped elements are
// multiplied by zero, as dropout's are, so a NaN stays a NaN.
YOSO_MULTIVERSIONED void drop_span(const Mask& m, int64_t begin, int64_t end, const float* y, const float* residual, float* out) {
  Uints lanes;
  for (int l = 0; l < kLanes; ++l) lanes[l] = static_cast<uint32_t>(l);
  const Floats scale = Floats{} + m.scale;
  for (int64_t i = begin; i < end;) {
    const uint64_t high = static_cast<uint64_t>(i) >> 32;
    const int64_t stop = std::min<int64_t>(end, static_cast<int64_t>((high + 1) << 32));  // one key a 2^32 elements
    const uint32_t key = m.key(high);
    for (; i + kLanes <= stop; i += kLanes) {
      const Uints hash = mix(key ^ ((lanes + static_cast<uint32_t>(i)) * kElementStride));
      const Floats factor = reinterpret_cast<Floats>(reinterpret_cast<Ints>(scale) & reinterpret_cast<Ints>(hash >= m.threshold));
      const Floats value = load(y + i) * factor;
      store(out + i, residual ? load(residual + i) + value : value);
    }
    for (; i < stop; ++i) {
      const float factor = mix(key ^ (static_cast<uint32_t>(i) * kElementStride)) >= m.threshold ? m.scale : 0.f;
      out[i] = residual ? residual[i] + y[i] * factor : y[i] * factor;
    }
  }
}

Mask check_arguments(const at::Tensor& y, double p, const at::Tensor& seed) {
  TORCH_CHECK_VALUE(y.scalar_type() == at::kFloat, "dropout_add computes in float32, got ", y.scalar_type());
  TORCH_CHECK_VALUE(p >= 0.0 && p < 1.0, "dropout must be in [0, 1), got ", p);
  TORCH_CHECK_VALUE(seed.numel() == 1 && seed.scalar_type() == at::kLong, "seed must be one int64, got ", seed.scalar_type(),
                    " ", seed.sizes());
  return Mask{static_cast<uint64_t>(seed.item<int64_t>()), drop_threshold(p), static_cast<float>(1.0 / (1.0 - p))};
}

at::Tensor drop(const Mask& m, const at::Tensor& y_in, const at::Tensor* residual_in) {
  const at::Tensor y = y_in.contiguous();
  const at::Tensor residual = residual_in ? residual_in->contiguous() : at::Tensor();
  at::Tensor out = at::empty(y.sizes(), y.options());
  const float* ys = y.data_ptr<float>();
  const float* residuals = residual_in ? residual.data_ptr<float>() : nullptr;
  float* outs = out.data_ptr<float>();
  at::parallel_for(0, y.numel(), kGrain,
                   [&](int64_t begin, int64_t end) { drop_span(m, begin, end, ys, residuals, outs); });
  return out;
}

at::Tensor dropout_add_cpu(const at::Tensor& y, const c10::optional<at::Tensor>& residual, double p, const at::Tensor& seed) {
  const Mask m = check_arguments(y, p, seed);
  if (residual.has_value())
    TORCH_CHECK_VALUE(residual->sizes() == y.sizes() && residual->scalar_type() == at::kFloat,
                      "dropout_add takes a float32 residual of y's shape ", y.sizes(), ", got ", residual->scalar_type(), " ",
                      residual->sizes());
  return drop(m, y, residual.has_value() ? &*residual : nullptr);
}

at::Tensor dropout_backward_cpu(const at::Tensor& grad_out, double p, const at::Tensor& seed) {
  return drop(check_arguments(grad_out, p, seed), grad_out, nullptr);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(yoso, m) {
  m.def("dropout_add(Tensor y, Tensor? residual, float p, Tensor seed) -> Tensor");
  m.def("dropout_backward(Tensor grad_out, float p, Tensor seed) -> Tensor");
}

TORCH_LIBRARY_IMPL(yoso, CPU, m) {
  m.impl("dropout_add", &dropout_add_cpu);
  m.impl("dropout_backward", &dropout_backward_cpu);
}

}  // namespace yoso
