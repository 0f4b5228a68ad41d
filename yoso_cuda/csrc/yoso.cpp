// YOSO's ops: the schemas (TORCH_LIBRARY) and their CPU kernels.
//
// The semantics are those of yoso_cuda/reference.py, the oracle the tests compare against:
// B folds batch and heads, n is the sequence length, m the number of hashes, tau the bits of a
// hash code (codes are int32 in [0, 2^tau); a code outside is an error), masks are bool (true = real token). Padded keys
// never contribute and padded queries get zero rows. Inputs may be float32, float16 or bfloat16;
// everything accumulates and returns in float32.
//
// How the CPU kernels spend their time (results/README.md has the measurements):
// * hash_codes transforms 8 vectors at once, stored lane-major (coordinate k of the 8 vectors is
//   one 8-float SIMD value), so a butterfly is one vector add and one subtract; three consecutive
//   stages run in registers per pass through memory (radix 8), and the sign diagonal is applied as
//   the first pass loads. Every rotation and hash of a vector is done in that one visit.
// * The cumulations work per (batch row, hash) on the codes transposed to (hash, row), so a
//   hash's codes are contiguous. A bucket's slot is its code when 2^tau is O(n) (the default
//   tau = log2 n), else it is found in an open-addressing table over the codes of the keys: the
//   lookup is O(1) either way and memory stays linear in n whatever tau is.
//   - lsh_cumulation adds every key's value into its slot's row of a table, then every query adds
//     its slot's row: one pass over the keys and one over the queries, no sorting.
//   - the weighted cumulations and the collided gradient group the keys by slot with a counting
//     sort (each bucket a contiguous range, keys in index order), then walk the queries in order,
//     so the query rows stream and only the keys of the query's bucket are gathered. A bucket
//     whose pairs would cost more than summing outer products once (crowded buckets: small tau)
//     is done with such a table instead.
// * The hot loops use GNU vector extensions (GCC or Clang); on x86-64 Linux with GCC they are
//   compiled twice, for AVX2 and for the baseline, and the loader picks the one the
//   CPU runs (function multiversioning).
// Batch rows run in parallel (at::parallel_for); within a batch row everything runs in a fixed
// order, so results are deterministic (bitwise run to run on a given machine and ISA).

// The headers of the operators used, not ATen/ATen.h (every operator): the library builds in 21 s against 28 on 2 cores.
// The macro makes an include of ATen/ATen.h here an error.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "checks.h"
#include "simd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

namespace yoso {

constexpr float kDerivativeShrink = 0.99f;  // f' is evaluated at 0.99 x so 1/sqrt(1 - x^2) stays <= 7.1
constexpr double kPi = 3.14159265358979323846;

namespace {

constexpr int64_t kPrefetchAhead = 8;  // queries ahead whose key rows are prefetched

// An array of SIMD values. std::vector would ignore their 32-byte alignment (an attribute of the
// typedef), which the AVX2 code assumes, so this aligns its storage itself.
class FloatsBuffer {
 public:
  explicit FloatsBuffer(int64_t size) : storage_((size + 1) * kLanes) {
    const uintptr_t address = reinterpret_cast<uintptr_t>(storage_.data());
    data_ = reinterpret_cast<Floats*>((address + sizeof(Floats) - 1) / sizeof(Floats) * sizeof(Floats));
  }
  Floats* data() { return data_; }

 private:
  std::vector<float> storage_;
  Floats* data_;
};

// Asks the cache for the `size` floats at `row` (a hint: no fault, no effect on the results).
YOSO_INLINE void prefetch_row(const float* row, int64_t size) {
  for (int64_t k = 0; k < size; k += 16) __builtin_prefetch(row + k);
}

YOSO_INLINE void add_scaled(float* out, const float* x, float scale, int64_t size) {
  int64_t k = 0;
  for (; k + kLanes <= size; k += kLanes) store(out + k, load(out + k) + scale * load(x + k));
  for (; k < size; ++k) out[k] += scale * x[k];
}

YOSO_INLINE void copy(float* out, const float* x, int64_t size) {
  int64_t k = 0;
  for (; k + kLanes <= size; k += kLanes) store(out + k, load(x + k));
  for (; k < size; ++k) out[k] = x[k];
}

// All-ones lanes where `keep`, zeros elsewhere: selects by bits, so the unselected side may hold
// anything (a stale or never-written row), NaN included.
YOSO_INLINE Floats keep_if(Floats value, bool keep) {
  const Ints mask = Ints{} - static_cast<int32_t>(keep);
  return reinterpret_cast<Floats>(reinterpret_cast<Ints>(value) & mask);
}

// out = (keep ? out : 0) + x, without a branch: whether a bucket row was already started this hash
// is a coin flip at tau = log2 n, which a branch mispredicts half the time.
YOSO_INLINE void add_or_set(float* out, const float* x, bool keep, int64_t size) {
  int64_t k = 0;
  for (; k + kLanes <= size; k += kLanes) store(out + k, keep_if(load(out + k), keep) + load(x + k));
  for (; k < size; ++k) out[k] = (keep ? out[k] : 0.f) + x[k];
}

// out += (keep ? x : 0), without a branch (x may hold anything where !keep).
YOSO_INLINE void add_if(float* out, const float* x, bool keep, int64_t size) {
  int64_t k = 0;
  for (; k + kLanes <= size; k += kLanes) store(out + k, load(out + k) + keep_if(load(x + k), keep));
  for (; k < size; ++k) out[k] += keep ? x[k] : 0.f;
}


// table (rows x channels) += outer(rows_weights, values): the sum kw_j v_j^T of a crowded bucket.
YOSO_INLINE void add_outer(float* table, const float* weights, const float* values, int64_t rows, int64_t channels) {
  for (int64_t w = 0; w < rows; ++w) add_scaled(table + w * channels, values, weights[w], channels);
}

// out (channels) += weights^T table: a query contracting a bucket's table.
YOSO_INLINE void add_contracted(float* out, const float* weights, const float* table, int64_t rows, int64_t channels) {
  for (int64_t w = 0; w < rows; ++w) add_scaled(out, table + w * channels, weights[w], channels);
}

// `codes` made contiguous, after rejecting a code outside [0, 2^hash_bits): the slots below are
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
  TORCH_CHECK_VALUE(codes.size(1) <= std::numeric_limits<int32_t>::max(), "the CPU kernels take at most 2^31 - 1 rows ",
                    "per batch row, ", name, " has ", codes.size(1));
  return codes;
}

at::Tensor as_float(const at::Tensor& tensor) { return tensor.to(at::kFloat).contiguous(); }

// The codes of one batch row, (length, hashes), transposed to (hashes, length) so that one hash's
// codes are contiguous; padded rows get -1. Blocks of kLanes rows, so each hash's codes are
// written kLanes at a time.
YOSO_INLINE void transpose_codes(const int32_t* codes, const bool* mask, int64_t length, int64_t num_hashes,
                                 int32_t* out) {
  int64_t j0 = 0;
  for (; j0 + kLanes <= length; j0 += kLanes) {
    for (int64_t h = 0; h < num_hashes; ++h) {
      for (int64_t l = 0; l < kLanes; ++l) out[h * length + j0 + l] = mask[j0 + l] ? codes[(j0 + l) * num_hashes + h] : -1;
    }
  }
  for (int64_t j = j0; j < length; ++j) {
    for (int64_t h = 0; h < num_hashes; ++h) out[h * length + j] = mask[j] ? codes[j * num_hashes + h] : -1;
  }
}

// The slots of the buckets of one (batch row, hash): the code itself when 2^tau is O(n) (a byte
// per code says whether a key has it), else an open-addressing table (linear probing, at most half
// full) of the codes the keys have. Either way a lookup is O(1) and memory linear in n.
class CodeSlots {
 public:
  CodeSlots(int64_t hash_bits, int64_t num_keys)
      : direct_((int64_t{1} << hash_bits) <= 4 * num_keys + 64), bits_(direct_ ? hash_bits : table_bits(num_keys)) {
    if (direct_) {
      filled_.assign(size(), 0);
    } else {
      codes_.assign(size(), -1);
    }
  }

