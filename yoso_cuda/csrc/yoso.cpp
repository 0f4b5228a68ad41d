// YOSO's ops: the schemas (TORCH_LIBRARY) and their CPU kernels.
//
// The semantics are those of yoso_cuda/reference.py, the oracle the tests compare against:
// B folds batch and heads, n is the sequence length, m the number of hashes, tau the bits of a
// hash code (codes are int32 in [0, 2^tau); a code outside is an error), masks are bool (true = real token). Padded keys
// never contribute and padded queries get zero rows. Inputs may be float32, float16 or bfloat16;
// everything accumulates and returns in float32.
//
// The CPU kernels group the real keys of each (row, hash) by code, so each occupied bucket is a
// contiguous range, and work bucket by bucket; memory stays linear in n whatever tau is. Rows are
// processed in parallel (at::parallel_for) and hashes in a fixed order, so results are
// deterministic.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "checks.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

namespace yoso {

constexpr float kDerivativeShrink = 0.99f;  // f' is evaluated at 0.99 x so 1/sqrt(1 - x^2) stays <= 7.1
constexpr double kPi = 3.14159265358979323846;

namespace {

// `codes` made contiguous, after rejecting a code outside [0, 2^hash_bits): the buckets below are
// indexed by code.
at::Tensor checked_codes(const at::Tensor& codes_in, const char* name, int64_t hash_bits) {
  at::Tensor codes = codes_in.contiguous();
  const int32_t* data = codes.data_ptr<int32_t>();
  const int64_t count = codes.numel();
  const bool in_range = at::parallel_reduce(
      0, count, 1 << 16, true,
      [&](int64_t begin, int64_t end, bool ok) {
        for (int64_t i = begin; i < end && ok; ++i) ok = (static_cast<uint32_t>(data[i]) >> hash_bits) == 0u;
        return ok;
      },
      [](bool a, bool b) { return a && b; });
  TORCH_CHECK_VALUE(in_range, codes_out_of_range(name, hash_bits));
  return codes;
}

at::Tensor as_float(const at::Tensor& tensor) { return tensor.to(at::kFloat).contiguous(); }

// Whether a table with one row per code (2^tau rows) stays linear in the length.
inline bool uses_dense_table(int64_t hash_bits, int64_t length) { return (int64_t{1} << hash_bits) <= 4 * length + 64; }

// The real rows of one (batch row, hash) grouped by code, each bucket a contiguous range of
// `order`. When 2^tau is O(length) a counting sort over every code is linear and a lookup finds a
// bucket; otherwise the rows are sorted by code and a binary search over the occupied codes finds
// it. The buffers are reused from one hash to the next.
class Buckets {
 public:
  std::vector<int64_t> order;   // rows grouped by code, ascending within a bucket
  std::vector<int32_t> codes;   // sparse mode: the occupied codes, ascending
  std::vector<int64_t> start;   // sparse mode: bucket u is order[start[u], start[u + 1])

  Buckets(int64_t hash_bits, int64_t length) : hash_bits_(hash_bits), dense_(uses_dense_table(hash_bits, length)) {}

  void group(const int32_t* row_codes, const bool* row_mask, int64_t length, int64_t num_hashes, int64_t hash) {
    order.clear();
    if (dense_) {
      const int64_t capacity = int64_t{1} << hash_bits_;
      offset_.assign(capacity + 1, 0);
      for (int64_t j = 0; j < length; ++j) {
        if (row_mask[j]) ++offset_[row_codes[j * num_hashes + hash] + 1];
      }
      for (int64_t c = 0; c < capacity; ++c) offset_[c + 1] += offset_[c];
      order.resize(offset_[capacity]);
      fill_.assign(offset_.begin(), offset_.end() - 1);
      for (int64_t j = 0; j < length; ++j) {
        if (row_mask[j]) order[fill_[row_codes[j * num_hashes + hash]]++] = j;
      }
      return;
    }
    entries_.clear();
    for (int64_t j = 0; j < length; ++j) {
      if (row_mask[j]) entries_.emplace_back(row_codes[j * num_hashes + hash], j);
    }
    std::sort(entries_.begin(), entries_.end());
    codes.clear();
    start.clear();
    for (size_t e = 0; e < entries_.size(); ++e) {
      if (e == 0 || entries_[e].first != entries_[e - 1].first) {
        codes.push_back(entries_[e].first);
        start.push_back(static_cast<int64_t>(e));
      }
      order.push_back(entries_[e].second);
    }
    start.push_back(static_cast<int64_t>(entries_.size()));
  }

