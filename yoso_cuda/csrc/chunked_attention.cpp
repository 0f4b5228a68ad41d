// Reformer's attention within chunks of LSH-sorted tokens, fused, on the CPU: each chunk of queries attends to its own
// keys and to the previous chunk's (circularly over all chunks of a head row, as trax and HF do), as
// attention_zoo/reformer.py computes it densely:
//
//   score_ij = q_i . k_j, or -1e5 where key j is query i's own token (the same position), padded keys left out;
//   out_i = softmax_j(score_i) V,  lse_i = log sum_j exp(score_ij)
//   backward: dS = P * (G V^T - rowsum(P * G V^T) + dlse), zero at a token's own position (a constant score there);
//             dQ = dS K, dK += dS^T Q, dV += P^T G
//
// Only work whose result is not exactly zero is done. A padded key weighs exactly 0 beside a real query's own token
// (the dense path scores it -1e9, whose exponential underflows) and is left out; a padded query's rows of the output
// and of the log-sum-exp are zero, as the attention's callers zero padded rows anyway, so they reach no loss.
// Reformer's padding sorts after every real token, so the chunks after a round's real ones are skipped whole: ListOps'
// sequences are about half padding. Each chunk packs its real queries and the real keys in reach (at most 2 x chunk)
// and runs the small GEMMs of gemm.h on them. Every head row is computed by one thread in a fixed order: results are
// bitwise the same on any number of threads.

// The headers of the operators used, not ATen/ATen.h (every operator), which compiles slower.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "gemm.h"
#include "simd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace yoso {
namespace {

constexpr float kSelfScore = -1e5f;  // attention_zoo/reformer.py's SELF_SCORE

struct Problem {
  int64_t head_rows, chunks, chunk, dim, value_dim;
  const float *q, *k, *v;
  const int64_t* position;  // (head_rows, chunks, chunk): each sorted token's position in its sequence
  const bool* real;  // (head_rows, chunks, chunk)

  // The keys a chunk reaches, rounded up to whole vectors.
  int64_t key_capacity() const { return (2 * chunk + kLanes - 1) / kLanes * kLanes; }
  int64_t token(int64_t head_row, int64_t chunk_index, int64_t i) const {
    return (head_row * chunks + chunk_index) * chunk + i;
  }
};

// One chunk's operands, packed: its real queries, and the real keys in reach (the previous chunk's, then its own)
// followed by zero keys up to `width`, a whole number of vectors, whose scores are set to -inf.
struct Scratch {
  int64_t rows = 0, count = 0, width = 0;  // real queries, real keys, keys with the zero ones
  std::vector<int64_t> query_tokens, key_tokens, query_position, key_position;
  std::vector<float> queries, keys, keys_t, values, values_t, grad_rows, probs, grads, row_results, key_results;

  explicit Scratch(const Problem& p)
      : query_tokens(p.chunk),
        key_tokens(2 * p.chunk),
        query_position(p.chunk),
        key_position(2 * p.chunk),
        queries(p.chunk * p.dim),
        keys(p.key_capacity() * p.dim),
        keys_t(p.dim * p.key_capacity()),
        values(p.key_capacity() * p.value_dim),
        values_t(p.value_dim * p.key_capacity()),
        grad_rows(p.chunk * p.value_dim),
        probs(p.chunk * p.key_capacity()),
        grads(p.chunk * p.key_capacity()),
        row_results(p.chunk * std::max(p.dim, p.value_dim)),
        key_results(p.key_capacity() * std::max(p.dim, p.value_dim)) {}

  // False when the chunk has no real query (nothing to compute).
  bool pack(const Problem& p, int64_t head_row, int64_t chunk_index, bool backward) {
    rows = 0;
    for (int64_t i = 0; i < p.chunk; ++i) {
      const int64_t token = p.token(head_row, chunk_index, i);
      if (p.real[token]) query_tokens[rows++] = token;
    }
    if (rows == 0) return false;
    count = 0;
    for (const int64_t source : {(chunk_index + p.chunks - 1) % p.chunks, chunk_index})
      for (int64_t i = 0; i < p.chunk; ++i) {
        const int64_t token = p.token(head_row, source, i);
        if (p.real[token]) key_tokens[count++] = token;
      }
    width = (count + kLanes - 1) / kLanes * kLanes;
    const int64_t d = p.dim, c = p.value_dim;
    for (int64_t r = 0; r < rows; ++r) {
      query_position[r] = p.position[query_tokens[r]];
      std::copy_n(p.q + query_tokens[r] * d, d, queries.data() + r * d);
    }
    for (int64_t j = 0; j < width; ++j) {
      const bool key = j < count;
      if (key) key_position[j] = p.position[key_tokens[j]];
      for (int64_t e = 0; e < d; ++e) keys_t[e * width + j] = key ? p.k[key_tokens[j] * d + e] : 0.f;
      for (int64_t e = 0; e < c; ++e) values[j * c + e] = key ? p.v[key_tokens[j] * c + e] : 0.f;
      if (!backward) continue;
      for (int64_t e = 0; e < d; ++e) keys[j * d + e] = key ? p.k[key_tokens[j] * d + e] : 0.f;
      for (int64_t e = 0; e < c; ++e) values_t[e * width + j] = key ? p.v[key_tokens[j] * c + e] : 0.f;
    }
    return true;
  }