  int64_t size() const { return int64_t{1} << bits_; }
  bool direct() const { return direct_; }

  void clear() {
    if (direct_) {
      std::fill(filled_.begin(), filled_.end(), 0);
    } else {
      std::fill(codes_.begin(), codes_.end(), -1);
    }
  }

  // The slot of a key's code, claimed on first sight (then `first` is set).
  YOSO_INLINE int64_t insert(int32_t code, bool& first) {
    if (direct_) {
      first = !filled_[code];
      filled_[code] = 1;
      return code;
    }
    int64_t slot = start(code);
    while (codes_[slot] != code && codes_[slot] != -1) slot = (slot + 1) & (size() - 1);
    first = codes_[slot] == -1;
    codes_[slot] = code;
    return slot;
  }

  YOSO_INLINE int64_t insert(int32_t code) {
    bool first;
    return insert(code, first);
  }

  // The slot of a query's code and whether a key has it (when not, a valid slot whose row holds
  // anything): branch-free with direct slots.
  YOSO_INLINE int64_t find_any(int32_t code, bool& found) const {
    if (direct_) {
      found = filled_[code];
      return code;
    }
    const int64_t slot = find(code);
    found = slot >= 0;
    return found ? slot : 0;
  }

  // The slot of a query's code, or -1 when no key has it.
  YOSO_INLINE int64_t find(int32_t code) const {
    if (direct_) return filled_[code] ? code : -1;
    for (int64_t slot = start(code);; slot = (slot + 1) & (size() - 1)) {
      if (codes_[slot] == code) return slot;
      if (codes_[slot] == -1) return -1;
    }
  }

 private:
  static int64_t table_bits(int64_t num_keys) {
    int64_t bits = 1;
    while ((int64_t{1} << bits) < 2 * num_keys) ++bits;
    return bits;
  }

  int64_t start(int32_t code) const {  // Fibonacci hashing: the top bits of code * 2^64 / phi
    return static_cast<int64_t>((static_cast<uint64_t>(code) * 0x9E3779B97F4A7C15ull) >> (64 - bits_));
  }

  bool direct_;
  int64_t bits_;
  std::vector<uint8_t> filled_;  // direct mode
  std::vector<int32_t> codes_;   // table mode
};

// Rows grouped by slot with a counting sort: the rows of slot s are order[start[s], start[s + 1]),
// in index order. The buffers are reused from one hash to the next.
struct Groups {
  std::vector<int32_t> start, order, next;
  int64_t largest = 0;  // rows in the largest group

  // slot_of[j] in [0, num_slots), or < 0 for a row in no group.
  YOSO_INLINE void build(const int32_t* slot_of, int64_t length, int64_t num_slots) {
    start.assign(num_slots + 1, 0);
    for (int64_t j = 0; j < length; ++j) {
      if (slot_of[j] >= 0) ++start[slot_of[j] + 1];
    }
    largest = 0;
    for (int64_t slot = 0; slot < num_slots; ++slot) {
      largest = std::max<int64_t>(largest, start[slot + 1]);
      start[slot + 1] += start[slot];
    }
    order.resize(start[num_slots]);
    next.assign(start.begin(), start.end() - 1);
    for (int64_t j = 0; j < length; ++j) {
      if (slot_of[j] >= 0) order[next[slot_of[j]]++] = static_cast<int32_t>(j);
    }
  }