  // Calls visit(code, first, last) for every occupied bucket, in ascending code order.
  template <typename Visit>
  void for_each_bucket(Visit visit) const {
    if (dense_) {
      for (int64_t c = 0; c + 1 < static_cast<int64_t>(offset_.size()); ++c) {
        if (offset_[c + 1] > offset_[c]) visit(static_cast<int32_t>(c), offset_[c], offset_[c + 1]);
      }
      return;
    }
    for (size_t u = 0; u < codes.size(); ++u) visit(codes[u], start[u], start[u + 1]);
  }

  // The rows [begin, end) of `order` whose code is `code` (empty if none).
  std::pair<int64_t, int64_t> range(int32_t code) const {
    if (dense_) return {offset_[code], offset_[code + 1]};
    auto it = std::lower_bound(codes.begin(), codes.end(), code);
    if (it == codes.end() || *it != code) return {0, 0};
    const int64_t u = it - codes.begin();
    return {start[u], start[u + 1]};
  }

 private:
  int64_t hash_bits_;
  bool dense_;
  std::vector<int64_t> offset_, fill_;                 // dense mode
  std::vector<std::pair<int32_t, int64_t>> entries_;  // sparse mode
};

inline float dot(const float* a, const float* b, int64_t size) {
  float total = 0.f;
  for (int64_t k = 0; k < size; ++k) total += a[k] * b[k];
  return total;
}

inline void add_scaled(float* out, const float* x, float scale, int64_t size) {
  for (int64_t k = 0; k < size; ++k) out[k] += scale * x[k];
}

constexpr int64_t kLanes = 16;  // vectors hashed together by hash_codes_cpu

// In-place unnormalised Walsh-Hadamard transform of kLanes vectors of a power-of-two length, stored
// coordinate-major: x[k * kLanes + lane]. The butterflies run in the natural order (strides 1, 2, 4...).
void hadamard_transform_lanes(float* x, int64_t size) {
  for (int64_t half = 1; half < size; half *= 2) {
    for (int64_t i = 0; i < size; i += 2 * half) {
      for (int64_t j = i; j < i + half; ++j) {
        float* low = x + j * kLanes;
        float* high = x + (j + half) * kLanes;
        for (int64_t lane = 0; lane < kLanes; ++lane) {
          const float a = low[lane], b = high[lane];
          low[lane] = a + b;
          high[lane] = a - b;
        }
      }
    }
  }
}

}  // namespace

at::Tensor hash_codes_cpu(const at::Tensor& vectors, const at::Tensor& signs, int64_t num_hashes, int64_t hash_bits) {
  check_hash_codes_args(vectors, signs, num_hashes, hash_bits);
  const int64_t batch = vectors.size(0), length = vectors.size(1), dim = vectors.size(2);
  const int64_t rotations = signs.size(2), width = signs.size(3), per_rotation = width / hash_bits;
  const at::Tensor x_all = as_float(vectors);
  const at::Tensor s_all = signs.contiguous();
  at::Tensor out = at::empty({batch, length, num_hashes}, vectors.options().dtype(at::kInt));
  const float* x_data = x_all.data_ptr<float>();
  const float* s_data = s_all.data_ptr<float>();
  int32_t* out_data = out.data_ptr<int32_t>();
  // Blocks of kLanes vectors of one batch row, stored coordinate-major (buffer[k * kLanes + lane]),
  // so every step of the transform is a loop over kLanes contiguous floats that vectorises.
  const int64_t blocks_per_row = (length + kLanes - 1) / kLanes;
  at::parallel_for(0, batch * blocks_per_row, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> source(width * kLanes), buffer(width * kLanes);
    std::vector<int32_t> codes(kLanes);
    for (int64_t block = begin; block < end; ++block) {
      const int64_t b = block / blocks_per_row, first = (block % blocks_per_row) * kLanes;
      const int64_t lanes = std::min(kLanes, length - first);
      const float* vectors_in = x_data + (b * length + first) * dim;
      std::fill(source.begin(), source.end(), 0.f);  // zero padding to the width, and for missing lanes
      for (int64_t lane = 0; lane < lanes; ++lane) {
        for (int64_t k = 0; k < dim; ++k) source[k * kLanes + lane] = vectors_in[lane * dim + k];
      }
      for (int64_t r = 0; r < rotations; ++r) {
        for (int64_t step = 0; step < 3; ++step) {
          const float* diagonal = s_data + ((b * 3 + step) * rotations + r) * width;
          const float* in = step == 0 ? source.data() : buffer.data();
          for (int64_t k = 0; k < width; ++k) {
            for (int64_t lane = 0; lane < kLanes; ++lane) buffer[k * kLanes + lane] = in[k * kLanes + lane] * diagonal[k];
          }
          hadamard_transform_lanes(buffer.data(), width);
        }
        for (int64_t t = 0; t < per_rotation && r * per_rotation + t < num_hashes; ++t) {
          std::fill(codes.begin(), codes.end(), 0);
          for (int64_t bit = 0; bit < hash_bits; ++bit) {
            const float* coordinate = buffer.data() + (t * hash_bits + bit) * kLanes;
            for (int64_t lane = 0; lane < kLanes; ++lane) codes[lane] |= static_cast<int32_t>(coordinate[lane] > 0.f) << bit;
          }
          for (int64_t lane = 0; lane < lanes; ++lane) {
            out_data[((b * length) + first + lane) * num_hashes + r * per_rotation + t] = codes[lane];
          }
        }
      }
    }
  });
  return out;
}

