// YOSO-E's attention, fused, on the CPU: the expectation of YOSO's Bernoulli sampling, with the
// lower-bound surrogate gradient of the official yoso_v1 YOSO-E.
//
//   out = W V,  W_ij = real_i real_j (1 - arccos(q_i . k_j) / pi)^tau   (unit q and k)
//   backward: S = (G V^T) * W * tau / 2,  dQ = S K,  dK = S^T Q,  dV = W^T G
//
// Computed densely with PyTorch ops, W is a (batch x heads, n, n) tensor (1 GiB a layer at ListOps'
// shape) that the clamp, arccos, power and mask each read and write again, forward and backward.
// Here, as in softmax_dropout.cpp, each thread takes one head row at a time and walks it in blocks of
// queries, holding only a block's weights (block x n floats):
//
// * forward: the block's cosines (a GEMM against K^T), their weights, then the block's output (a GEMM against V);
// * backward: the weights again, dW = G V^T, S = dW * W * tau / 2, then dV += W^T G, dQ = S K and
//   dK += S^T Q.
//
// A padded query's row of W is zero and so is a padded key's column: the blocks stop at the last
// real query and the keys at the last real key, so a right-padded sequence costs its real length
// squared. Every head row is computed by one thread in a fixed order: results are bitwise the same
// on any number of threads. attention_zoo/yoso.py's dense path computes the same function; the tests
// compare both with a float64 oracle.

// The headers of the operators used, not ATen/ATen.h (every operator), which compiles slower.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "gemm.h"
#include "simd.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace yoso {
namespace {

constexpr int64_t kMaxHashBits = 30;  // attention_zoo's limit (int32 hash codes); the power is exact for any

// sqrt(z) for z in [0, 1/4]: the reciprocal square root from the exponent trick and three Newton steps
// (relative error under 2e-7), since GNU vectors have no square root that vectorises everywhere.
YOSO_INLINE Floats sqrt_small(Floats z) {
  Floats y = reinterpret_cast<Floats>(0x5f3759df - (reinterpret_cast<Ints>(z) >> 1));
  const Floats half = 0.5f * z;
  for (int step = 0; step < 3; ++step) y = y * (1.5f - half * y * y);
  return z * y;  // 0 for z = 0, where y is large but finite
}

// arccos(x) for x in [-1, 1], by the Cephes asinf polynomial (relative error about 2.5e-7):
// arccos(a) = 2 asin(sqrt((1 - a) / 2)) for a = |x| > 1/2, pi/2 - asin(a) otherwise, and
// arccos(x) = pi - arccos(|x|) for x < 0.
YOSO_INLINE Floats arccos(Floats x) {
  constexpr float kPi = 3.14159265358979f;
  const Ints negative = x < 0.0f;
  const Floats a = negative ? -x : x;
  const Ints wide = a > 0.5f;
  const Floats z = wide ? 0.5f * (1.0f - a) : a * a;
  const Floats s = wide ? sqrt_small(z) : a;
  Floats poly = 4.2163199048e-2f * z + 2.4181311049e-2f;
  poly = poly * z + 4.5470025998e-2f;
  poly = poly * z + 7.4953002686e-2f;
  poly = poly * z + 1.6666752422e-1f;
  const Floats asin_s = s + s * z * poly;
  const Floats of_a = wide ? 2.0f * asin_s : 0.5f * kPi - asin_s;
  return negative ? kPi - of_a : of_a;
}

// YOSO-E's weight of cosine x: (1 - arccos(x) / pi)^tau, x clamped to [-1, 1] (rounding can put the
// cosine of unit vectors just outside); the power by squaring.
YOSO_INLINE Floats collision_probability(Floats x, int64_t tau) {
  x = x > 1.0f ? Floats{} + 1.0f : x;
  x = x < -1.0f ? Floats{} - 1.0f : x;
  Floats base = 1.0f - arccos(x) * 0.318309886183791f;
  Floats power = Floats{} + 1.0f;
  for (int64_t bits = tau; bits > 0; bits >>= 1) {
    if (bits & 1) power *= base;
    base *= base;
  }
  return power;
}

struct Problem {
  int64_t head_rows, n, dim, value_dim, hash_bits;
  const float *q, *k, *v;
  const bool* real;  // (head_rows, n)

