// Exact softmax attention with dropout on its probabilities, fused, on the CPU: the baseline's
// training path.
//
//   out = (softmax(Q K^T / sqrt(d) + bias) * keep / (1 - p)) V,  keep ~ Bernoulli(1 - p)
//
// The bias is -inf where query i may not see key j: a padded key (key_mask) and, with a radius r >= 0,
// a key outside the band |i - j| <= r unless i or j is one of the first g ("global") positions:
// Longformer's sliding window with global tokens. A query block then scores only the keys its rows
// can see (the global ones and the band's), so the band costs O(n (block + 2 r)), not O(n^2).
//
// PyTorch's CPU flash-attention kernel has no dropout, so scaled_dot_product_attention with
// dropout_p > 0 falls back to its math path, which holds the n x n scores, probabilities and
// dropout mask of every head in memory. Here each thread takes one head row (batch x head) at a
// time and walks it in blocks of queries, holding only a block's scores (block x n floats):
//
// * forward: scores of the block (a small GEMM against K^T over its keys), each row's max, exponentials and sum,
//   the dropout mask, then the block's output (a GEMM against V); it keeps the row's log-sum-exp;
// * backward: the block's probabilities again from the scores and the log-sum-exp, the same mask,
//   then dV += Pd^T dO, dPd = dO V^T, dS = P * (keep dPd / (1 - p) - rowsum(dO * O)),
//   dQ = dS K / sqrt(d) and dK += dS^T Q / sqrt(d) (the flash-attention backward).
//
// The mask is a counter-based hash of (seed, head row, query, key), so the backward regenerates it
// instead of storing n^2 bits, and a key's fate does not depend on the block sizes or the thread
// count. yoso_cuda/reference.py (softmax_dropout_attention, dropout_keep) computes the same mask and
// the same function densely; it is the tests' oracle. Every head row is computed by one thread in a
// fixed order: results are bitwise the same on any number of threads.
//
// The queries after a head row's last real key are padding too (key_mask marks the positions of a
// self-attention): their rows of the output are zero, as the attention's callers zero them anyway.
// Work that is exactly zero is skipped: those queries, the keys after the last real one (a right-padded
// sequence's padding), and in the backward the queries after the last one whose output gradient is
// nonzero (a model's padded positions, which reach no loss).

// The headers of the operators used, not ATen/ATen.h (every operator): the library builds in 21 s against 28 on 2 cores.
// The macro makes an include of ATen/ATen.h here an error.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "gemm.h"
#include "random.h"
#include "simd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace yoso {
namespace {

constexpr uint32_t kRowStride = 0x9e3779b9u, kQueryStride = 0x85ebca77u, kKeyStride = 0xc2b2ae3du;

// The hash of every (query, key) pair of query `query` in head row `head_row` is mix(row ^ key * kKeyStride).
YOSO_INLINE uint32_t row_key(uint64_t seed, uint64_t head_row, uint64_t query) {
  const uint32_t seeded = mix(static_cast<uint32_t>(head_row) * kRowStride + static_cast<uint32_t>(seed));
  return mix(mix(seeded ^ static_cast<uint32_t>(seed >> 32)) + static_cast<uint32_t>(query) * kQueryStride);
}

YOSO_INLINE bool all_zero(const float* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i)
    if (x[i] != 0.f) return false;
  return true;
}

struct Problem {
  int64_t head_rows, heads, n, dim, value_dim;
  const float *q, *k, *v;
  const bool* key_mask;  // (batch, n) or null
  int64_t radius;  // a query sees the keys within it (|i - j| <= radius); < 0: every key
  int64_t num_global;  // the first positions, which see and are seen by every query whatever the radius
  float scale;  // 1 / sqrt(dim)
  uint64_t seed;
  uint32_t threshold;  // drop_threshold(p); 0: no dropout
  float keep_scale;  // 1 / (1 - p)

  int64_t block() const { return std::max<int64_t>(4, std::min<int64_t>(64, (int64_t{1} << 17) / n / 4 * 4)); }
};

// One head row's buffers: K^T and V^T, the key bias (0 or -inf), and a block's scores and probability gradients; and
// the keys worth scoring, [0, keys_end).
struct Scratch {
  TransposedKeys transposed;
  std::vector<float> bias, scores, grads;
  int64_t queries_end = 0, keys_end = 0;
  Scratch(const Problem& p)
      : transposed(p.n, p.dim, p.value_dim), bias(p.n), scores(p.block() * p.n), grads(p.block() * p.n) {}