at::Tensor lsh_cumulation_cpu(const at::Tensor& query_codes, const at::Tensor& query_mask,
                              const at::Tensor& key_codes, const at::Tensor& key_mask, const at::Tensor& values,
                              int64_t hash_bits) {
  check_codes_and_masks(query_codes, query_mask, key_codes, key_mask, hash_bits);
  check_rows(values, key_codes, "values");
  const int64_t batch = query_codes.size(0), num_queries = query_codes.size(1), num_keys = key_codes.size(1);
  const int64_t num_hashes = query_codes.size(2), channels = values.size(2);
  const at::Tensor q_codes = checked_codes(query_codes, "query_codes", hash_bits);
  const at::Tensor k_codes = checked_codes(key_codes, "key_codes", hash_bits);
  const at::Tensor q_mask = query_mask.contiguous(), k_mask = key_mask.contiguous(), v = as_float(values);
  at::Tensor out = at::zeros({batch, num_queries, channels}, values.options().dtype(at::kFloat));
  const bool dense = uses_dense_table(hash_bits, num_keys);
  at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> sums;
    Buckets buckets(hash_bits, num_keys);
    for (int64_t b = begin; b < end; ++b) {
      const int32_t* qc = q_codes.data_ptr<int32_t>() + b * num_queries * num_hashes;
      const int32_t* kc = k_codes.data_ptr<int32_t>() + b * num_keys * num_hashes;
      const bool* qm = q_mask.data_ptr<bool>() + b * num_queries;
      const bool* km = k_mask.data_ptr<bool>() + b * num_keys;
      const float* vb = v.data_ptr<float>() + b * num_keys * channels;
      float* ob = out.data_ptr<float>() + b * num_queries * channels;
      for (int64_t h = 0; h < num_hashes; ++h) {
        if (dense) {  // 2^tau is O(n): one table row per code, scatter the keys, gather the queries
          sums.assign((int64_t{1} << hash_bits) * channels, 0.f);
          for (int64_t j = 0; j < num_keys; ++j) {
            if (km[j]) add_scaled(sums.data() + kc[j * num_hashes + h] * channels, vb + j * channels, 1.f, channels);
          }
          for (int64_t i = 0; i < num_queries; ++i) {
            if (qm[i]) add_scaled(ob + i * channels, sums.data() + qc[i * num_hashes + h] * channels, 1.f, channels);
          }
          continue;
        }
        buckets.group(kc, km, num_keys, num_hashes, h);  // 2^tau >> n: sum per occupied bucket
        const int64_t occupied = static_cast<int64_t>(buckets.codes.size());
        sums.assign(occupied * channels, 0.f);
        for (int64_t u = 0; u < occupied; ++u) {
          for (int64_t e = buckets.start[u]; e < buckets.start[u + 1]; ++e) {
            add_scaled(sums.data() + u * channels, vb + buckets.order[e] * channels, 1.f, channels);
          }
        }
        for (int64_t i = 0; i < num_queries; ++i) {
          if (!qm[i]) continue;
          const int32_t code = qc[i * num_hashes + h];
          const auto it = std::lower_bound(buckets.codes.begin(), buckets.codes.end(), code);
          if (it != buckets.codes.end() && *it == code) {
            add_scaled(ob + i * channels, sums.data() + (it - buckets.codes.begin()) * channels, 1.f, channels);
          }
        }
      }
      for (int64_t k = 0; k < num_queries * channels; ++k) ob[k] /= static_cast<float>(num_hashes);
    }
  });
  return out;
}