  int64_t block() const { return std::max<int64_t>(4, std::min<int64_t>(64, (int64_t{1} << 17) / n / 4 * 4)); }
};

// One head row's buffers: K^T and V^T, the keys' mask as 1 or 0, a block's weights and their gradients; the queries
// [0, queries_end) and keys [0, keys_end) worth computing.
struct Scratch {
  TransposedKeys transposed;
  std::vector<float> key_weight, weights, grads;
  int64_t queries_end = 0, keys_end = 0;
  Scratch(const Problem& p)
      : transposed(p.n, p.dim, p.value_dim), key_weight(p.n), weights(p.block() * p.n), grads(p.block() * p.n) {}

  // The queries after the last real position are padded (zero rows), and the keys there weigh 0.
  void start(const Problem& p, int64_t head_row, bool with_values) {
    const bool* real = p.real + head_row * p.n;
    queries_end = real_end(real, p.n);
    keys_end = keys_to_score(queries_end, p.n);
    transposed.load(p.k + head_row * p.n * p.dim, with_values ? p.v + head_row * p.n * p.value_dim : nullptr, p.n, p.dim,
                    p.value_dim);
    for (int64_t j = 0; j < p.n; ++j) key_weight[j] = real[j] ? 1.f : 0.f;
  }
};

// weights (rows x n, of which [0, keys_end)) of queries [first, first + rows): W, zero rows for padded queries.
YOSO_INLINE void block_weights(const Problem& p, const Scratch& s, int64_t head_row, int64_t first, int64_t rows,
                               float* weights) {
  const int64_t n = p.n, end = s.keys_end;
  gemm(rows, end, p.dim, p.q + (head_row * n + first) * p.dim, p.dim, 1, s.transposed.keys.data(), s.transposed.stride, weights, n, 1.f,
       false);
  for (int64_t i = 0; i < rows; ++i) {
    float* row = weights + i * n;
    if (!p.real[head_row * n + first + i]) {
      std::fill(row, row + end, 0.f);
      continue;
    }
    int64_t j = 0;
    for (; j + kLanes <= end; j += kLanes)
      store(row + j, collision_probability(load(row + j), p.hash_bits) * load(s.key_weight.data() + j));
    for (; j < end; ++j) row[j] = collision_probability(Floats{} + row[j], p.hash_bits)[0] * s.key_weight[j];
  }
}

YOSO_MULTIVERSIONED void forward_head_row(const Problem& p, int64_t head_row, Scratch& s, float* out) {
  s.start(p, head_row, false);
  const int64_t n = p.n, c = p.value_dim, block = p.block();
  float* weights = s.weights.data();
  for (int64_t first = 0; first < s.queries_end; first += block) {
    const int64_t rows = std::min(block, s.queries_end - first);
    block_weights(p, s, head_row, first, rows, weights);
    gemm(rows, c, s.keys_end, weights, n, 1, p.v + head_row * n * c, c, out + (head_row * n + first) * c, c, 1.f, false);
  }
  std::fill(out + (head_row * n + s.queries_end) * c, out + (head_row + 1) * n * c, 0.f);
}

struct Gradients {
  const float* grad_out;
  float *grad_q, *grad_k, *grad_v;  // zero-filled
};

YOSO_MULTIVERSIONED void backward_head_row(const Problem& p, const Gradients& g, int64_t head_row, Scratch& s) {
  s.start(p, head_row, true);
  const int64_t n = p.n, d = p.dim, c = p.value_dim, block = p.block(), end = s.keys_end;
  const float surrogate = 0.5f * static_cast<float>(p.hash_bits);  // YOSO's lower bound of the derivative, over W
  float* weights = s.weights.data();
  float* grads = s.grads.data();  // dW, then S
  for (int64_t first = 0; first < s.queries_end; first += block) {
    const int64_t rows = std::min(block, s.queries_end - first), offset = head_row * n + first;
    const float* queries = p.q + offset * d;
    const float* grad_out = g.grad_out + offset * c;
    block_weights(p, s, head_row, first, rows, weights);
    gemm(rows, end, c, grad_out, c, 1, s.transposed.values.data(), s.transposed.stride, grads, n, 1.f, false);  // dW = G V^T
    for (int64_t i = 0; i < rows; ++i) {
      float* grad_row = grads + i * n;
      const float* row = weights + i * n;
      int64_t j = 0;
      for (; j + kLanes <= end; j += kLanes) store(grad_row + j, load(grad_row + j) * load(row + j) * surrogate);
      for (; j < end; ++j) grad_row[j] = grad_row[j] * row[j] * surrogate;
    }
    gemm(end, c, rows, weights, 1, n, grad_out, c, g.grad_v + head_row * n * c, c, 1.f, true);  // dV += W^T G
    gemm(rows, d, end, grads, n, 1, p.k + head_row * n * d, d, g.grad_q + offset * d, d, 1.f, false);  // dQ = S K
    gemm(end, d, rows, grads, 1, n, queries, d, g.grad_k + head_row * n * d, d, 1.f, true);  // dK += S^T Q
  }
}

void check_arguments(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& real, int64_t hash_bits) {
  TORCH_CHECK_VALUE(q.dim() == 3 && k.sizes() == q.sizes() && v.dim() == 3 && v.sizes().slice(0, 2) == q.sizes().slice(0, 2),
                    "expectation_attention takes unit queries and keys of one shape (batch, n, d) and values (batch, n, c), "
                    "got ",
                    q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  TORCH_CHECK_VALUE(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat,
                    "expectation_attention computes in float32; got ", q.scalar_type(), ", ", k.scalar_type(), ", ",
                    v.scalar_type());
  TORCH_CHECK_VALUE(q.size(1) >= 1 && q.size(2) >= 1 && v.size(2) >= 1, "expectation_attention needs n, d, c >= 1, got ",
                    q.sizes(), " and ", v.sizes());
  TORCH_CHECK_VALUE(real.scalar_type() == at::kBool && real.dim() == 2 && real.size(0) == q.size(0) && real.size(1) == q.size(1),
                    "real must be bool (batch, n) = (", q.size(0), ", ", q.size(1), "), got ", real.scalar_type(), " ",
                    real.sizes());
  TORCH_CHECK_VALUE(hash_bits >= 1 && hash_bits <= kMaxHashBits, "hash_bits must be in [1, ", kMaxHashBits, "], got ",
                    hash_bits);
}

Problem make_problem(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& real, int64_t hash_bits) {
  return Problem{q.size(0), q.size(1), q.size(2), v.size(2), hash_bits,
                 q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), real.data_ptr<bool>()};
}

at::Tensor expectation_attention_cpu(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                     const at::Tensor& real_in, int64_t hash_bits) {
  check_arguments(q_in, k_in, v_in, real_in, hash_bits);
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous(), real = real_in.contiguous();
  const Problem p = make_problem(q, k, v, real, hash_bits);
  at::Tensor out = at::empty(v.sizes(), v.options());
  float* out_data = out.data_ptr<float>();
  for_each_head_row<Scratch>(p, [&](int64_t head_row, Scratch& s) { forward_head_row(p, head_row, s, out_data); });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> expectation_attention_backward_cpu(const at::Tensor& grad_out_in,
                                                                                  const at::Tensor& q_in,
                                                                                  const at::Tensor& k_in,
                                                                                  const at::Tensor& v_in,
                                                                                  const at::Tensor& real_in, int64_t hash_bits) {
  check_arguments(q_in, k_in, v_in, real_in, hash_bits);
  TORCH_CHECK_VALUE(grad_out_in.sizes() == v_in.sizes(), "grad_out must have the values' shape ", v_in.sizes(), ", got ",
                    grad_out_in.sizes());
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous(), real = real_in.contiguous();
  const at::Tensor grad_out = grad_out_in.to(at::kFloat).contiguous();
  const Problem p = make_problem(q, k, v, real, hash_bits);
  at::Tensor grad_q = at::zeros(q.sizes(), q.options()), grad_k = at::zeros(k.sizes(), k.options()),
             grad_v = at::zeros(v.sizes(), v.options());
  const Gradients g{grad_out.data_ptr<float>(), grad_q.data_ptr<float>(), grad_k.data_ptr<float>(), grad_v.data_ptr<float>()};
  for_each_head_row<Scratch>(p, [&](int64_t head_row, Scratch& s) { backward_head_row(p, g, head_row, s); });
  return {grad_q, grad_k, grad_v};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(yoso, m) {
  m.def("expectation_attention(Tensor queries, Tensor keys, Tensor values, Tensor real, int hash_bits) -> Tensor");
  m.def(
      "expectation_attention_backward(Tensor grad_out, Tensor queries, Tensor keys, Tensor values, Tensor real, "
      "int hash_bits) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(yoso, CPU, m) {
  m.impl("expectation_attention", &expectation_attention_cpu);
  m.impl("expectation_attention_backward", &expectation_attention_backward_cpu);
}

}  // namespace yoso
