// What the blockwise attentions (softmax_dropout.cpp, expectation.cpp, chunked_attention.cpp) share: their small GEMMs,
// a block of queries against its keys, with register blocking and no packing, since one operand is always a block of
// at most 64 rows that stays in cache; a head row's K^T and V^T and the keys of a right-padded row worth scoring; and
// the loop that gives each head row to one thread.

#pragma once

#include <ATen/Parallel.h>

#include "simd.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace yoso {
namespace {

// C (M x N, row stride ldc) = or += alpha * A B, with A(m, k) = a[m * a_row + k * a_col] and B (K x N,
// row stride ldb). Blocks of 6 rows x 16 columns accumulate in registers; A's elements are broadcast.
template <int kRows, int kVectors>
YOSO_INLINE void gemm_block(int64_t K, const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t ldb, float* c,
                            int64_t ldc, float alpha, bool accumulate) {
  Floats sum[kRows][kVectors] = {};
  for (int64_t k = 0; k < K; ++k) {
    Floats row[kVectors];
    for (int v = 0; v < kVectors; ++v) row[v] = load(b + k * ldb + v * kLanes);
    for (int r = 0; r < kRows; ++r) {
      const Floats weight = Floats{} + a[r * a_row + k * a_col];
      for (int v = 0; v < kVectors; ++v) sum[r][v] += weight * row[v];
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < kVectors; ++v) {
      float* out = c + r * ldc + v * kLanes;
      store(out, accumulate ? load(out) + alpha * sum[r][v] : alpha * sum[r][v]);
    }
}

template <int kVectors>
YOSO_INLINE void gemm_columns(int64_t M, int64_t K, const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t ldb,
                              float* c, int64_t ldc, float alpha, bool accumulate) {
  constexpr int kRows = 12 / kVectors;  // 12 accumulators, the loaded row and a broadcast: 16 AVX2 registers or fewer
  int64_t m = 0;
  for (; m + kRows <= M; m += kRows)
    gemm_block<kRows, kVectors>(K, a + m * a_row, a_row, a_col, b, ldb, c + m * ldc, ldc, alpha, accumulate);
  // The rows left (a block of 64 leaves 4 of 6): as few blocks as possible, each row of B loaded once per block.
  for (; m + 4 <= M; m += 4) gemm_block<4, kVectors>(K, a + m * a_row, a_row, a_col, b, ldb, c + m * ldc, ldc, alpha, accumulate);
  for (; m + 2 <= M; m += 2) gemm_block<2, kVectors>(K, a + m * a_row, a_row, a_col, b, ldb, c + m * ldc, ldc, alpha, accumulate);
  for (; m < M; ++m) gemm_block<1, kVectors>(K, a + m * a_row, a_row, a_col, b, ldb, c + m * ldc, ldc, alpha, accumulate);
}

YOSO_INLINE void gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t a_row, int64_t a_col, const float* b,
                      int64_t ldb, float* c, int64_t ldc, float alpha, bool accumulate) {
  int64_t n = 0;
  for (; n + 2 * kLanes <= N; n += 2 * kLanes) gemm_columns<2>(M, K, a, a_row, a_col, b + n, ldb, c + n, ldc, alpha, accumulate);
  for (; n + kLanes <= N; n += kLanes) gemm_columns<1>(M, K, a, a_row, a_col, b + n, ldb, c + n, ldc, alpha, accumulate);
  for (; n < N; ++n)
    for (int64_t m = 0; m < M; ++m) {
      float sum = 0.f;
      for (int64_t k = 0; k < K; ++k) sum += a[m * a_row + k * a_col] * b[k * ldb + n];
      c[m * ldc + n] = accumulate ? c[m * ldc + n] + alpha * sum : alpha * sum;
    }
}

// One past the last real position of a row of n (0 if none; n without a mask: every position real).
YOSO_INLINE int64_t real_end(const bool* real, int64_t n) {
  int64_t end = n;
  while (real && end > 0 && !real[end - 1]) --end;
  return end;
}

// The keys worth scoring for a row whose real ones end at `end`: the keys after its last real one weigh 0 for every
// query (ListOps' rows are about half padding), and the count is rounded up to whole vectors of keys, so that the
// sums over the kept keys run in the same lanes and order as over all n.
YOSO_INLINE int64_t keys_to_score(int64_t end, int64_t n) { return std::min(n, (end + kLanes - 1) / kLanes * kLanes); }

// The row stride of a transposed operand (K^T, V^T: d rows of n keys): n in whole cache lines, and one line more. At a
// multiple of 4 KiB (n = 2048 floats is 8 KiB) every row of a GEMM's block of K^T falls in the same L1 set, whose 8 ways
// cannot hold a block's 32 rows (d = 32), and each block reads them from L2 again: YOSO-E's paper-protocol ListOps step
// took 12% longer and softmax's evaluation batch 13% (results/step_cpu_stride/).
YOSO_INLINE int64_t transposed_stride(int64_t n) { return (n + 15) / 16 * 16 + 16; }

// (rows x cols) -> (cols x rows), rows `stride` apart
void transpose(const float* in, int64_t rows, int64_t cols, float* out, int64_t stride) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * stride + r] = in[r * cols + c];
}

// A head row's K^T and V^T (dim x n, value_dim x n), rows `stride` apart: the B operands of Q K^T and G V^T.
struct TransposedKeys {
  const int64_t stride;
  std::vector<float> keys, values;
  TransposedKeys(int64_t n, int64_t dim, int64_t value_dim)
      : stride(transposed_stride(n)), keys(dim * stride), values(value_dim * stride) {}

  // From a head row's keys (n x dim) and, unless null, its values (n x value_dim).
  void load(const float* k, const float* v, int64_t n, int64_t dim, int64_t value_dim) {
    transpose(k, n, dim, keys.data(), stride);
    if (v) transpose(v, n, value_dim, values.data(), stride);
  }
};

// work(head_row, scratch) for every head row of p, each row by one thread in a fixed order, with a Scratch(p) per
// thread: results are bitwise the same on any number of threads.
template <class Scratch, class Problem, class Work>
void for_each_head_row(const Problem& p, const Work& work) {
  at::parallel_for(0, p.head_rows, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch(p);
    for (int64_t head_row = begin; head_row < end; ++head_row) work(head_row, scratch);
  });
}

}  // namespace
}  // namespace yoso