at::Tensor lsh_weighted_cumulation_cpu(const at::Tensor& query_codes, const at::Tensor& query_mask,
                                       const at::Tensor& query_weights, const at::Tensor& key_codes,
                                       const at::Tensor& key_mask, const at::Tensor& key_weights,
                                       const at::Tensor& values, int64_t hash_bits) {
  check_codes_and_masks(query_codes, query_mask, key_codes, key_mask, hash_bits);
  check_rows(query_weights, query_codes, "query_weights");
  check_rows(key_weights, key_codes, "key_weights");
  check_rows(values, key_codes, "values");
  check_same_width(query_weights, key_weights, "query_weights", "key_weights");
  const int64_t batch = query_codes.size(0), num_queries = query_codes.size(1), num_keys = key_codes.size(1);
  const int64_t num_hashes = query_codes.size(2), width = query_weights.size(2), channels = values.size(2);
  const at::Tensor q_codes = checked_codes(query_codes, "query_codes", hash_bits);
  const at::Tensor k_codes = checked_codes(key_codes, "key_codes", hash_bits);
  const at::Tensor q_mask = query_mask.contiguous(), k_mask = key_mask.contiguous();
  const at::Tensor qw = as_float(query_weights), kw = as_float(key_weights), v = as_float(values);
  at::Tensor out = at::zeros({batch, num_queries, channels}, values.options().dtype(at::kFloat));
  at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    Buckets keys(hash_bits, num_keys);
    std::vector<int64_t> hits, table_of;  // per bucket (keyed by its first position in keys.order)
    std::vector<float> tables;
    for (int64_t b = begin; b < end; ++b) {
      const int32_t* qc = q_codes.data_ptr<int32_t>() + b * num_queries * num_hashes;
      const int32_t* kc = k_codes.data_ptr<int32_t>() + b * num_keys * num_hashes;
      const bool* qm = q_mask.data_ptr<bool>() + b * num_queries;
      const bool* km = k_mask.data_ptr<bool>() + b * num_keys;
      const float* qwb = qw.data_ptr<float>() + b * num_queries * width;
      const float* kwb = kw.data_ptr<float>() + b * num_keys * width;
      const float* vb = v.data_ptr<float>() + b * num_keys * channels;
      float* ob = out.data_ptr<float>() + b * num_queries * channels;
      for (int64_t h = 0; h < num_hashes; ++h) {
        keys.group(kc, km, num_keys, num_hashes, h);
        // Count the queries of each bucket: a bucket whose pairs would cost more than summing
        // kw_j v_j^T once and contracting it per query gets such a table (built on first use).
        hits.assign(keys.order.size() + 1, 0);
        for (int64_t i = 0; i < num_queries; ++i) {
          if (!qm[i]) continue;
          const auto [first, last] = keys.range(qc[i * num_hashes + h]);
          if (last > first) ++hits[first];
        }
        table_of.assign(keys.order.size() + 1, -1);
        tables.clear();
        for (int64_t i = 0; i < num_queries; ++i) {
          if (!qm[i]) continue;
          const auto [first, last] = keys.range(qc[i * num_hashes + h]);
          if (last == first) continue;
          const int64_t pair_cost = hits[first] * (last - first) * (width + channels);
          const int64_t table_cost = (hits[first] + (last - first)) * width * channels;
          if (pair_cost <= table_cost) {  // few pairs: weight each colliding pair directly
            for (int64_t f = first; f < last; ++f) {
              const int64_t j = keys.order[f];
              add_scaled(ob + i * channels, vb + j * channels, dot(qwb + i * width, kwb + j * width, width), channels);
            }
            continue;
          }
          if (table_of[first] < 0) {  // a crowded bucket: sum kw_j v_j^T once
            table_of[first] = static_cast<int64_t>(tables.size());
            tables.resize(tables.size() + width * channels, 0.f);
            float* table = tables.data() + table_of[first];
            for (int64_t f = first; f < last; ++f) {
              const int64_t j = keys.order[f];
              for (int64_t w = 0; w < width; ++w) add_scaled(table + w * channels, vb + j * channels, kwb[j * width + w], channels);
            }
          }
          const float* table = tables.data() + table_of[first];
          for (int64_t w = 0; w < width; ++w) add_scaled(ob + i * channels, table + w * channels, qwb[i * width + w], channels);
        }
      }
      for (int64_t k = 0; k < num_queries * channels; ++k) ob[k] /= static_cast<float>(num_hashes);
    }
  });
  return out;
}