  YOSO_INLINE int64_t size(int64_t slot) const { return start[slot + 1] - start[slot]; }
};

// The keys of one (batch row, hash) chained by slot, built in one pass over the keys: head[s] is
// the last key of slot s (-1: none) and next[j] the key before j in its slot, so a bucket is walked
// in decreasing key index; size[s] counts the keys of slot s.
struct KeyChains {
  std::vector<int32_t> head, next, size;
  int64_t largest = 0;  // keys in the largest bucket

  YOSO_INLINE void build(const int32_t* key_slot, int64_t length, int64_t num_slots) {
    head.assign(num_slots, -1);
    size.assign(num_slots, 0);
    next.resize(length);
    largest = 0;
    for (int64_t j = 0; j < length; ++j) {
      const int64_t slot = key_slot[j];
      if (slot < 0) continue;
      next[j] = head[slot];
      head[slot] = static_cast<int32_t>(j);
      largest = std::max<int64_t>(largest, ++size[slot]);
    }
  }
};

// ---------------------------------------------------------------------------------------------
// hash_codes

// The butterflies (a, b) -> (a + b, a - b) of up to three consecutive stages, in registers, on the
// coordinates in[e * half] (e < 2, 4 or 8) of half-width half, 2 half and 4 half; multiplied first
// by their signs when kSigned (exact: the signs are +-1); stored to out[e * half].
template <bool kSigned>
YOSO_INLINE void radix2(const Floats* in, Floats* out, int64_t h, const float* s) {
  Floats x0 = in[0], x1 = in[h];
  if (kSigned) {
    x0 *= s[0];
    x1 *= s[h];
  }
  out[0] = x0 + x1;
  out[h] = x0 - x1;
}

template <bool kSigned>
YOSO_INLINE void radix4(const Floats* in, Floats* out, int64_t h, const float* s) {
  Floats x0 = in[0], x1 = in[h], x2 = in[2 * h], x3 = in[3 * h];
  if (kSigned) {
    x0 *= s[0];
    x1 *= s[h];
    x2 *= s[2 * h];
    x3 *= s[3 * h];
  }
  const Floats a0 = x0 + x1, a1 = x0 - x1, a2 = x2 + x3, a3 = x2 - x3;
  out[0] = a0 + a2;
  out[2 * h] = a0 - a2;
  out[h] = a1 + a3;
  out[3 * h] = a1 - a3;
}

template <bool kSigned>
YOSO_INLINE void radix8(const Floats* in, Floats* out, int64_t h, const float* s) {
  Floats x0 = in[0], x1 = in[h], x2 = in[2 * h], x3 = in[3 * h], x4 = in[4 * h], x5 = in[5 * h], x6 = in[6 * h],
         x7 = in[7 * h];
  if (kSigned) {
    x0 *= s[0];
    x1 *= s[h];
    x2 *= s[2 * h];
    x3 *= s[3 * h];
    x4 *= s[4 * h];
    x5 *= s[5 * h];
    x6 *= s[6 * h];
    x7 *= s[7 * h];
  }
  const Floats a0 = x0 + x1, a1 = x0 - x1, a2 = x2 + x3, a3 = x2 - x3;
  const Floats a4 = x4 + x5, a5 = x4 - x5, a6 = x6 + x7, a7 = x6 - x7;
  const Floats b0 = a0 + a2, b2 = a0 - a2, b1 = a1 + a3, b3 = a1 - a3;
  const Floats b4 = a4 + a6, b6 = a4 - a6, b5 = a5 + a7, b7 = a5 - a7;
  out[0] = b0 + b4;
  out[4 * h] = b0 - b4;
  out[h] = b1 + b5;
  out[5 * h] = b1 - b5;
  out[2 * h] = b2 + b6;
  out[6 * h] = b2 - b6;
  out[3 * h] = b3 + b7;
  out[7 * h] = b3 - b7;
}

// One pass: `stages` (1 to 3) stages from half-width `half` over the whole width.
template <bool kSigned>
YOSO_INLINE void hadamard_pass(const Floats* in, Floats* out, int64_t width, int64_t half, int stages, const float* s) {
  for (int64_t block = 0; block < width; block += half << stages) {
    for (int64_t j = block; j < block + half; ++j) {
      if (stages == 3) {
        radix8<kSigned>(in + j, out + j, half, s + j);
      } else if (stages == 2) {
        radix4<kSigned>(in + j, out + j, half, s + j);
      } else {
        radix2<kSigned>(in + j, out + j, half, s + j);
      }
    }
  }
}

// x = H (signs * in) for each lane: H the unnormalised Walsh-Hadamard transform of a power-of-two
// width, its butterflies (a, b) -> (a + b, a - b) in stages of half-width 1, 2, 4, ... (the order
// of the CUDA kernel), three stages per pass; `in` may be `x`. A width known at compile time
// (kWidth > 0) unrolls the passes.
template <int64_t kWidth>
YOSO_INLINE void signed_hadamard(const Floats* in, Floats* x, int64_t runtime_width, const float* signs) {
  const int64_t width = kWidth > 0 ? kWidth : runtime_width;
  if (width == 1) {
    x[0] = in[0] * signs[0];
    return;
  }
  // The first pass touches every coordinate once: it applies the signs.
  int64_t half = 1;
  int stages = width >= 8 ? 3 : width == 4 ? 2 : 1;
  hadamard_pass<true>(in, x, width, half, stages, signs);
  for (half <<= stages; half < width; half <<= stages) {
    stages = half * 8 <= width ? 3 : half * 4 <= width ? 2 : 1;
    hadamard_pass<false>(x, x, width, half, stages, signs);
  }
}

struct HashArgs {
  const float* vectors;  // (B, n, d)
  const float* signs;    // (B, 3, rotations, width)
  int32_t* codes;        // (B, n, m)
  int64_t length, dim, rotations, width, per_rotation, num_hashes, hash_bits;
};

// The codes of vectors [first, first + count) (count <= kLanes) of batch row b. `source` and `x`
// hold width lane-major coordinates each.
template <int64_t kWidth>
YOSO_INLINE void hash_lanes(const HashArgs& a, int64_t b, int64_t first, int64_t count, Floats* source, Floats* x) {
  const float* vectors = a.vectors + (b * a.length + first) * a.dim;
  std::fill(source, source + a.width, Floats{});  // pad(v), and zero lanes past `count` (written nowhere)
  for (int64_t lane = 0; lane < count; ++lane) {
    for (int64_t k = 0; k < a.dim; ++k) source[k][lane] = vectors[lane * a.dim + k];
  }
  for (int64_t r = 0; r < a.rotations && r * a.per_rotation < a.num_hashes; ++r) {
    for (int64_t step = 0; step < 3; ++step) {
      signed_hadamard<kWidth>(step == 0 ? source : x, x, a.width, a.signs + ((b * 3 + step) * a.rotations + r) * a.width);
    }
    for (int64_t t = 0; t < a.per_rotation && r * a.per_rotation + t < a.num_hashes; ++t) {
      Ints code{};
      for (int64_t bit = 0; bit < a.hash_bits; ++bit) code |= (x[t * a.hash_bits + bit] > Floats{}) & (1 << bit);
      int32_t* out = a.codes + (b * a.length + first) * a.num_hashes + r * a.per_rotation + t;
      for (int64_t lane = 0; lane < count; ++lane) out[lane * a.num_hashes] = code[lane];
    }
  }
}

// hash_lanes unrolled for the common widths (d_pad = 8 ... 128).
YOSO_MULTIVERSIONED void hash_block(const HashArgs& a, int64_t b, int64_t first, int64_t count, Floats* source,
                                    Floats* x) {
  switch (a.width) {
    case 8: return hash_lanes<8>(a, b, first, count, source, x);
    case 16: return hash_lanes<16>(a, b, first, count, source, x);
    case 32: return hash_lanes<32>(a, b, first, count, source, x);
    case 64: return hash_lanes<64>(a, b, first, count, source, x);
    case 128: return hash_lanes<128>(a, b, first, count, source, x);
    default: return hash_lanes<0>(a, b, first, count, source, x);
  }
}

// ---------------------------------------------------------------------------------------------
// The cumulations

// One batch row's view of a side (queries or keys): its transposed codes and its rows.
struct Side {
  const int32_t* codes;  // (hashes, length), -1 for padded rows
  int64_t length;
};

// A thread's buffers for the cumulations, reused from one batch row and hash to the next.
struct Scratch {
  CodeSlots slots;
  KeyChains keys;
  Groups queries;  // a crowded bucket's queries
  std::vector<int32_t> key_slots, query_slots;  // hashed slots (table mode)
  const int32_t* query_slot = nullptr;          // after group_keys: each query's slot, < 0 for none
  std::vector<int32_t> query_count;             // queries per slot
  std::vector<int32_t> query_codes, key_codes;  // transposed codes of the batch row
  std::vector<float> key_table, query_table;    // lsh_cumulation's table; a crowded bucket's outer-product sums