  // After a row's last real key, the queries are padded (zero rows) and the keys have probability 0 for every
  // query and gradient 0: neither is scored at all.
  void start(const Problem& p, int64_t head_row, bool with_values) {
    transposed.load(p.k + head_row * p.n * p.dim, with_values ? p.v + head_row * p.n * p.value_dim : nullptr, p.n, p.dim,
                    p.value_dim);
    const bool* mask = p.key_mask ? p.key_mask + head_row / p.heads * p.n : nullptr;
    for (int64_t j = 0; j < p.n; ++j) bias[j] = !mask || mask[j] ? 0.f : -std::numeric_limits<float>::infinity();
    queries_end = real_end(mask, p.n);
    keys_end = keys_to_score(queries_end, p.n);
  }
};

// The keys a block of queries [first, first + rows) can see, before keys_end: one or two spans of columns
// [begin, end), the global keys and the band. Only these columns of the block's scores are computed and read.
struct Spans {
  int64_t begin[2], end[2];
  int count;

  Spans(const Problem& p, int64_t keys_end, int64_t first, int64_t rows) {
    if (p.radius < 0 || first < p.num_global) {  // every key, or a global query among the rows
      *this = Spans(0, keys_end);
      return;
    }
    const int64_t low = std::max<int64_t>(0, first - p.radius), high = std::min(keys_end, first + rows + p.radius);
    if (low <= p.num_global) {
      *this = Spans(0, high);
    } else {
      *this = Spans(0, std::min(p.num_global, keys_end));
      if (low < high) {
        begin[count] = low;
        end[count++] = high;
      }
    }
  }

 private:
  Spans(int64_t b, int64_t e) : begin{b, 0}, end{e, 0}, count(b < e ? 1 : 0) {}
};

// row[j] *= keep(query, j) * factor for every key j of [begin, end): the dropout of probabilities.
YOSO_INLINE void drop(const Problem& p, int64_t head_row, int64_t query, float* row, float factor, int64_t begin,
                      int64_t end) {
  if (p.threshold == 0) {
    scale(row + begin, factor, end - begin);
    return;
  }
  const uint32_t key = row_key(p.seed, head_row, query);
  Uints index;
  for (int l = 0; l < kLanes; ++l) index[l] = static_cast<uint32_t>(l);
  int64_t j = begin;
  for (; j + kLanes <= end; j += kLanes) {
    const Uints hash = mix(key ^ ((index + static_cast<uint32_t>(j)) * kKeyStride));
    const Ints kept = reinterpret_cast<Ints>(hash >= p.threshold);
    store(row + j, reinterpret_cast<Floats>(reinterpret_cast<Ints>(load(row + j) * factor) & kept));
  }
  for (; j < end; ++j) row[j] = mix(key ^ (static_cast<uint32_t>(j) * kKeyStride)) >= p.threshold ? row[j] * factor : 0.f;
}

YOSO_INLINE void drop(const Problem& p, int64_t head_row, int64_t query, float* row, float factor, const Spans& spans) {
  for (int span = 0; span < spans.count; ++span) drop(p, head_row, query, row, factor, spans.begin[span], spans.end[span]);
}

// scores (rows x n, of which the spans' columns) of queries [first, first + rows): q K^T + bias, unscaled.
YOSO_INLINE void block_scores(const Problem& p, const Scratch& s, const float* queries, int64_t first, int64_t rows,
                              const Spans& spans, float* scores) {
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  for (int span = 0; span < spans.count; ++span) {
    const int64_t begin = spans.begin[span], width = spans.end[span] - begin;
    gemm(rows, width, p.dim, queries, p.dim, 1, s.transposed.keys.data() + begin, s.transposed.stride, scores + begin, p.n, 1.f, false);
    if (p.key_mask)
      for (int64_t i = 0; i < rows; ++i) add(scores + i * p.n + begin, s.bias.data() + begin, width);
  }
  if (p.radius < 0) return;
  for (int64_t i = 0; i < rows; ++i) {  // outside the band: the non-global keys beyond the radius of a non-global query
    const int64_t query = first + i;
    if (query < p.num_global) continue;
    float* row = scores + i * p.n;
    for (int span = 0; span < spans.count; ++span) {
      const int64_t begin = std::max(spans.begin[span], p.num_global), end = spans.end[span];
      for (int64_t j = begin; j < std::min(end, query - p.radius); ++j) row[j] = kMasked;
      for (int64_t j = std::max(begin, query + p.radius + 1); j < end; ++j) row[j] = kMasked;
    }
  }
}