// Both sides of the weighted cumulation in one pass over the colliding pairs, for YOSO's
// lower-bound backward where grad Q and grad K share the pair weights s_ij = qw_i . kw_j:
//   query_out_i = (1/m) sum_h sum_j [collide] s_ij key_values_j
//   key_out_j   = (1/m) sum_h sum_i [collide] s_ij query_values_i
std::tuple<at::Tensor, at::Tensor> lsh_weighted_cumulation_both_cpu(
    const at::Tensor& query_codes, const at::Tensor& query_mask, const at::Tensor& query_weights,
    const at::Tensor& query_values, const at::Tensor& key_codes, const at::Tensor& key_mask,
    const at::Tensor& key_weights, const at::Tensor& key_values, int64_t hash_bits) {
  check_codes_and_masks(query_codes, query_mask, key_codes, key_mask, hash_bits);
  check_rows(query_weights, query_codes, "query_weights");
  check_rows(query_values, query_codes, "query_values");
  check_rows(key_weights, key_codes, "key_weights");
  check_rows(key_values, key_codes, "key_values");
  check_same_width(query_weights, key_weights, "query_weights", "key_weights");
  const int64_t batch = query_codes.size(0), num_queries = query_codes.size(1), num_keys = key_codes.size(1);
  const int64_t num_hashes = query_codes.size(2), width = query_weights.size(2);
  const int64_t query_channels = query_values.size(2), key_channels = key_values.size(2);
  const at::Tensor q_codes = checked_codes(query_codes, "query_codes", hash_bits);
  const at::Tensor k_codes = checked_codes(key_codes, "key_codes", hash_bits);
  const at::Tensor q_mask = query_mask.contiguous(), k_mask = key_mask.contiguous();
  const at::Tensor qw = as_float(query_weights), kw = as_float(key_weights);
  const at::Tensor qv = as_float(query_values), kv = as_float(key_values);
  at::Tensor query_out = at::zeros({batch, num_queries, key_channels}, key_values.options().dtype(at::kFloat));
  at::Tensor key_out = at::zeros({batch, num_keys, query_channels}, query_values.options().dtype(at::kFloat));
  at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    Buckets keys(hash_bits, num_keys), queries(hash_bits, num_queries);
    std::vector<float> key_table(width * key_channels), query_table(width * query_channels);
    for (int64_t b = begin; b < end; ++b) {
      const int32_t* qc = q_codes.data_ptr<int32_t>() + b * num_queries * num_hashes;
      const int32_t* kc = k_codes.data_ptr<int32_t>() + b * num_keys * num_hashes;
      const bool* qm = q_mask.data_ptr<bool>() + b * num_queries;
      const bool* km = k_mask.data_ptr<bool>() + b * num_keys;
      const float* qwb = qw.data_ptr<float>() + b * num_queries * width;
      const float* kwb = kw.data_ptr<float>() + b * num_keys * width;
      const float* qvb = qv.data_ptr<float>() + b * num_queries * query_channels;
      const float* kvb = kv.data_ptr<float>() + b * num_keys * key_channels;
      float* qo = query_out.data_ptr<float>() + b * num_queries * key_channels;
      float* ko = key_out.data_ptr<float>() + b * num_keys * query_channels;
      for (int64_t h = 0; h < num_hashes; ++h) {
        keys.group(kc, km, num_keys, num_hashes, h);
        queries.group(qc, qm, num_queries, num_hashes, h);
        queries.for_each_bucket([&](int32_t code, int64_t q_first, int64_t q_last) {
          const auto [k_first, k_last] = keys.range(code);
          const int64_t nq = q_last - q_first, nk = k_last - k_first;
          if (nk == 0) return;
          if (nq * nk * (width + query_channels + key_channels) <= (nq + nk) * width * (query_channels + key_channels)) {
            for (int64_t e = q_first; e < q_last; ++e) {  // few pairs: one weight per pair, both updates
              const int64_t i = queries.order[e];
              for (int64_t f = k_first; f < k_last; ++f) {
                const int64_t j = keys.order[f];
                const float weight = dot(qwb + i * width, kwb + j * width, width);
                add_scaled(qo + i * key_channels, kvb + j * key_channels, weight, key_channels);
                add_scaled(ko + j * query_channels, qvb + i * query_channels, weight, query_channels);
              }
            }
            return;
          }
          // A crowded bucket: sum kw (x) key_values and qw (x) query_values once, contract per row.
          std::fill(key_table.begin(), key_table.end(), 0.f);
          std::fill(query_table.begin(), query_table.end(), 0.f);
          for (int64_t f = k_first; f < k_last; ++f) {
            const int64_t j = keys.order[f];
            for (int64_t w = 0; w < width; ++w) add_scaled(key_table.data() + w * key_channels, kvb + j * key_channels, kwb[j * width + w], key_channels);
          }
          for (int64_t e = q_first; e < q_last; ++e) {
            const int64_t i = queries.order[e];
            for (int64_t w = 0; w < width; ++w) add_scaled(query_table.data() + w * query_channels, qvb + i * query_channels, qwb[i * width + w], query_channels);
          }
          for (int64_t e = q_first; e < q_last; ++e) {
            const int64_t i = queries.order[e];
            for (int64_t w = 0; w < width; ++w) add_scaled(qo + i * key_channels, key_table.data() + w * key_channels, qwb[i * width + w], key_channels);
          }
          for (int64_t f = k_first; f < k_last; ++f) {
            const int64_t j = keys.order[f];
            for (int64_t w = 0; w < width; ++w) add_scaled(ko + j * query_channels, query_table.data() + w * query_channels, kwb[j * width + w], query_channels);
          }
        });
      }
      for (int64_t k = 0; k < num_queries * key_channels; ++k) qo[k] /= static_cast<float>(num_hashes);
      for (int64_t k = 0; k < num_keys * query_channels; ++k) ko[k] /= static_cast<float>(num_hashes);
    }
  });
  return {query_out, key_out};
}