  Scratch(int64_t hash_bits, int64_t num_queries, int64_t num_keys, int64_t num_hashes)
      : slots(hash_bits, num_keys), query_codes(num_hashes * num_queries), key_codes(num_hashes * num_keys) {
    if (!slots.direct()) {
      key_slots.resize(num_keys);
      query_slots.resize(num_queries);
    }
  }

  // The codes of batch row b, transposed; returns the sides.
  std::pair<Side, Side> load_codes(const at::Tensor& q_codes, const at::Tensor& q_mask, const at::Tensor& k_codes,
                                   const at::Tensor& k_mask, int64_t b) {
    const int64_t num_queries = q_codes.size(1), num_keys = k_codes.size(1), num_hashes = q_codes.size(2);
    transpose_codes(q_codes.data_ptr<int32_t>() + b * num_queries * num_hashes, q_mask.data_ptr<bool>() + b * num_queries,
                    num_queries, num_hashes, query_codes.data());
    transpose_codes(k_codes.data_ptr<int32_t>() + b * num_keys * num_hashes, k_mask.data_ptr<bool>() + b * num_keys,
                    num_keys, num_hashes, key_codes.data());
    return {Side{query_codes.data(), num_queries}, Side{key_codes.data(), num_keys}};
  }

  // Hash h: the keys chained by slot, and query_slot. With direct slots the codes are the slots (a
  // code no key has is an empty chain).
  YOSO_INLINE void group_keys(Side queries, Side keys, int64_t h) {
    const int32_t* key_codes_h = keys.codes + h * keys.length;
    const int32_t* query_codes_h = queries.codes + h * queries.length;
    if (slots.direct()) {
      this->keys.build(key_codes_h, keys.length, slots.size());
      query_slot = query_codes_h;
      return;
    }
    slots.clear();
    for (int64_t j = 0; j < keys.length; ++j) key_slots[j] = key_codes_h[j] < 0 ? -1 : slots.insert(key_codes_h[j]);
    this->keys.build(key_slots.data(), keys.length, slots.size());
    for (int64_t i = 0; i < queries.length; ++i) query_slots[i] = query_codes_h[i] < 0 ? -1 : slots.find(query_codes_h[i]);
    query_slot = query_slots.data();
  }