YOSO_MULTIVERSIONED void forward_head_row(const Problem& p, int64_t head_row, Scratch& s, float* out, float* lse) {
  s.start(p, head_row, false);
  const int64_t n = p.n, block = p.block();
  const float* values = p.v + head_row * n * p.value_dim;
  std::fill(out + (head_row * n + s.queries_end) * p.value_dim, out + (head_row + 1) * n * p.value_dim, 0.f);
  std::fill(lse + head_row * n + s.queries_end, lse + (head_row + 1) * n, -std::numeric_limits<float>::infinity());
  for (int64_t first = 0; first < s.queries_end; first += block) {
    const int64_t rows = std::min(block, s.queries_end - first);
    const Spans spans(p, s.keys_end, first, rows);
    float* scores = s.scores.data();
    block_scores(p, s, p.q + (head_row * n + first) * p.dim, first, rows, spans, scores);
    for (int64_t i = 0; i < rows; ++i) {
      float* row = scores + i * n;
      Floats tops = Floats{} - std::numeric_limits<float>::infinity();
      float top = -std::numeric_limits<float>::infinity();
      for (int span = 0; span < spans.count; ++span) {
        int64_t j = spans.begin[span];
        for (; j + kLanes <= spans.end[span]; j += kLanes) {
          const Floats x = load(row + j);
          tops = x > tops ? x : tops;
        }
        for (; j < spans.end[span]; ++j) top = std::max(top, row[j]);
      }
      for (int l = 0; l < kLanes; ++l) top = std::max(top, tops[l]);
      float* lse_out = lse + head_row * n + first + i;
      if (top == -std::numeric_limits<float>::infinity()) {  // no key to see: a zero row (softmax's caller avoids it)
        for (int span = 0; span < spans.count; ++span) std::fill(row + spans.begin[span], row + spans.end[span], 0.f);
        *lse_out = top;
        continue;
      }
      float total = 0.f;
      for (int span = 0; span < spans.count; ++span) {
        Floats sums{};
        int64_t j = spans.begin[span];
        for (; j + kLanes <= spans.end[span]; j += kLanes) {
          const Floats e = exp_nonpositive((load(row + j) - top) * p.scale);
          store(row + j, e);
          sums += e;
        }
        total += horizontal_sum(sums);
        for (; j < spans.end[span]; ++j) total += row[j] = exp_nonpositive((row[j] - top) * p.scale);
      }
      *lse_out = top * p.scale + std::log(total);
      drop(p, head_row, first + i, row, p.keep_scale / total, spans);
    }
    for (int span = 0; span < spans.count; ++span) {
      const int64_t begin = spans.begin[span];
      gemm(rows, p.value_dim, spans.end[span] - begin, scores + begin, n, 1, values + begin * p.value_dim, p.value_dim,
           out + (head_row * n + first) * p.value_dim, p.value_dim, 1.f, span > 0);
    }
  }
}

struct Gradients {
  const float *grad_out, *out, *lse;
  float *grad_q, *grad_k, *grad_v;
};