  bool own_token(int64_t r, int64_t j) const { return key_position[j] == query_position[r]; }
};

// The packed chunk's probabilities (rows x width, zero for the zero keys), and each row's log-sum-exp into `lse` (or
// not, with null): the scores, the own-token score, then each row's max, exponentials and sum, as a softmax.
YOSO_INLINE void chunk_probabilities(const Problem& p, Scratch& s, float* lse) {
  const int64_t width = s.width;
  float* probs = s.probs.data();
  gemm(s.rows, width, p.dim, s.queries.data(), p.dim, 1, s.keys_t.data(), width, probs, width, 1.f, false);
  for (int64_t r = 0; r < s.rows; ++r) {
    float* row = probs + r * width;
    for (int64_t j = 0; j < s.count; ++j)
      if (s.own_token(r, j)) row[j] = kSelfScore;
    std::fill(row + s.count, row + width, -std::numeric_limits<float>::infinity());
    const float top = *std::max_element(row, row + s.count);
    Floats sums{};
    for (int64_t j = 0; j < width; j += kLanes) {
      const Floats e = exp_nonpositive(load(row + j) - top);
      store(row + j, e);
      sums += e;
    }
    const float total = horizontal_sum(sums);
    scale(row, 1.f / total, width);
    if (lse) lse[r] = top + std::log(total);
  }
}

struct Outputs {
  float *out, *lse;  // zero-filled
};

YOSO_MULTIVERSIONED void forward_head_row(const Problem& p, const Outputs& o, int64_t head_row, Scratch& s) {
  const int64_t c = p.value_dim;
  std::vector<float> lse(p.chunk);
  for (int64_t t = 0; t < p.chunks; ++t) {
    if (!s.pack(p, head_row, t, false)) continue;
    chunk_probabilities(p, s, lse.data());
    gemm(s.rows, c, s.width, s.probs.data(), s.width, 1, s.values.data(), c, s.row_results.data(), c, 1.f, false);
    for (int64_t r = 0; r < s.rows; ++r) {
      std::copy_n(s.row_results.data() + r * c, c, o.out + s.query_tokens[r] * c);
      o.lse[s.query_tokens[r]] = lse[r];
    }
  }
}

struct Gradients {
  const float *grad_out, *grad_lse;
  float *grad_q, *grad_k, *grad_v;  // zero-filled
};

YOSO_MULTIVERSIONED void backward_head_row(const Problem& p, const Gradients& g, int64_t head_row, Scratch& s) {
  const int64_t d = p.dim, c = p.value_dim;
  for (int64_t t = 0; t < p.chunks; ++t) {
    if (!s.pack(p, head_row, t, true)) continue;
    chunk_probabilities(p, s, nullptr);
    const int64_t width = s.width;
    float *probs = s.probs.data(), *grads = s.grads.data(), *grad_rows = s.grad_rows.data();
    for (int64_t r = 0; r < s.rows; ++r) std::copy_n(g.grad_out + s.query_tokens[r] * c, c, grad_rows + r * c);
    gemm(s.rows, width, c, grad_rows, c, 1, s.values_t.data(), width, grads, width, 1.f, false);  // dP = G V^T
    for (int64_t r = 0; r < s.rows; ++r) {  // dS = P * (dP - rowsum(P * dP) + dlse)
      float* grad_row = grads + r * width;
      const float* row = probs + r * width;
      const Floats shift = Floats{} + (g.grad_lse[s.query_tokens[r]] - dot(row, grad_row, width));
      for (int64_t j = 0; j < width; j += kLanes) store(grad_row + j, load(row + j) * (load(grad_row + j) + shift));
      for (int64_t j = 0; j < s.count; ++j)
        if (s.own_token(r, j)) grad_row[j] = 0.f;
    }
    float *row_results = s.row_results.data(), *key_results = s.key_results.data();
    gemm(s.rows, d, width, grads, width, 1, s.keys.data(), d, row_results, d, 1.f, false);  // dQ = dS K
    for (int64_t r = 0; r < s.rows; ++r) std::copy_n(row_results + r * d, d, g.grad_q + s.query_tokens[r] * d);
    gemm(width, d, s.rows, grads, 1, width, s.queries.data(), d, key_results, d, 1.f, false);  // dS^T Q
    for (int64_t j = 0; j < s.count; ++j) add(g.grad_k + s.key_tokens[j] * d, key_results + j * d, d);
    gemm(width, c, s.rows, probs, 1, width, grad_rows, c, key_results, c, 1.f, false);  // P^T G
    for (int64_t j = 0; j < s.count; ++j) add(g.grad_v + s.key_tokens[j] * c, key_results + j * c, c);
  }
}

void check_arguments(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& position,
                     const at::Tensor& real) {
  TORCH_CHECK_VALUE(q.dim() == 4 && k.sizes() == q.sizes() && v.dim() == 4 && v.sizes().slice(0, 3) == q.sizes().slice(0, 3),
                    "chunked_attention takes queries and keys of one shape (batch, chunks, chunk, d) and values "
                    "(batch, chunks, chunk, c), got ",
                    q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  TORCH_CHECK_VALUE(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat,
                    "chunked_attention computes in float32; got ", q.scalar_type(), ", ", k.scalar_type(), ", ",
                    v.scalar_type());
  TORCH_CHECK_VALUE(q.size(1) >= 1 && q.size(2) >= 1 && q.size(3) >= 1 && v.size(3) >= 1,
                    "chunked_attention needs chunks, chunk, d, c >= 1, got ", q.sizes(), " and ", v.sizes());
  TORCH_CHECK_VALUE(position.scalar_type() == at::kLong && position.sizes() == q.sizes().slice(0, 3),
                    "position must be int64 (batch, chunks, chunk) = ", q.sizes().slice(0, 3), ", got ",
                    position.scalar_type(), " ", position.sizes());
  TORCH_CHECK_VALUE(real.scalar_type() == at::kBool && real.sizes() == q.sizes().slice(0, 3),
                    "real must be bool (batch, chunks, chunk) = ", q.sizes().slice(0, 3), ", got ", real.scalar_type(),
                    " ", real.sizes());
}

Problem make_problem(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& position,
                     const at::Tensor& real) {
  return Problem{q.size(0), q.size(1), q.size(2), q.size(3), v.size(3), q.data_ptr<float>(), k.data_ptr<float>(),
                 v.data_ptr<float>(), position.data_ptr<int64_t>(), real.data_ptr<bool>()};
}

std::tuple<at::Tensor, at::Tensor> chunked_attention_cpu(const at::Tensor& q_in, const at::Tensor& k_in,
                                                         const at::Tensor& v_in, const at::Tensor& position_in,
                                                         const at::Tensor& real_in) {
  check_arguments(q_in, k_in, v_in, position_in, real_in);
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous(),
                   position = position_in.contiguous(), real = real_in.contiguous();
  const Problem p = make_problem(q, k, v, position, real);
  at::Tensor out = at::zeros(v.sizes(), v.options()), lse = at::zeros(real.sizes(), v.options());
  const Outputs o{out.data_ptr<float>(), lse.data_ptr<float>()};
  for_each_head_row<Scratch>(p, [&](int64_t head_row, Scratch& s) { forward_head_row(p, o, head_row, s); });
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> chunked_attention_backward_cpu(
    const at::Tensor& grad_out_in, const at::Tensor& grad_lse_in, const at::Tensor& q_in, const at::Tensor& k_in,
    const at::Tensor& v_in, const at::Tensor& position_in, const at::Tensor& real_in) {
  check_arguments(q_in, k_in, v_in, position_in, real_in);
  TORCH_CHECK_VALUE(grad_out_in.sizes() == v_in.sizes() && grad_lse_in.sizes() == real_in.sizes(),
                    "grad_out and grad_lse must have the shapes of the values ", v_in.sizes(), " and of real ",
                    real_in.sizes(), ", got ", grad_out_in.sizes(), " and ", grad_lse_in.sizes());
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous(),
                   position = position_in.contiguous(), real = real_in.contiguous();
  const at::Tensor grad_out = grad_out_in.to(at::kFloat).contiguous(), grad_lse = grad_lse_in.to(at::kFloat).contiguous();
  const Problem p = make_problem(q, k, v, position, real);
  at::Tensor grad_q = at::zeros(q.sizes(), q.options()), grad_k = at::zeros(k.sizes(), k.options()),
             grad_v = at::zeros(v.sizes(), v.options());
  const Gradients g{grad_out.data_ptr<float>(), grad_lse.data_ptr<float>(), grad_q.data_ptr<float>(),
                    grad_k.data_ptr<float>(), grad_v.data_ptr<float>()};
  for_each_head_row<Scratch>(p, [&](int64_t head_row, Scratch& s) { backward_head_row(p, g, head_row, s); });
  return {grad_q, grad_k, grad_v};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(yoso, m) {
  m.def("chunked_attention(Tensor queries, Tensor keys, Tensor values, Tensor position, Tensor real) -> (Tensor, Tensor)");
  m.def(
      "chunked_attention_backward(Tensor grad_out, Tensor grad_lse, Tensor queries, Tensor keys, Tensor values, "
      "Tensor position, Tensor real) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(yoso, CPU, m) {
  m.impl("chunked_attention", &chunked_attention_cpu);
  m.impl("chunked_attention_backward", &chunked_attention_backward_cpu);
}

}  // namespace yoso