  // Queries per slot, for the crowded-bucket test.
  YOSO_INLINE void count_queries(int64_t num_queries) {
    query_count.assign(slots.size(), 0);
    for (int64_t i = 0; i < num_queries; ++i) {
      if (query_slot[i] >= 0) ++query_count[query_slot[i]];
    }
  }
};

// The first key of query i's bucket (-1 for none, or past the end): the rows to prefetch.
YOSO_INLINE int64_t first_key(const Scratch& s, int64_t i, int64_t num_queries) {
  if (i >= num_queries || s.query_slot[i] < 0) return -1;
  return s.keys.head[s.query_slot[i]];
}

struct CumulationArgs {
  const float* values;  // (B, nk, c)
  float* out;           // (B, nq, c)
  int64_t num_queries, num_keys, num_hashes, channels;
};

// out_i = (1/m) sum_h table_h[slot of q_h(i)], table_h[s] = sum of the values of the keys in slot s:
// per hash, one pass over the keys builds the table (a slot's first key sets its row, so the table
// is never zeroed) and one over the queries reads it. One hash at a time: the time goes to the
// table's scattered rows, so the table must stay as small as one hash's. Building four hashes'
// tables in one pass over the rows, to read the values and the output once per four hashes, took
// 1.5-2.9x longer at n >= 8192 (torch.ops.yoso.lsh_cumulation on random codes, batch 2, one thread,
// on the 2-core AMD EPYC VM against the kernels of commit c2f8313; reported in commit d4ad420,
// 2026-11-23, results/README.md's kernels_cpu section), so it was dropped.
template <int64_t kC>  // a row width known at compile time (> 0) unrolls its loops
YOSO_INLINE void cumulate_rows(const CumulationArgs& a, int64_t b, Side queries, Side keys, Scratch& s) {
  const int64_t c = kC > 0 ? kC : a.channels;
  const float* values = a.values + b * a.num_keys * c;
  float* out = a.out + b * a.num_queries * c;
  s.key_table.resize(s.slots.size() * c);
  float* table = s.key_table.data();
  for (int64_t h = 0; h < a.num_hashes; ++h) {
    const int32_t* key_codes = keys.codes + h * keys.length;
    const int32_t* query_codes = queries.codes + h * queries.length;
    s.slots.clear();
    for (int64_t j = 0; j < keys.length; ++j) {
      if (key_codes[j] < 0) continue;
      bool first;
      const int64_t slot = s.slots.insert(key_codes[j], first);
      add_or_set(table + slot * c, values + j * c, !first, c);
    }
    for (int64_t i = 0; i < queries.length; ++i) {
      if (query_codes[i] < 0) continue;
      bool found;
      const int64_t slot = s.slots.find_any(query_codes[i], found);
      add_if(out + i * c, table + slot * c, found, c);
    }
  }
  scale(out, 1.f / static_cast<float>(a.num_hashes), a.num_queries * c);
}

YOSO_MULTIVERSIONED void cumulate_batch_row(const CumulationArgs& a, int64_t b, Side queries, Side keys, Scratch& s) {
  if (a.channels == 32) return cumulate_rows<32>(a, b, queries, keys, s);
  if (a.channels == 64) return cumulate_rows<64>(a, b, queries, keys, s);
  cumulate_rows<0>(a, b, queries, keys, s);
}

// The weighted cumulations, one side or both. Pair weights s_ij = qw_i . kw_j over the colliding
// pairs of every hash:
//   query_out_i = (1/m) sum_h sum_j [collide] s_ij key_values_j                (lsh_weighted_cumulation)
//   key_out_j   = (1/m) sum_h sum_i [collide] s_ij query_values_i   (also, in lsh_weighted_cumulation_both)
// Both sides come from one pass over the pairs (YOSO's lower-bound grad Q and grad K share s_ij).
// A bucket with nq queries and nk keys costs nq nk (w + qc + kc) by pairs and (nq + nk) w (qc + kc)
// through the tables sum_j kw_j key_values_j^T and sum_i qw_i query_values_i^T; the tables are used
// where they are cheaper (crowded buckets, small tau). The queries are counted per bucket only in a
// hash where some bucket is large enough for that. One side is the case qc = 0.
struct PairArgs {
  const float *query_weights, *query_values, *key_weights, *key_values;  // query_values: both sides only
  float *query_out, *key_out;                                           // key_out: both sides only
  int64_t num_queries, num_keys, num_hashes, width, query_channels, key_channels;
};

template <bool kBothSides, int64_t kW, int64_t kQC, int64_t kKC>  // widths known at compile time (> 0) unroll loops
YOSO_INLINE void pair_rows(const PairArgs& a, int64_t b, Side queries, Side keys, Scratch& s) {
  const int64_t w = kW > 0 ? kW : a.width, kc = kKC > 0 ? kKC : a.key_channels;
  const int64_t qc = !kBothSides ? 0 : kQC > 0 ? kQC : a.query_channels;
  const float* qw = a.query_weights + b * a.num_queries * w;
  const float* qv = kBothSides ? a.query_values + b * a.num_queries * qc : nullptr;
  const float* kw = a.key_weights + b * a.num_keys * w;
  const float* kv = a.key_values + b * a.num_keys * kc;
  float* query_out = a.query_out + b * a.num_queries * kc;
  float* key_out = kBothSides ? a.key_out + b * a.num_keys * qc : nullptr;
  const auto crowded = [&](int64_t nq, int64_t nk) { return nq * nk * (w + qc + kc) > (nq + nk) * w * (qc + kc); };
  for (int64_t h = 0; h < a.num_hashes; ++h) {
    s.group_keys(queries, keys, h);
    const bool may_crowd = s.keys.largest * (w + qc + kc) > w * (qc + kc);
    if (may_crowd) s.count_queries(queries.length);
    bool any_crowded = false;
    for (int64_t i = 0; i < queries.length; ++i) {
      const int64_t ahead = first_key(s, i + kPrefetchAhead, queries.length);
      if (ahead >= 0) {
        prefetch_row(kw + ahead * w, w);
        prefetch_row(kv + ahead * kc, kc);
        if constexpr (kBothSides) prefetch_row(key_out + ahead * qc, qc);
      }
      const int64_t slot = s.query_slot[i];
      if (slot < 0 || s.keys.head[slot] < 0) continue;
      if (may_crowd && crowded(s.query_count[slot], s.keys.size[slot])) {
        any_crowded = true;
        continue;
      }
      float local[kKC > 0 ? kKC : 1];  // a fixed-width output row is accumulated in registers
      float* row = kKC > 0 ? local : query_out + i * kc;
      if (kKC > 0) copy(row, query_out + i * kc, kc);
      for (int64_t j = s.keys.head[slot]; j >= 0; j = s.keys.next[j]) {
        const float weight = dot(qw + i * w, kw + j * w, w);
        add_scaled(row, kv + j * kc, weight, kc);
        if constexpr (kBothSides) add_scaled(key_out + j * qc, qv + i * qc, weight, qc);
      }
      if (kKC > 0) copy(query_out + i * kc, row, kc);
    }
    if (!any_crowded) continue;
    s.queries.build(s.query_slot, queries.length, s.slots.size());
    s.key_table.resize(w * kc);
    s.query_table.resize(w * qc);
    for (int64_t slot = 0; slot < s.slots.size(); ++slot) {
      if (s.query_count[slot] == 0 || !crowded(s.query_count[slot], s.keys.size[slot])) continue;
      std::fill(s.key_table.begin(), s.key_table.end(), 0.f);
      for (int64_t j = s.keys.head[slot]; j >= 0; j = s.keys.next[j]) {
        add_outer(s.key_table.data(), kw + j * w, kv + j * kc, w, kc);
      }
      for (int64_t e = s.queries.start[slot]; e < s.queries.start[slot + 1]; ++e) {
        const int64_t i = s.queries.order[e];
        add_contracted(query_out + i * kc, qw + i * w, s.key_table.data(), w, kc);
      }
      if constexpr (!kBothSides) continue;
      std::fill(s.query_table.begin(), s.query_table.end(), 0.f);
      for (int64_t e = s.queries.start[slot]; e < s.queries.start[slot + 1]; ++e) {
        const int64_t i = s.queries.order[e];
        add_outer(s.query_table.data(), qw + i * w, qv + i * qc, w, qc);
      }
      for (int64_t j = s.keys.head[slot]; j >= 0; j = s.keys.next[j]) {
        add_contracted(key_out + j * qc, kw + j * w, s.query_table.data(), w, qc);
      }
    }
  }
  scale(query_out, 1.f / static_cast<float>(a.num_hashes), a.num_queries * kc);
  if constexpr (kBothSides) scale(key_out, 1.f / static_cast<float>(a.num_hashes), a.num_keys * qc);
}

template <bool kBothSides>
YOSO_MULTIVERSIONED void pair_batch_row(const PairArgs& a, int64_t b, Side queries, Side keys, Scratch& s) {
  const int64_t d = a.width;
  const bool same = d == a.key_channels && (!kBothSides || d == a.query_channels);
  if (same && d == 32) return pair_rows<kBothSides, 32, 32, 32>(a, b, queries, keys, s);
  if (same && d == 64) return pair_rows<kBothSides, 64, 64, 64>(a, b, queries, keys, s);
  pair_rows<kBothSides, 0, 0, 0>(a, b, queries, keys, s);
}

struct CollidedArgs {
  const int32_t *query_codes, *key_codes;  // (B, n, m), as given
  const float *query_vectors, *query_weights, *key_vectors, *key_weights;
  float* out;
  int64_t num_queries, num_keys, num_hashes, dim, width, hash_bits;
};

// x^n for an integer n >= 0, by squaring.
YOSO_INLINE float integer_power(float x, int64_t n) {
  float result = 1.f;
  for (; n > 0; n >>= 1, x *= x) {
    if (n & 1) result *= x;
  }
  return result;
}

// Whether the code rows a and b agree in one of the hashes before h.
YOSO_INLINE bool collided_before(const int32_t* a, const int32_t* b, int64_t h) {
  for (int64_t g = 0; g < h; ++g) {
    if (a[g] == b[g]) return true;
  }
  return false;
}

// out_i = sum_{j in U(i)} (qw_i . kw_j) f'(0.99 qv_i . kv_j) kv_j, each colliding pair counted in
// the first hash where it collides.
template <int64_t kD, int64_t kW>  // row widths known at compile time (> 0) unroll their loops
YOSO_INLINE void collided_rows(const CollidedArgs& a, int64_t b, Side queries, Side keys, Scratch& s) {
  const int64_t d = kD > 0 ? kD : a.dim, w = kW > 0 ? kW : a.width, m = a.num_hashes;
  const int32_t* query_codes = a.query_codes + b * a.num_queries * m;
  const int32_t* key_codes = a.key_codes + b * a.num_keys * m;
  const float* qv = a.query_vectors + b * a.num_queries * d;
  const float* qw = a.query_weights + b * a.num_queries * w;
  const float* kv = a.key_vectors + b * a.num_keys * d;
  const float* kw = a.key_weights + b * a.num_keys * w;
  float* out = a.out + b * a.num_queries * d;
  const float tau = static_cast<float>(a.hash_bits), pi = static_cast<float>(kPi);
  for (int64_t h = 0; h < m; ++h) {
    s.group_keys(queries, keys, h);
    for (int64_t i = 0; i < queries.length; ++i) {
      const int64_t ahead = first_key(s, i + kPrefetchAhead, queries.length);
      if (ahead >= 0) {
        prefetch_row(kv + ahead * d, d);
        prefetch_row(kw + ahead * w, w);
      }
      const int64_t slot = s.query_slot[i];
      if (slot < 0 || s.keys.head[slot] < 0) continue;
      float local[kD > 0 ? kD : 1];  // a fixed-width output row is accumulated in registers
      float* row = kD > 0 ? local : out + i * d;
      if (kD > 0) copy(row, out + i * d, d);
      for (int64_t j = s.keys.head[slot]; j >= 0; j = s.keys.next[j]) {
        if (collided_before(query_codes + i * m, key_codes + j * m, h)) continue;
        const float x = kDerivativeShrink * dot(qv + i * d, kv + j * d, d);
        const float p = 1.f - std::acos(x) / pi;
        const float derivative = tau * integer_power(p, a.hash_bits - 1) / (pi * std::sqrt(1.f - x * x));
        add_scaled(row, kv + j * d, dot(qw + i * w, kw + j * w, w) * derivative, d);
      }
      if (kD > 0) copy(out + i * d, row, d);
    }
  }
}

YOSO_MULTIVERSIONED void collided_batch_row(const CollidedArgs& a, int64_t b, Side queries, Side keys, Scratch& s) {
  if (a.dim == a.width && a.dim == 32) return collided_rows<32, 32>(a, b, queries, keys, s);
  if (a.dim == a.width && a.dim == 64) return collided_rows<64, 64>(a, b, queries, keys, s);
  collided_rows<0, 0>(a, b, queries, keys, s);
}

}  // namespace