at::Tensor lsh_collided_gradient_cpu(const at::Tensor& query_codes, const at::Tensor& query_mask,
                                     const at::Tensor& query_vectors, const at::Tensor& query_weights,
                                     const at::Tensor& key_codes, const at::Tensor& key_mask,
                                     const at::Tensor& key_vectors, const at::Tensor& key_weights, int64_t hash_bits) {
  check_codes_and_masks(query_codes, query_mask, key_codes, key_mask, hash_bits);
  check_rows(query_vectors, query_codes, "query_vectors");
  check_rows(query_weights, query_codes, "query_weights");
  check_rows(key_vectors, key_codes, "key_vectors");
  check_rows(key_weights, key_codes, "key_weights");
  check_same_width(query_vectors, key_vectors, "query_vectors", "key_vectors");
  check_same_width(query_weights, key_weights, "query_weights", "key_weights");
  const int64_t batch = query_codes.size(0), num_queries = query_codes.size(1), num_keys = key_codes.size(1);
  const int64_t num_hashes = query_codes.size(2), dim = query_vectors.size(2), width = query_weights.size(2);
  const at::Tensor q_codes = checked_codes(query_codes, "query_codes", hash_bits);
  const at::Tensor k_codes = checked_codes(key_codes, "key_codes", hash_bits);
  const at::Tensor q_mask = query_mask.contiguous(), k_mask = key_mask.contiguous();
  const at::Tensor qv = as_float(query_vectors), kv = as_float(key_vectors);
  const at::Tensor qw = as_float(query_weights), kw = as_float(key_weights);
  at::Tensor out = at::zeros({batch, num_queries, dim}, query_vectors.options().dtype(at::kFloat));
  const float tau = static_cast<float>(hash_bits);
  at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    Buckets keys(hash_bits, num_keys);
    for (int64_t b = begin; b < end; ++b) {
      const int32_t* qc = q_codes.data_ptr<int32_t>() + b * num_queries * num_hashes;
      const int32_t* kc = k_codes.data_ptr<int32_t>() + b * num_keys * num_hashes;
      const bool* qm = q_mask.data_ptr<bool>() + b * num_queries;
      const bool* km = k_mask.data_ptr<bool>() + b * num_keys;
      const float* qvb = qv.data_ptr<float>() + b * num_queries * dim;
      const float* kvb = kv.data_ptr<float>() + b * num_keys * dim;
      const float* qwb = qw.data_ptr<float>() + b * num_queries * width;
      const float* kwb = kw.data_ptr<float>() + b * num_keys * width;
      float* ob = out.data_ptr<float>() + b * num_queries * dim;
      for (int64_t h = 0; h < num_hashes; ++h) {
        keys.group(kc, km, num_keys, num_hashes, h);
        for (int64_t i = 0; i < num_queries; ++i) {
          if (!qm[i]) continue;
          const auto [first, last] = keys.range(qc[i * num_hashes + h]);
          for (int64_t f = first; f < last; ++f) {
            const int64_t j = keys.order[f];
            bool collided_before = false;  // count each pair once, in the first hash where it collides
            for (int64_t g = 0; g < h && !collided_before; ++g) {
              collided_before = qc[i * num_hashes + g] == kc[j * num_hashes + g];
            }
            if (collided_before) continue;
            const float x = kDerivativeShrink * dot(qvb + i * dim, kvb + j * dim, dim);
            const float p = 1.f - std::acos(x) / static_cast<float>(kPi);
            const float derivative = tau * std::pow(p, tau - 1.f) / (static_cast<float>(kPi) * std::sqrt(1.f - x * x));
            add_scaled(ob + i * dim, kvb + j * dim, dot(qwb + i * width, kwb + j * width, width) * derivative, dim);
          }
        }
      }
    }
  });
  return out;
}