YOSO_MULTIVERSIONED void backward_head_row(const Problem& p, const Gradients& g, int64_t head_row, Scratch& s) {
  s.start(p, head_row, true);
  const int64_t n = p.n, d = p.dim, c = p.value_dim, block = p.block();
  const float* keys = p.k + head_row * n * d;
  float* grad_k = g.grad_k + head_row * n * d;
  float* grad_v = g.grad_v + head_row * n * c;
  std::fill(grad_k, grad_k + n * d, 0.f);
  std::fill(grad_v, grad_v + n * c, 0.f);
  // Queries whose output gradient is zero (a model's padded positions) give dS = 0, and so do the zero rows after the
  // last real key: their rows of dQ are zero and they add nothing to dK and dV, so the blocks stop at the last query
  // before those rows with a nonzero gradient.
  const float* grad_out_row = g.grad_out + head_row * n * c;
  int64_t queries_end = s.queries_end;
  while (queries_end > 0 && all_zero(grad_out_row + (queries_end - 1) * c, c)) --queries_end;
  std::fill(g.grad_q + (head_row * n + queries_end) * d, g.grad_q + (head_row + 1) * n * d, 0.f);
  for (int64_t first = 0; first < queries_end; first += block) {
    const int64_t rows = std::min(block, queries_end - first), offset = head_row * n + first;
    const Spans spans(p, s.keys_end, first, rows);
    const float* queries = p.q + offset * d;
    const float* grad_out = g.grad_out + offset * c;
    float* probs = s.scores.data();  // the dropped-out probabilities Pd, then dS
    float* grads = s.grads.data();  // dPd
    block_scores(p, s, queries, first, rows, spans, probs);
    for (int span = 0; span < spans.count; ++span) {  // dPd = dO V^T
      const int64_t begin = spans.begin[span];
      gemm(rows, spans.end[span] - begin, c, grad_out, c, 1, s.transposed.values.data() + begin, s.transposed.stride, grads + begin, n, 1.f,
           false);
    }
    for (int64_t i = 0; i < rows; ++i) {
      float* row = probs + i * n;
      float* grad_row = grads + i * n;
      const float lse = g.lse[offset + i];
      if (lse == -std::numeric_limits<float>::infinity()) {
        for (int span = 0; span < spans.count; ++span) {
          std::fill(row + spans.begin[span], row + spans.end[span], 0.f);
          std::fill(grad_row + spans.begin[span], grad_row + spans.end[span], 0.f);
        }
        continue;
      }
      // dS = P * (keep dPd / (1 - p) - D), D = dO . O; the mask is applied to dPd, then P is dropped
      // out in place for dV.
      drop(p, head_row, first + i, grad_row, p.keep_scale, spans);
      const float total = dot(grad_out + i * c, g.out + (offset + i) * c, c);
      for (int span = 0; span < spans.count; ++span) {
        int64_t j = spans.begin[span];
        // s / sqrt(d) - lse <= 0 in exact arithmetic (a probability is at most 1), but rounding can make it
        // positive where scores are large (1e12 and more after a diverging step): clamped to 0, never past exp's domain.
        for (; j + kLanes <= spans.end[span]; j += kLanes) {
          const Floats exponent = load(row + j) * p.scale - lse;
          const Floats prob = exp_nonpositive(exponent > 0.0f ? Floats{} : exponent);
          store(row + j, prob);
          store(grad_row + j, prob * (load(grad_row + j) - total));
        }
        for (; j < spans.end[span]; ++j) {
          row[j] = exp_nonpositive(std::min(row[j] * p.scale - lse, 0.0f));
          grad_row[j] = row[j] * (grad_row[j] - total);
        }
      }
      drop(p, head_row, first + i, row, p.keep_scale, spans);
    }
    for (int span = 0; span < spans.count; ++span) {
      const int64_t begin = spans.begin[span], width = spans.end[span] - begin;
      gemm(width, c, rows, probs + begin, 1, n, grad_out, c, grad_v + begin * c, c, 1.f, true);  // dV += Pd^T dO
      gemm(rows, d, width, grads + begin, n, 1, keys + begin * d, d, g.grad_q + offset * d, d, p.scale,
           span > 0);  // dQ = dS K / sqrt(d)
      gemm(width, d, rows, grads + begin, 1, n, queries, d, grad_k + begin * d, d, p.scale, true);  // dK += dS^T Q / sqrt(d)
    }
  }
}

void check_arguments(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const c10::optional<at::Tensor>& key_mask,
                     double dropout, const at::Tensor& seed, int64_t radius, int64_t num_global) {
  TORCH_CHECK_VALUE(q.dim() == 4 && k.sizes() == q.sizes() && v.dim() == 4 && v.sizes().slice(0, 3) == q.sizes().slice(0, 3),
                    "softmax_dropout_attention takes q and k of one shape (batch, heads, n, d) and v (batch, heads, n, c), "
                    "got ",
                    q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  TORCH_CHECK_VALUE(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat,
                    "softmax_dropout_attention computes in float32; got ", q.scalar_type(), ", ", k.scalar_type(), ", ",
                    v.scalar_type());
  TORCH_CHECK_VALUE(q.size(2) >= 1 && q.size(3) >= 1 && v.size(3) >= 1, "softmax_dropout_attention needs n, d, c >= 1, got ",
                    q.sizes(), " and ", v.sizes());
  if (key_mask.has_value())
    TORCH_CHECK_VALUE(key_mask->scalar_type() == at::kBool && key_mask->dim() == 2 && key_mask->size(0) == q.size(0) &&
                          key_mask->size(1) == q.size(2),
                      "key_mask must be bool (batch, n) = (", q.size(0), ", ", q.size(2), "), got ", key_mask->scalar_type(),
                      " ", key_mask->sizes());
  TORCH_CHECK_VALUE(dropout >= 0.0 && dropout < 1.0, "dropout must be in [0, 1), got ", dropout);
  TORCH_CHECK_VALUE(seed.numel() == 1 && seed.scalar_type() == at::kLong, "seed must be one int64, got ", seed.scalar_type(),
                    " ", seed.sizes());
  TORCH_CHECK_VALUE(radius >= -1, "radius must be >= 0 (the band |i - j| <= radius) or -1 (every key), got ", radius);
  TORCH_CHECK_VALUE(num_global >= 0, "num_global must be >= 0, got ", num_global);
}

Problem make_problem(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const c10::optional<at::Tensor>& key_mask,
                     double dropout, const at::Tensor& seed, int64_t radius, int64_t num_global) {
  Problem p;
  p.head_rows = q.size(0) * q.size(1);
  p.heads = q.size(1);
  p.n = q.size(2);
  p.dim = q.size(3);
  p.value_dim = v.size(3);
  p.q = q.data_ptr<float>();
  p.k = k.data_ptr<float>();
  p.v = v.data_ptr<float>();
  p.key_mask = key_mask.has_value() ? key_mask->data_ptr<bool>() : nullptr;
  p.radius = radius;
  p.num_global = num_global;
  p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.dim)));
  p.seed = static_cast<uint64_t>(seed.item<int64_t>());
  p.threshold = drop_threshold(dropout);
  p.keep_scale = static_cast<float>(1.0 / (1.0 - dropout));
  return p;
}