at::Tensor hash_codes_cpu(const at::Tensor& vectors, const at::Tensor& signs, int64_t num_hashes, int64_t hash_bits) {
  check_hash_codes_args(vectors, signs, num_hashes, hash_bits);
  const int64_t batch = vectors.size(0), length = vectors.size(1);
  const at::Tensor x_all = as_float(vectors);
  const at::Tensor s_all = signs.contiguous();
  at::Tensor out = at::empty({batch, length, num_hashes}, vectors.options().dtype(at::kInt));
  const HashArgs args{x_all.data_ptr<float>(), s_all.data_ptr<float>(), out.data_ptr<int32_t>(), length, vectors.size(2),
                      signs.size(2), signs.size(3), signs.size(3) / hash_bits, num_hashes, hash_bits};
  const int64_t blocks_per_row = (length + kLanes - 1) / kLanes;
  at::parallel_for(0, batch * blocks_per_row, 16, [&](int64_t begin, int64_t end) {
    FloatsBuffer source(args.width), x(args.width);
    for (int64_t block = begin; block < end; ++block) {
      const int64_t b = block / blocks_per_row, first = (block % blocks_per_row) * kLanes;
      hash_block(args, b, first, std::min(kLanes, length - first), source.data(), x.data());
    }
  });
  return out;
}