TORCH_LIBRARY(yoso, m) {
  m.def("hash_codes(Tensor vectors, Tensor signs, int num_hashes, int hash_bits) -> Tensor");
  m.def(
      "lsh_cumulation(Tensor query_codes, Tensor query_mask, Tensor key_codes, Tensor key_mask, Tensor values, "
      "int hash_bits) -> Tensor");
  m.def(
      "lsh_weighted_cumulation(Tensor query_codes, Tensor query_mask, Tensor query_weights, Tensor key_codes, "
      "Tensor key_mask, Tensor key_weights, Tensor values, int hash_bits) -> Tensor");
  m.def(
      "lsh_weighted_cumulation_both(Tensor query_codes, Tensor query_mask, Tensor query_weights, Tensor query_values, "
      "Tensor key_codes, Tensor key_mask, Tensor key_weights, Tensor key_values, int hash_bits) -> (Tensor, Tensor)");
  m.def(
      "lsh_collided_gradient(Tensor query_codes, Tensor query_mask, Tensor query_vectors, Tensor query_weights, "
      "Tensor key_codes, Tensor key_mask, Tensor key_vectors, Tensor key_weights, int hash_bits) -> Tensor");
}

TORCH_LIBRARY_IMPL(yoso, CPU, m) {
  m.impl("hash_codes", &hash_codes_cpu);
  m.impl("lsh_cumulation", &lsh_cumulation_cpu);
  m.impl("lsh_weighted_cumulation", &lsh_weighted_cumulation_cpu);
  m.impl("lsh_weighted_cumulation_both", &lsh_weighted_cumulation_both_cpu);
  m.impl("lsh_collided_gradient", &lsh_collided_gradient_cpu);
}

}  // namespace yoso