std::tuple<at::Tensor, at::Tensor> softmax_dropout_attention_cpu(const at::Tensor& q_in, const at::Tensor& k_in,
                                                                 const at::Tensor& v_in,
                                                                 const c10::optional<at::Tensor>& key_mask_in,
                                                                 double dropout, const at::Tensor& seed, int64_t radius,
                                                                 int64_t num_global) {
  check_arguments(q_in, k_in, v_in, key_mask_in, dropout, seed, radius, num_global);
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const c10::optional<at::Tensor> key_mask =
      key_mask_in.has_value() ? c10::optional<at::Tensor>(key_mask_in->contiguous()) : c10::nullopt;
  const Problem p = make_problem(q, k, v, key_mask, dropout, seed, radius, num_global);
  at::Tensor out = at::empty(v.sizes(), v.options());
  at::Tensor lse = at::empty(q.sizes().slice(0, 3), q.options());
  float* out_data = out.data_ptr<float>();
  float* lse_data = lse.data_ptr<float>();
  for_each_head_row<Scratch>(p, [&](int64_t head_row, Scratch& s) { forward_head_row(p, head_row, s, out_data, lse_data); });
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> softmax_dropout_attention_backward_cpu(
    const at::Tensor& grad_out_in, const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const c10::optional<at::Tensor>& key_mask_in, const at::Tensor& out_in, const at::Tensor& lse_in, double dropout,
    const at::Tensor& seed, int64_t radius, int64_t num_global) {
  check_arguments(q_in, k_in, v_in, key_mask_in, dropout, seed, radius, num_global);
  TORCH_CHECK_VALUE(grad_out_in.sizes() == v_in.sizes() && out_in.sizes() == v_in.sizes() &&
                        lse_in.sizes() == q_in.sizes().slice(0, 3),
                    "grad_out and out must have v's shape and lse (batch, heads, n)");
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const at::Tensor grad_out = grad_out_in.to(at::kFloat).contiguous(), out = out_in.contiguous(), lse = lse_in.contiguous();
  const c10::optional<at::Tensor> key_mask =
      key_mask_in.has_value() ? c10::optional<at::Tensor>(key_mask_in->contiguous()) : c10::nullopt;
  const Problem p = make_problem(q, k, v, key_mask, dropout, seed, radius, num_global);
  at::Tensor grad_q = at::empty_like(q), grad_k = at::empty_like(k), grad_v = at::empty_like(v);
  const Gradients g{grad_out.data_ptr<float>(), out.data_ptr<float>(), lse.data_ptr<float>(),
                    grad_q.data_ptr<float>(),   grad_k.data_ptr<float>(), grad_v.data_ptr<float>()};
  for_each_head_row<Scratch>(p, [&](int64_t head_row, Scratch& s) { backward_head_row(p, g, head_row, s); });
  return {grad_q, grad_k, grad_v};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(yoso, m) {
  m.def(
      "softmax_dropout_attention(Tensor q, Tensor k, Tensor v, Tensor? key_mask, float dropout, Tensor seed, int radius=-1, "
      "int num_global=0) -> (Tensor, Tensor)");
  m.def(
      "softmax_dropout_attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor? key_mask, Tensor out, "
      "Tensor lse, float dropout, Tensor seed, int radius=-1, int num_global=0) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(yoso, CPU, m) {
  m.impl("softmax_dropout_attention", &softmax_dropout_attention_cpu);
  m.impl("softmax_dropout_attention_backward", &softmax_dropout_attention_backward_cpu);
}

}  // namespace yoso