at::Tensor lsh_cumulation_cpu(const at::Tensor& query_codes, const at::Tensor& query_mask,
                              const at::Tensor& key_codes, const at::Tensor& key_mask, const at::Tensor& values,
                              int64_t hash_bits) {
  check_cumulation_args(query_codes, query_mask, key_codes, key_mask, values, hash_bits);
  const int64_t batch = query_codes.size(0), num_queries = query_codes.size(1), num_keys = key_codes.size(1);
  const int64_t num_hashes = query_codes.size(2), channels = values.size(2);
  const at::Tensor q_codes = checked_codes(query_codes, "query_codes", hash_bits);
  const at::Tensor k_codes = checked_codes(key_codes, "key_codes", hash_bits);
  const at::Tensor q_mask = query_mask.contiguous(), k_mask = key_mask.contiguous(), v = as_float(values);
  at::Tensor out = at::zeros({batch, num_queries, channels}, values.options().dtype(at::kFloat));
  const CumulationArgs args{v.data_ptr<float>(), out.data_ptr<float>(), num_queries, num_keys, num_hashes, channels};
  at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch(hash_bits, num_queries, num_keys, num_hashes);
    for (int64_t b = begin; b < end; ++b) {
      const auto [queries, keys] = scratch.load_codes(q_codes, q_mask, k_codes, k_mask, b);
      cumulate_batch_row(args, b, queries, keys, scratch);
    }
  });
  return out;
}

at::Tensor lsh_weighted_cumulation_cpu(const at::Tensor& query_codes, const at::Tensor& query_mask,
                                       const at::Tensor& query_weights, const at::Tensor& key_codes,
                                       const at::Tensor& key_mask, const at::Tensor& key_weights,
                                       const at::Tensor& values, int64_t hash_bits) {
  check_weighted_args(query_codes, query_mask, query_weights, key_codes, key_mask, key_weights, values, hash_bits);
  const int64_t batch = query_codes.size(0), num_queries = query_codes.size(1), num_keys = key_codes.size(1);
  const int64_t num_hashes = query_codes.size(2), width = query_weights.size(2), channels = values.size(2);
  const at::Tensor q_codes = checked_codes(query_codes, "query_codes", hash_bits);
  const at::Tensor k_codes = checked_codes(key_codes, "key_codes", hash_bits);
  const at::Tensor q_mask = query_mask.contiguous(), k_mask = key_mask.contiguous();
  const at::Tensor qw = as_float(query_weights), kw = as_float(key_weights), v = as_float(values);
  at::Tensor out = at::zeros({batch, num_queries, channels}, values.options().dtype(at::kFloat));
  const PairArgs args{qw.data_ptr<float>(), nullptr, kw.data_ptr<float>(), v.data_ptr<float>(), out.data_ptr<float>(),
                      nullptr, num_queries, num_keys, num_hashes, width, 0, channels};
  at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch(hash_bits, num_queries, num_keys, num_hashes);
    for (int64_t b = begin; b < end; ++b) {
      const auto [queries, keys] = scratch.load_codes(q_codes, q_mask, k_codes, k_mask, b);
      pair_batch_row<false>(args, b, queries, keys, scratch);
    }
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> lsh_weighted_cumulation_both_cpu(
    const at::Tensor& query_codes, const at::Tensor& query_mask, const at::Tensor& query_weights,
    const at::Tensor& query_values, const at::Tensor& key_codes, const at::Tensor& key_mask,
    const at::Tensor& key_weights, const at::Tensor& key_values, int64_t hash_bits) {
  check_weighted_both_args(query_codes, query_mask, query_weights, query_values, key_codes, key_mask,
                           key_weights, key_values, hash_bits);
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
  const PairArgs args{qw.data_ptr<float>(), qv.data_ptr<float>(), kw.data_ptr<float>(), kv.data_ptr<float>(),
                      query_out.data_ptr<float>(), key_out.data_ptr<float>(), num_queries, num_keys, num_hashes,
                      width, query_channels, key_channels};
  at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch(hash_bits, num_queries, num_keys, num_hashes);
    for (int64_t b = begin; b < end; ++b) {
      const auto [queries, keys] = scratch.load_codes(q_codes, q_mask, k_codes, k_mask, b);
      pair_batch_row<true>(args, b, queries, keys, scratch);
    }
  });
  return {query_out, key_out};
}

at::Tensor lsh_collided_gradient_cpu(const at::Tensor& query_codes, const at::Tensor& query_mask,
                                     const at::Tensor& query_vectors, const at::Tensor& query_weights,
                                     const at::Tensor& key_codes, const at::Tensor& key_mask,
                                     const at::Tensor& key_vectors, const at::Tensor& key_weights, int64_t hash_bits) {
  check_pair_args(query_codes, query_mask, query_vectors, query_weights, key_codes, key_mask, key_vectors, key_weights,
                  hash_bits);
  const int64_t batch = query_codes.size(0), num_queries = query_codes.size(1), num_keys = key_codes.size(1);
  const int64_t num_hashes = query_codes.size(2), dim = query_vectors.size(2), width = query_weights.size(2);
  const at::Tensor q_codes = checked_codes(query_codes, "query_codes", hash_bits);
  const at::Tensor k_codes = checked_codes(key_codes, "key_codes", hash_bits);
  const at::Tensor q_mask = query_mask.contiguous(), k_mask = key_mask.contiguous();
  const at::Tensor qv = as_float(query_vectors), kv = as_float(key_vectors);
  const at::Tensor qw = as_float(query_weights), kw = as_float(key_weights);
  at::Tensor out = at::zeros({batch, num_queries, dim}, query_vectors.options().dtype(at::kFloat));
  const CollidedArgs args{q_codes.data_ptr<int32_t>(), k_codes.data_ptr<int32_t>(), qv.data_ptr<float>(),
                          qw.data_ptr<float>(), kv.data_ptr<float>(), kw.data_ptr<float>(), out.data_ptr<float>(),
                          num_queries, num_keys, num_hashes, dim, width, hash_bits};
  at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch(hash_bits, num_queries, num_keys, num_hashes);
    for (int64_t b = begin; b < end; ++b) {
      const auto [queries, keys] = scratch.load_codes(q_codes, q_mask, k_codes, k_mask, b);
      collided_batch_row(args, b, queries, keys, scratch);
    }
  });
  return out;
}

// YOSO's lower-bound backward (yoso_cuda/attention.py) in one op, with query vectors q, query weights
// g (the output's gradient), key vectors k and key weights v (the values):
//   grad q_i = (tau/2) (1/m) sum_h sum_j [collide] (g_i . v_j) k_j,
//   grad k_j = (tau/2) (1/m) sum_h sum_i [collide] (g_i . v_j) q_i,
//   grad v_j = (1/m) sum_h sum_i [collide] g_i.
// On the CPU it composes the ops above; the CUDA kernel shares their index, tables and lookups.
std::tuple<at::Tensor, at::Tensor, at::Tensor> lsh_lower_bound_gradients_cpu(
    const at::Tensor& query_codes, const at::Tensor& query_mask, const at::Tensor& query_vectors,
    const at::Tensor& query_weights, const at::Tensor& key_codes, const at::Tensor& key_mask,
    const at::Tensor& key_vectors, const at::Tensor& key_weights, int64_t hash_bits) {
  check_pair_args(query_codes, query_mask, query_vectors, query_weights, key_codes, key_mask, key_vectors, key_weights,
                  hash_bits);
  auto [grad_queries, grad_keys] = lsh_weighted_cumulation_both_cpu(
      query_codes, query_mask, query_weights, query_vectors, key_codes, key_mask, key_weights, key_vectors, hash_bits);
  at::Tensor grad_key_weights = lsh_cumulation_cpu(key_codes, key_mask, query_codes, query_mask, query_weights, hash_bits);
  const double half_tau = static_cast<double>(hash_bits) / 2.0;
  return {grad_queries.mul_(half_tau), grad_keys.mul_(half_tau), grad_key_weights};
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
  m.def(
      "lsh_lower_bound_gradients(Tensor query_codes, Tensor query_mask, Tensor query_vectors, Tensor query_weights, "
      "Tensor key_codes, Tensor key_mask, Tensor key_vectors, Tensor key_weights, int hash_bits) -> "
      "(Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(yoso, CPU, m) {
  m.impl("hash_codes", &hash_codes_cpu);
  m.impl("lsh_cumulation", &lsh_cumulation_cpu);
  m.impl("lsh_weighted_cumulation", &lsh_weighted_cumulation_cpu);
  m.impl("lsh_weighted_cumulation_both", &lsh_weighted_cumulation_both_cpu);
  m.impl("lsh_collided_gradient", &lsh_collided_gradient_cpu);
  m.impl("lsh_lower_bound_gradients", &lsh_lower_bound_gradients_cpu);
}

}  // namespace yoso
