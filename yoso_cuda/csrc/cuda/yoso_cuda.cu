// CUDA kernels of the yoso ops (schemas and CPU kernels in ../yoso.cpp, argument checks shared
// with them in ../checks.h, semantics in yoso_cuda/reference.py).
//
// Every op here is deterministic: no floating-point atomics anywhere, every sum runs in a fixed
// order, so the same inputs give bitwise-identical outputs run after run, with or without
// at::globalContext().deterministicAlgorithms(); there is a single path. CI runs these kernels on
// the CPU under yoso_cuda/emulator in three schedules and with sanitizers.
//
// hash_codes keeps a vector's Hadamard transforms in registers up to width 256 (hash_codes_warp_kernel:
// a vector per warp, or per 2-16 lanes of one below width 32, its butterflies exchanged by warp
// shuffles), in one block's shared memory above (hash_codes_kernel); both give the CPU kernel's
// codes bit for bit.
//
// Every cumulation runs on a counting sort with direct lookup by default: per segment (batch row b,
// hash h) a table of 2^tau bucket ends and the real rows' indices in bucket order (bucket_index_kernel,
// one block per segment sorting 2048 rows at a time in shared memory, one launch for one side or for
// the queries and keys at once), sums or outer-product tables of the buckets too large to enumerate
// per lookup (one launch), then one warp per lookup row adds its bucket's contribution hash by hash
// and writes its output row whole (one launch): no host synchronisation, no device-wide sort, no
// binary search, no chunks, no zero fill of the outputs. For a tau too large for a
// table of 2^tau buckets (and under YOSO_CUDA_CUMULATION=radix) the radix-sort structure below
// takes over, processed a chunk of hashes at a time (memory linear in n):
//   0. a code outside [0, 2^tau) fails a device-side assertion (no host synchronisation);
//   1. per (batch row b, hash h) a segment of nk sort keys ((segment << (tau + 1)) | code), padded
//      keys carrying bit tau so that they sort last in their segment and match no query;
//   2. one stable CUB radix sort of all segments of the chunk (keys ascending, key index as value):
//      each occupied bucket becomes a contiguous range of sorted positions, keys in index order;
//   3. one warp per real query binary-searches its bucket in each hash of the chunk and owns its
//      output row, adding the hashes' contributions in hash order.
// The weighted cumulations and lsh_collided_gradient run one kernel body on either path, through a
// view of the indexed buckets (CountingBuckets, RadixBuckets). lsh_cumulation pre-sums heavy buckets
// (pieces of at most kPiece sorted keys on the radix path); lsh_weighted_cumulation enumerates
// colliding pairs in light buckets and contracts the query weights with a per-bucket sum of
// kw (x) v outer products in heavy ones; lsh_weighted_cumulation_both runs that for both directions
// in the same launches, and lsh_lower_bound_gradients (YOSO's whole lower-bound backward) adds grad V
// to the key direction's lookups; lsh_collided_gradient enumerates pairs, keeping a pair only in the
// first hash where it collides.

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>  // at::cuda::getCurrentCUDAStream, without ATen/cuda/CUDAContext.h's cuBLAS/cuSPARSE headers
#include <torch/library.h>

#include "../checks.h"

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace yoso {
namespace {

using key_t = unsigned long long;

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpsPerBlock = 8;
constexpr int kBlock = kWarp * kWarpsPerBlock;  // 256 threads
constexpr int kLaneColumns = 4;                  // output columns per lane held in registers: 128-column tiles
constexpr int kTileColumns = kWarp * kLaneColumns;
constexpr int kPiece = 64;                       // sorted keys per partial bucket sum (lsh_cumulation)
constexpr int kHeavyMin = 32;                    // buckets of at most this many keys are always enumerated
static_assert(kHeavyMin <= kWarp, "bucket_lookup_kernel enumerates a light bucket in one pass of the warp");
constexpr int64_t kCountingMinBuckets = 4096;    // the counting sort's bucket table may always have this many entries
constexpr int kTableOutputs = 4 * kBlock;        // outer-product table entries per block (4 per thread)
constexpr int64_t kTableFloatsPerRow = 4;        // heavy-bucket tables: at most this many floats per indexed row and hash
constexpr int kMaxWidth = 8192;                  // largest Hadamard width (shared memory of one block)
constexpr int64_t kDefaultChunkBytes = int64_t(256) << 20;  // scratch of one chunk of hashes
constexpr float kShrink = 0.99f;  // f' evaluated at 0.99 x, as reference.DERIVATIVE_SHRINK
constexpr float kPi = 3.14159265358979323846f;

// ---------------------------------------------------------------------------------------------
// Device helpers

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

__device__ __forceinline__ float warp_sum(float value) {
  // xor butterfly: lanes l and l^o add the same two numbers (commutatively), so every lane ends
  // with the bitwise-identical sum.
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) {
    value += __shfl_xor_sync(kFullMask, value, offset);
  }
  return value;
}

// First position in [lo, hi) whose key is >= key (hi when none).
__device__ __forceinline__ int64_t lower_bound_key(const key_t* __restrict__ keys, int64_t lo, int64_t hi, key_t key) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (keys[mid] < key) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// First position in [lo, hi) whose key is > key (hi when none).
__device__ __forceinline__ int64_t upper_bound_key(const key_t* __restrict__ keys, int64_t lo, int64_t hi, key_t key) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (keys[mid] <= key) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// The sort key of code `code` in segment `segment`: the code's low tau bits, bit tau clear (set
// only for padded keys), the segment above.
__device__ __forceinline__ key_t bucket_key(int64_t segment, int code, int hash_bits) {
  const unsigned code_mask = (1u << hash_bits) - 1u;
  return (static_cast<key_t>(segment) << (hash_bits + 1)) | static_cast<key_t>(static_cast<unsigned>(code) & code_mask);
}

// The bucket of query key `key` within the sorted segment [base, base + num_keys): relative
// positions [lo, hi); false when no real key has this code.
__device__ __forceinline__ bool find_bucket(const key_t* __restrict__ keys, int64_t base, int64_t num_keys, key_t key,
                                            int64_t& lo, int64_t& hi) {
  const key_t* segment = keys + base;
  lo = lower_bound_key(segment, 0, num_keys, key);
  if (lo == num_keys || segment[lo] != key) {
    return false;
  }
  hi = upper_bound_key(segment, lo + 1, num_keys, key);
  return true;
}

// ---------------------------------------------------------------------------------------------
// hash_codes

// threads_per_vector threads (a power of two) per vector, blockDim.x / threads_per_vector vectors
// per block, each with `width` floats of shared memory. For each used rotation r:
// x = pad(v) * s0, H, * s1, H, * s2, H (H the in-place unnormalised Walsh-Hadamard transform, stages
// of half-length 1, 2, 4, ..., each butterfly (a, b) -> (a + b, a - b), rounded float32 ops that are
// never fused), then hash g = r * per_rotation + t packs bits x[t * tau + i] > 0.
template <typename scalar_t>
__global__ void __launch_bounds__(kBlock) hash_codes_kernel(
    const scalar_t* __restrict__ vectors, const float* __restrict__ signs, int* __restrict__ codes,
    int64_t num_vectors, int64_t length, int dim, int width, int rotations, int rotations_used, int per_rotation,
    int num_hashes, int hash_bits, int threads_per_vector) {
  extern __shared__ float shared[];
  const int vectors_per_block = blockDim.x / threads_per_vector;
  const int slot = threadIdx.x / threads_per_vector;
  const int lane = threadIdx.x % threads_per_vector;
  const int64_t vec = static_cast<int64_t>(blockIdx.x) * vectors_per_block + slot;
  const bool valid = vec < num_vectors;
  // Threads past the last vector run the same loops (they take part in every __syncthreads) on
  // zeros and batch row 0, and write nothing.
  const int64_t batch = valid ? vec / length : 0;
  const scalar_t* v = vectors + (valid ? vec : 0) * dim;
  float* x = shared + static_cast<int64_t>(slot) * width;
  const int half_width = width / 2;

  for (int r = 0; r < rotations_used; ++r) {
    for (int step = 0; step < 3; ++step) {
      const float* s = signs + ((batch * 3 + step) * rotations + r) * static_cast<int64_t>(width);
      for (int e = lane; e < width; e += threads_per_vector) {
        const float value = step == 0 ? ((valid && e < dim) ? static_cast<float>(v[e]) : 0.0f) : x[e];
        x[e] = __fmul_rn(value, s[e]);
      }
      __syncthreads();
      for (int half = 1; half < width; half <<= 1) {
        for (int k = lane; k < half_width; k += threads_per_vector) {
          const int i = ((k & ~(half - 1)) << 1) | (k & (half - 1));
          const float a = x[i];
          const float b = x[i + half];
          x[i] = __fadd_rn(a, b);
          x[i + half] = __fsub_rn(a, b);
        }
        __syncthreads();
      }
    }
    for (int t = lane; t < per_rotation; t += threads_per_vector) {
      const int g = r * per_rotation + t;
      if (valid && g < num_hashes) {
        unsigned code = 0;
        for (int i = 0; i < hash_bits; ++i) {
          code |= (x[t * hash_bits + i] > 0.0f ? 1u : 0u) << i;
        }
        codes[vec * num_hashes + g] = static_cast<int>(code);
      }
    }
    __syncthreads();  // the next rotation overwrites x
  }
}

// hash_codes in registers, for widths up to kWarp * kMaxPerLane: a vector per `lanes` threads of one
// warp (lanes = min(width, 32)), coordinate e = k * lanes + lane in register k of lane `lane`. The
// butterfly stages of half-length below `lanes` pair registers of two lanes (__shfl_xor_sync), the
// longer ones two registers of one lane; the stages run in the order of hash_codes_kernel (half 1, 2,
// 4, ...) with the same rounded operations, so the codes are bitwise its codes, without shared memory
// or a block-wide barrier per stage. A code's bits are gathered from each register's warp ballot.
constexpr int kMaxPerLane = 8;

// Bits [first, first + count) of the signs, count <= kMaxHashBits: coordinate e's bit is bit e % lanes of
// positive[e / lanes], and as lanes = 32 wherever there are several registers, the words are one bit string. Two
// words shifted as one 64-bit window: no loop over bits and no division by the runtime `lanes`. Per bit, a division
// and a remainder were of the transform's order: at the ListOps shape a vector's 32 codes are 352 bits, its
// transforms 240 butterfly stages (a count from the source, not yet a GPU timing). The words are picked by unrolled
// compares rather than a runtime index.
template <int kPerLane>
__device__ __forceinline__ unsigned code_bits(const unsigned (&positive)[kPerLane], int first, int count) {
  const int word = first >> 5;
  unsigned long long window = 0;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    if (k == word) {
      window |= positive[k];
    } else if (k == word + 1) {
      window |= static_cast<unsigned long long>(positive[k]) << 32;
    }
  }
  return static_cast<unsigned>((window >> (first & 31)) & ((1ull << count) - 1ull));
}

// hash_codes' inputs, outputs and sizes, as hash_codes_kernel takes them.
template <typename scalar_t>
struct HashCodesArgs {
  const scalar_t* vectors;  // (B, n, dim)
  const float* signs;       // (B, 3, rotations, width)
  int* codes;               // (B, n, num_hashes)
  int64_t num_vectors, length;
  int dim, width, rotations, rotations_used, per_rotation, num_hashes, hash_bits;
};

template <typename scalar_t, int kPerLane>
__global__ void __launch_bounds__(kBlock) hash_codes_warp_kernel(const HashCodesArgs<scalar_t> a, int lanes) {
  const scalar_t* __restrict__ vectors = a.vectors;
  const float* __restrict__ signs = a.signs;
  const int dim = a.dim, width = a.width, rotations = a.rotations, hash_bits = a.hash_bits;
  const int64_t length = a.length;
  const int warp_lane = static_cast<int>(threadIdx.x % kWarp);
  const int lane = warp_lane % lanes;
  const int group = warp_lane - lane;  // this vector's first lane in the warp
  const unsigned group_bits = lanes == kWarp ? 0xffffffffu : (1u << lanes) - 1u;
  const int64_t vec = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / lanes;
  const bool valid = vec < a.num_vectors;
  // Lanes past the last vector run the same loops (they take part in every shuffle and ballot) on
  // zeros and batch row 0, and write nothing.
  const int64_t batch = valid ? vec / length : 0;
  const scalar_t* v = vectors + (valid ? vec : 0) * dim;
  float x[kPerLane];
  unsigned positive[kPerLane];

  for (int r = 0; r < a.rotations_used; ++r) {
    for (int step = 0; step < 3; ++step) {
      const float* s = signs + ((batch * 3 + step) * rotations + r) * static_cast<int64_t>(width);
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        const int e = k * lanes + lane;
        const float value = step == 0 ? ((valid && e < dim) ? static_cast<float>(v[e]) : 0.0f) : x[k];
        x[k] = __fmul_rn(value, s[e]);
      }
      for (int half = 1; half < lanes; half <<= 1) {
        const bool second = (lane & half) != 0;  // holds b of the pair (a, b)
#pragma unroll
        for (int k = 0; k < kPerLane; ++k) {
          const float other = __shfl_xor_sync(0xffffffffu, x[k], half);
          x[k] = second ? __fsub_rn(other, x[k]) : __fadd_rn(x[k], other);
        }
      }
#pragma unroll
      for (int half = 1; half < kPerLane; half <<= 1) {
#pragma unroll
        for (int k = 0; k < kPerLane; ++k) {
          if ((k & half) == 0) {
            const float a = x[k];
            const float b = x[k + half];
            x[k] = __fadd_rn(a, b);
            x[k + half] = __fsub_rn(a, b);
          }
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      positive[k] = (__ballot_sync(0xffffffffu, x[k] > 0.0f) >> group) & group_bits;
    }
    for (int t = lane; t < a.per_rotation; t += lanes) {
      const int g = r * a.per_rotation + t;
      if (valid && g < a.num_hashes) {
        a.codes[vec * a.num_hashes + g] = static_cast<int>(code_bits(positive, t * hash_bits, hash_bits));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Launch grids

unsigned warp_grid(int64_t warps) {
  const int64_t blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  TORCH_CHECK(blocks <= std::numeric_limits<int32_t>::max(), "yoso: too many rows for one launch (", warps, ")");
  return static_cast<unsigned>(blocks);
}

unsigned thread_grid(int64_t threads) {
  const int64_t blocks = (threads + kBlock - 1) / kBlock;
  TORCH_CHECK(blocks <= std::numeric_limits<int32_t>::max(), "yoso: too many items for one launch (", threads, ")");
  return static_cast<unsigned>(blocks);
}

// ---------------------------------------------------------------------------------------------
// Sorted buckets of one chunk of hashes [h0, h0 + hc)

// Item (segment = b * hc + hl, j) of a side whose segments start at segment0: key
// (((segment0 + segment) << (tau + 1)) | code) for a real row, bit tau instead of the code for a
// padded one; value j.
__global__ void __launch_bounds__(kBlock) build_keys_kernel(
    const int* __restrict__ codes, const bool* __restrict__ mask, key_t* __restrict__ keys, int* __restrict__ order,
    int64_t total, int64_t length, int num_hashes, int h0, int hc, int hash_bits, int64_t segment0) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= total) {
    return;
  }
  const int64_t segment = item / length;
  const int64_t j = item - segment * length;
  const int64_t b = segment / hc;
  const int64_t hl = segment - b * hc;
  const int64_t row = b * length + j;
  keys[item] = mask[row]
      ? bucket_key(segment0 + segment, codes[row * num_hashes + h0 + hl], hash_bits)
      : ((static_cast<key_t>(segment0 + segment) << (hash_bits + 1)) | (static_cast<key_t>(1) << hash_bits));
  order[item] = static_cast<int>(j);
}

int bit_width(uint64_t value) {
  int bits = 0;
  while (value != 0) {
    ++bits;
    value >>= 1;
  }
  return bits;
}

// The rows whose buckets a cumulation looks up: the keys, or for the transposed sum the queries.
struct Side {
  at::Tensor codes;  // (B, n, m) int32, contiguous
  at::Tensor mask;   // (B, n) bool, contiguous
  bool queries;      // the query side (names the codes in range assertions)
};

// One or two sides sorted by one radix sort: side s holds sorted positions [offset[s], offset[s] +
// B * hc * n_s) and segments [segment0[s], segment0[s] + B * hc); within a segment each occupied
// bucket is a contiguous range of positions, rows in index order, padded rows last.
struct SortedBuckets {
  at::Tensor keys_a, keys_b, order_a, order_b;  // CUB's double buffers (kept alive)
  const key_t* keys = nullptr;                  // every side's sorted keys
  const int* order = nullptr;                   // the row index j of each sorted position
  int64_t offset[2] = {0, 0};
  int64_t segment0[2] = {0, 0};
};

SortedBuckets sort_buckets(const Side* sides, int num_sides, int64_t batch, int64_t num_hashes, int64_t h0, int64_t hc,
                           int hash_bits, cudaStream_t stream) {
  SortedBuckets sorted;
  int64_t total = 0;
  for (int s = 0; s < num_sides; ++s) {
    sorted.offset[s] = total;
    sorted.segment0[s] = s * batch * hc;
    total += batch * hc * sides[s].codes.size(1);
  }
  const auto long_options = sides[0].codes.options().dtype(at::kLong);
  const auto int_options = sides[0].codes.options().dtype(at::kInt);
  sorted.keys_a = at::empty({total}, long_options);
  sorted.keys_b = at::empty({total}, long_options);
  sorted.order_a = at::empty({total}, int_options);
  sorted.order_b = at::empty({total}, int_options);
  key_t* keys_a = reinterpret_cast<key_t*>(sorted.keys_a.data_ptr<int64_t>());
  key_t* keys_b = reinterpret_cast<key_t*>(sorted.keys_b.data_ptr<int64_t>());
  int* order_a = sorted.order_a.data_ptr<int>();
  int* order_b = sorted.order_b.data_ptr<int>();
  for (int s = 0; s < num_sides; ++s) {
    const int64_t length = sides[s].codes.size(1);
    const int64_t items = batch * hc * length;
    if (items == 0) {
      continue;
    }
    build_keys_kernel<<<thread_grid(items), kBlock, 0, stream>>>(
        sides[s].codes.data_ptr<int>(), sides[s].mask.data_ptr<bool>(), keys_a + sorted.offset[s],
        order_a + sorted.offset[s], items, length, static_cast<int>(num_hashes), static_cast<int>(h0),
        static_cast<int>(hc), hash_bits, sorted.segment0[s]);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  const int end_bit = hash_bits + 1 + bit_width(static_cast<uint64_t>(num_sides * batch * hc - 1));
  cub::DoubleBuffer<key_t> key_buffers(keys_a, keys_b);
  cub::DoubleBuffer<int> order_buffers(order_a, order_b);
  size_t temp_bytes = 0;
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, key_buffers, order_buffers, total, 0, end_bit, stream));
  at::Tensor temp = at::empty({static_cast<int64_t>(std::max<size_t>(temp_bytes, 1))}, long_options.dtype(at::kByte));
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data_ptr(), temp_bytes, key_buffers, order_buffers, total, 0,
                                                 end_bit, stream));
  sorted.keys = key_buffers.Current();
  sorted.order = order_buffers.Current();
  return sorted;  // temp is freed to the caching allocator on this stream: safe for later work on it
}

// Scratch memory of one chunk of hashes: YOSO_CUDA_CHUNK_BYTES bytes if set (tests shrink it to run
// many chunks), else kDefaultChunkBytes.
int64_t chunk_budget_bytes() {
  const char* text = std::getenv("YOSO_CUDA_CHUNK_BYTES");
  if (text == nullptr || *text == '\0') {
    return kDefaultChunkBytes;
  }
  char* end = nullptr;
  const long long bytes = std::strtoll(text, &end, 10);
  TORCH_CHECK_VALUE(*end == '\0' && bytes > 0, "YOSO_CUDA_CHUNK_BYTES must be a positive number of bytes, got '", text, "'");
  return bytes;
}

// Hashes per chunk: as many as fit the chunk budget of scratch (at least 1), with fewer than 2^31
// sorted items.
int64_t hashes_per_chunk(int64_t num_hashes, int64_t rows_per_hash, int64_t bytes_per_hash) {
  int64_t hc = bytes_per_hash > 0 ? chunk_budget_bytes() / bytes_per_hash : num_hashes;
  hc = std::min(hc, static_cast<int64_t>(std::numeric_limits<int32_t>::max()) / std::max<int64_t>(rows_per_hash, 1));
  return std::max<int64_t>(1, std::min(hc, num_hashes));
}

// ---------------------------------------------------------------------------------------------
// lsh_cumulation

// One warp per sorted position p. A piece starts at p when p begins a bucket or p's position in
// its segment is a multiple of kPiece; the warp of a piece start writes partial[p] = sum of the
// values of the piece's keys (in sorted, i.e. index, order) over the next <= kPiece positions of
// the same bucket. Other positions and padded keys write nothing (their rows are never read).
template <typename scalar_t>
__global__ void __launch_bounds__(kBlock) bucket_piece_sums_kernel(
    const key_t* __restrict__ keys, const int* __restrict__ order, const scalar_t* __restrict__ values,
    float* __restrict__ partial, int64_t total, int64_t num_keys, int64_t channels, int hc, int hash_bits) {
  const int64_t p = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (p >= total) {
    return;  // warp-uniform from here on: every branch below depends on p only
  }
  const int64_t segment = p / num_keys;
  const int64_t position = p - segment * num_keys;
  const key_t key = keys[p];
  if ((key >> hash_bits) & 1ull) {
    return;  // a padded key
  }
  if (position % kPiece != 0 && keys[p - 1] == key) {
    return;  // inside a piece
  }
  const int64_t stop = segment * num_keys + min64(num_keys, (position / kPiece + 1) * kPiece);
  const scalar_t* batch_values = values + (segment / hc) * num_keys * channels;
  for (int64_t column0 = 0; column0 < channels; column0 += kWarp) {
    const int64_t column = column0 + lane;
    float sum = 0.0f;
    int64_t q = p;
    while (q < stop) {
      const int count = static_cast<int>(min64(kWarp, stop - q));
      const bool here = lane < count;
      const key_t lane_key = here ? keys[q + lane] : 0ull;
      const int lane_j = here ? order[q + lane] : 0;
      const unsigned same = __ballot_sync(kFullMask, here && lane_key == key);
      const int run = same == kFullMask ? kWarp : __ffs(~same) - 1;  // >= 1 on the first pass
      for (int t = 0; t < run; ++t) {
        const int j = __shfl_sync(kFullMask, lane_j, t);
        if (column < channels) {
          sum += static_cast<float>(batch_values[static_cast<int64_t>(j) * channels + column]);
        }
      }
      q += run;
      if (run < count) {
        break;  // the bucket ended inside this batch of 32
      }
    }
    if (column < channels) {
      partial[p * channels + column] = sum;
    }
  }
}

// One warp per query (b, i), owning out[b, i]. For each 128-column tile: acc = out row (the sums of
// earlier chunks), then for each hash of the chunk in order acc += sum of the partial sums of the
// pieces of its bucket, in sorted order. The last chunk divides by the number of hashes.
__global__ void __launch_bounds__(kBlock) cumulation_query_kernel(
    const int* __restrict__ query_codes, const bool* __restrict__ query_mask, const key_t* __restrict__ keys,
    const float* __restrict__ partial, float* __restrict__ out, int64_t num_queries_total, int64_t num_queries,
    int64_t num_keys, int64_t channels, int num_hashes, int h0, int hc, int hash_bits, int64_t segment0, bool last) {
  const int64_t query = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (query >= num_queries_total || !query_mask[query]) {
    return;  // warp-uniform; padded queries keep their zero rows
  }
  const int64_t b = query / num_queries;
  float* out_row = out + query * channels;
  for (int64_t tile = 0; tile < channels; tile += kTileColumns) {
    float acc[kLaneColumns];
#pragma unroll
    for (int k = 0; k < kLaneColumns; ++k) {
      const int64_t column = tile + lane + k * kWarp;
      acc[k] = column < channels ? out_row[column] : 0.0f;
    }
    for (int hl = 0; hl < hc; ++hl) {
      const int64_t segment = b * hc + hl;
      const int64_t base = segment * num_keys;
      const key_t key = bucket_key(segment0 + segment, query_codes[query * num_hashes + h0 + hl], hash_bits);
      int64_t lo, hi;
      if (!find_bucket(keys, base, num_keys, key, lo, hi)) {
        continue;
      }
#pragma unroll
      for (int k = 0; k < kLaneColumns; ++k) {
        const int64_t column = tile + lane + k * kWarp;
        if (column < channels) {
          float sum = partial[(base + lo) * channels + column];
          for (int64_t pos = (lo / kPiece + 1) * kPiece; pos < hi; pos += kPiece) {
            sum += partial[(base + pos) * channels + column];
          }
          acc[k] += sum;
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kLaneColumns; ++k) {
      const int64_t column = tile + lane + k * kWarp;
      if (column < channels) {
        out_row[column] = last ? acc[k] / static_cast<float>(num_hashes) : acc[k];
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// lsh_cumulation by counting sort (the default; the radix path above remains for tau too large for
// a table of 2^tau buckets per hash, and under YOSO_CUDA_CUMULATION=radix)
//
// Three launches, no sort, no binary search, no chunks: per segment (b, h), a table of 2^tau bucket
// ends and the real keys' indices in bucket order (index order within a bucket, so every sum below
// runs in a fixed order and the results are bitwise reproducible); the sums of buckets of more than
// kHeavyMin keys, at most nk / (kHeavyMin + 1) rows per segment; then each query looks up its bucket
// in each hash directly. Scratch: B m (2^tau + nk) ints and B m nk / (kHeavyMin + 1) x c floats.

// The rows of one side (the keys, or the queries of a transposed sum) and where bucket_index_kernel
// writes their index: per segment (b, h), bucket_end[code] = one past the last sorted position of
// bucket `code` (its first is bucket_end[code - 1], or 0) and rows = the real rows' indices in bucket
// order, index order within a bucket.
struct IndexedSide {
  const int* codes;  // (B, n, m)
  const bool* mask;  // (B, n)
  int* bucket_end;   // (B m, 2^tau)
  int* rows;         // (B m, n)
  int64_t length;    // n
  bool queries;      // names the codes in the range assertion
};

// Rows bucket_index_kernel sorts at a time (a round): 2^kRoundBits 8-byte keys, 16 KB of shared memory.
constexpr int kRoundBits = 11;
constexpr int kIndexRound = 1 << kRoundBits;
constexpr key_t kNoRow = ~0ull;  // the sort key of a padded row (or one past the end): last
constexpr int kScanItems = 8;    // bucket counts per thread in each tile of the scan

// The exclusive prefix sum of one value per thread of the block (kBlock threads), and in `total`
// the block's sum. warp_totals: kWarpsPerBlock ints of shared memory, free again on return.
__device__ int block_exclusive_sum(int value, int* warp_totals, int& total) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  int inclusive = value;
#pragma unroll
  for (int offset = 1; offset < kWarp; offset <<= 1) {
    const int below = __shfl_up_sync(kFullMask, inclusive, offset);
    inclusive += lane >= offset ? below : 0;
  }
  if (lane == kWarp - 1) {
    warp_totals[warp] = inclusive;
  }
  __syncthreads();
  int before = 0;
  total = 0;
  for (int w = 0; w < kWarpsPerBlock; ++w) {
    before += w < warp ? warp_totals[w] : 0;
    total += warp_totals[w];
  }
  __syncthreads();  // every thread has read warp_totals before the next call writes it
  return before + inclusive - value;
}

// Sorts keys[0, count) ascending (count a power of two) with a bitonic network, every thread of the
// block comparing pairs; ends with a barrier.
__device__ void block_sort(key_t* keys, int count) {
  for (int size = 2; size <= count; size <<= 1) {
    for (int stride = size / 2; stride > 0; stride /= 2) {
      for (int pair = threadIdx.x; pair < count / 2; pair += blockDim.x) {
        const int lo = 2 * pair - (pair & (stride - 1));  // pairs (lo, lo + stride), in groups of stride
        const key_t a = keys[lo], b = keys[lo + stride];
        if ((a > b) == ((lo & size) == 0)) {  // ascending where bit `size` of lo is clear
          keys[lo] = b;
          keys[lo + stride] = a;
        }
      }
      __syncthreads();
    }
  }
}

// One block per segment (b, h) = (segment / m, segment % m) of side0, then of side1 (the blocks past
// num_segments, when two sides are indexed in one launch): the warps of a block share one segment,
// so that a few long segments (n = 65536 with two heads: 64 segments) still fill the GPU.
// Two passes over the rows, `round` rows at a time (a power of two, at most kIndexRound). The block
// sorts each round's keys (code << kRoundBits | row's place in the round; padded rows last) in
// shared memory, so each bucket's rows of the round form one run in index order, and only the run's
// first row (its head, at sorted position p_head) and last (its tail, p_tail) touch the bucket's
// entry of the table, between barriers: the head subtracts p_head, the tail adds p_tail + 1, which
// adds the run's length. The first pass counts; an exclusive scan turns the counts into bucket
// starts; in the second, between the head's and the tail's update, every row of the run is placed at
// the entry plus its sorted position (the cursor plus its place in the run). The rounds run in index
// order, so a bucket holds its rows in index order, and the table ends as bucket_end[code] = the end
// of bucket `code`. A segment of one round sorts it once.
__global__ void __launch_bounds__(kBlock) bucket_index_kernel(IndexedSide side0, IndexedSide side1,
                                                              int64_t num_segments, int num_hashes, int hash_bits,
                                                              int round) {
  __shared__ key_t keys[kIndexRound];
  __shared__ int warp_totals[kWarpsPerBlock];
  const bool second = blockIdx.x >= num_segments;
  const IndexedSide side = second ? side1 : side0;  // a copy in registers, not a parameter reached through the stack
  const int64_t segment = second ? blockIdx.x - num_segments : blockIdx.x;
  const int64_t num_rows = side.length;
  const int64_t b = segment / num_hashes;
  const int h = static_cast<int>(segment % num_hashes);
  const int64_t buckets = int64_t(1) << hash_bits;
  int* ends = side.bucket_end + segment * buckets;
  int* segment_rows = side.rows + segment * num_rows;
  for (int64_t c = threadIdx.x; c < buckets; c += blockDim.x) {
    ends[c] = 0;
  }
  for (int pass = 0; pass < 2; ++pass) {
    __syncthreads();  // the table (zeros, then the counts) is visible to every thread
    if (pass == 1) {  // counts -> exclusive starts (the cursors of the placement pass)
      int carry = 0;
      for (int64_t tile = 0; tile < buckets; tile += int64_t(kBlock) * kScanItems) {
        const int64_t first = tile + int64_t(threadIdx.x) * kScanItems;
        int counts[kScanItems];
        int sum = 0;
#pragma unroll
        for (int k = 0; k < kScanItems; ++k) {
          counts[k] = first + k < buckets ? ends[first + k] : 0;
          sum += counts[k];
        }
        int total;
        int start = carry + block_exclusive_sum(sum, warp_totals, total);
#pragma unroll
        for (int k = 0; k < kScanItems; ++k) {
          if (first + k < buckets) {
            ends[first + k] = start;
          }
          start += counts[k];
        }
        carry += total;
      }
      __syncthreads();
    }
    for (int64_t round0 = 0; round0 < num_rows; round0 += round) {
      if (pass == 0 || num_rows > round) {
        for (int i = threadIdx.x; i < round; i += blockDim.x) {
          const int64_t j = round0 + i;
          key_t key = kNoRow;
          if (j < num_rows) {
            const int row_code = side.codes[(b * num_rows + j) * num_hashes + h];
            const bool in_range = (static_cast<unsigned>(row_code) >> hash_bits) == 0u;
            CUDA_KERNEL_ASSERT_MSG(in_range || side.queries,
                                   "key_codes holds hash codes outside [0, 2^hash_bits): codes must come from "
                                   "hash_codes with the same hash_bits");
            CUDA_KERNEL_ASSERT_MSG(in_range || !side.queries,
                                   "query_codes holds hash codes outside [0, 2^hash_bits): codes must come from "
                                   "hash_codes with the same hash_bits");
            if (side.mask[b * num_rows + j]) {
              key = (static_cast<key_t>(row_code) << kRoundBits) | static_cast<unsigned>(i);
            }
          }
          keys[i] = key;
        }
        __syncthreads();
        block_sort(keys, round);
      }
      for (int step = 0; step < 3; ++step) {  // the heads, then (placing) every row, then the tails
        if (step == 1 && pass == 0) {
          continue;
        }
        for (int p = threadIdx.x; p < round; p += blockDim.x) {
          const key_t key = keys[p];
          if (key == kNoRow) {
            continue;
          }
          const int64_t code = static_cast<int64_t>(key >> kRoundBits);
          const bool head = p == 0 || (keys[p - 1] >> kRoundBits) != (key >> kRoundBits);
          const bool tail = p == round - 1 || (keys[p + 1] >> kRoundBits) != (key >> kRoundBits);
          if (step == 0 && head) {
            ends[code] -= p;
          }
          if (step == 1) {
            segment_rows[ends[code] + p] = static_cast<int>(round0 + static_cast<int64_t>(key & (kIndexRound - 1)));
          }
          if (step == 2 && tail) {
            ends[code] += p + 1;
          }
        }
        __syncthreads();
      }
    }
  }
}

// Every hash of one side, indexed by bucket_index_kernel, as the lookup kernels see it (a segment
// b * hc + hl, with h0 = 0 and hc = m; see also RadixBuckets below).
struct CountingBuckets {
  const int* codes;       // (B, n, m)
  const int* bucket_end;  // (B m, 2^tau)
  const int* rows;        // (B m, n)
  int64_t num_rows;       // n
  int h0, hc, hash_bits;  // h0 = 0, hc = m

  __device__ const int* segment_rows(int64_t segment) const { return rows + segment * num_rows; }
  __device__ int64_t batch_of(int64_t segment) const { return segment / hc; }

  __device__ bool find(int64_t b, int hl, int code, int64_t& segment, int64_t& lo, int64_t& hi) const {
    segment = b * hc + hl;
    const int* ends = bucket_end + (segment << hash_bits);
    lo = code == 0 ? 0 : ends[code - 1];
    hi = ends[code];
    return hi > lo;
  }

  // Warp-collective: the bucket of more than `heavy` rows starting in positions [slot (heavy + 1),
  // (slot + 1) (heavy + 1)) of `segment`, if any (heavy buckets start at least heavy + 1 apart, so at
  // most one does); [start, end) its positions.
  __device__ bool heavy_bucket(int64_t segment, int64_t slot, int64_t heavy, int lane, int64_t& start, int64_t& end) const {
    const int* ends = bucket_end + (segment << hash_bits);
    const int* segment_rows = rows + segment * num_rows;
    const int64_t b = segment / hc;
    const int h = h0 + static_cast<int>(segment % hc);
    const int num_hashes = hc;
    const int64_t num_real = ends[(int64_t(1) << hash_bits) - 1];
    const int64_t first = slot * (heavy + 1);
    const int64_t stop = min64(first + heavy + 1, num_real);
    for (int64_t p0 = first; p0 < stop; p0 += kWarp) {  // warp-uniform
      const int64_t p = p0 + lane;
      bool heavy_start = false;
      int64_t lane_end = 0;
      if (p < stop) {
        const int code = codes[(b * num_rows + segment_rows[p]) * num_hashes + h];
        const bool starts = p == 0 || codes[(b * num_rows + segment_rows[p - 1]) * num_hashes + h] != code;
        lane_end = ends[code];
        heavy_start = starts && lane_end - p > heavy;
      }
      const unsigned found = __ballot_sync(kFullMask, heavy_start);
      if (found != 0u) {
        const int source = __ffs(found) - 1;
        start = p0 + source;
        end = __shfl_sync(kFullMask, lane_end, source);
        return true;
      }
    }
    return false;
  }
};

// One warp per (segment, slot): a bucket of more than kHeavyMin keys is heavy, and heavy buckets
// start at least kHeavyMin + 1 positions apart, so at most one starts in slot s's positions
// [s (kHeavyMin + 1), (s + 1) (kHeavyMin + 1)); its sum over its keys in sorted order goes to
// heavy_sums[segment, s]. Slots without one write nothing (no query reads them).
template <typename scalar_t>
__global__ void __launch_bounds__(kBlock) heavy_bucket_sums_kernel(CountingBuckets keys, const scalar_t* __restrict__ values,
                                                                   float* __restrict__ heavy_sums, int64_t num_slots_total,
                                                                   int64_t slots, int64_t channels) {
  const int64_t item = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (item >= num_slots_total) {
    return;  // warp-uniform
  }
  const int64_t segment = item / slots;
  const int64_t slot = item - segment * slots;
  int64_t start, end;
  if (!keys.heavy_bucket(segment, slot, kHeavyMin, lane, start, end)) {
    return;  // warp-uniform
  }
  const int* segment_rows = keys.segment_rows(segment);
  const int64_t num_keys = keys.num_rows;
  const int64_t b = keys.batch_of(segment);
  const scalar_t* batch_values = values + b * num_keys * channels;
  float* sums = heavy_sums + item * channels;
  for (int64_t column0 = 0; column0 < channels; column0 += kWarp) {
    const int64_t column = column0 + lane;
    float sum = 0.0f;
    for (int64_t pos0 = start; pos0 < end; pos0 += kWarp) {
      const int count = static_cast<int>(min64(kWarp, end - pos0));
      const int lane_j = lane < count ? segment_rows[pos0 + lane] : 0;
      for (int t = 0; t < count; ++t) {
        const int64_t j = __shfl_sync(kFullMask, lane_j, t);
        if (column < channels) {
          sum += static_cast<float>(batch_values[j * channels + column]);
        }
      }
    }
    if (column < channels) {
      sums[column] = sum;
    }
  }
}

// One warp per query (b, i), writing out[b, i] whole (padded queries get zeros, so the output needs
// no zero fill). For each 128-column tile, for each hash in order: acc += the sum of the query's
// bucket (a heavy bucket's precomputed sum, or its keys' values in sorted order); out = acc / m.
// Fails a device-side assertion when one of a lookup row's codes is outside [0, 2^hash_bits).
__device__ __forceinline__ void assert_codes_in_range(const int* row_codes, int h0, int hc, int hash_bits, bool queries,
                                                      int lane) {
  for (int h = h0 + lane; h < h0 + hc; h += kWarp) {
    const bool in_range = (static_cast<unsigned>(row_codes[h]) >> hash_bits) == 0u;
    CUDA_KERNEL_ASSERT_MSG(in_range || !queries,
                           "query_codes holds hash codes outside [0, 2^hash_bits): codes must come from hash_codes with "
                           "the same hash_bits");
    CUDA_KERNEL_ASSERT_MSG(in_range || queries,
                           "key_codes holds hash codes outside [0, 2^hash_bits): codes must come from hash_codes with "
                           "the same hash_bits");
  }
}

// sum[k] = the sum over the rows j = rows[lo], ..., rows[hi - 1], in that order, of matrix[j][tile + lane
// + 32 k] (rows of `width` columns; columns past the width stay 0).
template <typename scalar_t>
__device__ __forceinline__ void sum_bucket_rows(const int* __restrict__ rows, int64_t lo, int64_t hi,
                                                const scalar_t* __restrict__ matrix, int64_t width, int64_t tile, int lane,
                                                float (&sum)[kLaneColumns]) {
#pragma unroll
  for (int k = 0; k < kLaneColumns; ++k) {
    sum[k] = 0.0f;
  }
  for (int64_t pos0 = lo; pos0 < hi; pos0 += kWarp) {
    const int count = static_cast<int>(min64(kWarp, hi - pos0));
    const int lane_j = lane < count ? rows[pos0 + lane] : 0;
    for (int t = 0; t < count; ++t) {
      const int64_t j = __shfl_sync(kFullMask, lane_j, t);
#pragma unroll
      for (int k = 0; k < kLaneColumns; ++k) {
        const int64_t column = tile + lane + k * kWarp;
        if (column < width) {
          sum[k] += static_cast<float>(matrix[j * width + column]);
        }
      }
    }
  }
}

template <typename scalar_t>
__global__ void __launch_bounds__(kBlock) bucket_lookup_kernel(
    CountingBuckets keys, const int* __restrict__ query_codes, const bool* __restrict__ query_mask,
    const scalar_t* __restrict__ values, const float* __restrict__ heavy_sums, float* __restrict__ out,
    int64_t num_queries_total, int64_t num_queries, int64_t channels, int64_t slots, int num_hashes) {
  const int64_t query = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (query >= num_queries_total) {
    return;  // warp-uniform
  }
  const int* q_codes = query_codes + query * num_hashes;
  assert_codes_in_range(q_codes, 0, num_hashes, keys.hash_bits, true, lane);
  const bool real = query_mask[query];
  const int64_t b = query / num_queries;
  const scalar_t* batch_values = values + b * keys.num_rows * channels;
  float* out_row = out + query * channels;
  for (int64_t tile = 0; tile < channels; tile += kTileColumns) {
    float acc[kLaneColumns];
#pragma unroll
    for (int k = 0; k < kLaneColumns; ++k) {
      acc[k] = 0.0f;
    }
    for (int h = 0; h < num_hashes && real; ++h) {  // warp-uniform
      int64_t segment, lo, hi;
      keys.find(b, h, q_codes[h], segment, lo, hi);
      float sum[kLaneColumns];
      if (hi - lo > kHeavyMin) {
        const float* bucket_sum = heavy_sums + (segment * slots + lo / (kHeavyMin + 1)) * channels;
#pragma unroll
        for (int k = 0; k < kLaneColumns; ++k) {
          const int64_t column = tile + lane + k * kWarp;
          sum[k] = column < channels ? bucket_sum[column] : 0.0f;
        }
      } else {
        sum_bucket_rows(keys.segment_rows(segment), lo, hi, batch_values, channels, tile, lane, sum);
      }
#pragma unroll
      for (int k = 0; k < kLaneColumns; ++k) {
        acc[k] += sum[k];
      }
    }
#pragma unroll
    for (int k = 0; k < kLaneColumns; ++k) {
      const int64_t column = tile + lane + k * kWarp;
      if (column < channels) {
        out_row[column] = acc[k] / static_cast<float>(num_hashes);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// lsh_weighted_cumulation and lsh_collided_gradient, on either path
//
// Their kernels look up buckets through one of two views of an indexed side, so that one kernel
// body serves the counting sort (CountingBuckets: every hash at once) and the radix sort
// (RadixBuckets: a chunk of hashes). A lookup row of batch row b asks, for hash hl of the view's
// hashes [h0, h0 + hc), for the bucket of its code: a segment b * hc + hl, sorted positions [lo, hi)
// within it, and the segment's row indices (bucket order, index order within a bucket, so every sum
// below runs in a fixed order).

// A chunk of hashes [h0, h0 + hc) of one side, sorted by sort_buckets.
struct RadixBuckets {
  const key_t* keys;   // the side's sorted keys
  const int* order;    // the row index of each sorted position
  int64_t num_rows;    // n
  int64_t segment0;    // the side's first segment in the sort
  int h0, hc, hash_bits;

  __device__ const int* segment_rows(int64_t segment) const { return order + segment * num_rows; }
  __device__ int64_t batch_of(int64_t segment) const { return segment / hc; }

  __device__ bool find(int64_t b, int hl, int code, int64_t& segment, int64_t& lo, int64_t& hi) const {
    segment = b * hc + hl;
    return find_bucket(keys, segment * num_rows, num_rows, bucket_key(segment0 + segment, code, hash_bits), lo, hi);
  }

  // As CountingBuckets::heavy_bucket: sorted, so a bucket starting at p is heavy when position
  // p + heavy holds its key.
  __device__ bool heavy_bucket(int64_t segment, int64_t slot, int64_t heavy, int lane, int64_t& start, int64_t& end) const {
    const key_t* segment_keys = keys + segment * num_rows;
    const int64_t first = slot * (heavy + 1);
    const int64_t stop = min64(first + heavy + 1, num_rows);
    for (int64_t p0 = first; p0 < stop; p0 += kWarp) {  // warp-uniform
      const int64_t p = p0 + lane;
      bool heavy_start = false;
      if (p < stop) {
        const key_t key = segment_keys[p];
        heavy_start = !((key >> hash_bits) & 1ull) && (p == 0 || segment_keys[p - 1] != key) && p + heavy < num_rows &&
                      segment_keys[p + heavy] == key;
      }
      const unsigned found = __ballot_sync(kFullMask, heavy_start);
      if (found != 0u) {
        start = p0 + __ffs(found) - 1;
        end = upper_bound_key(segment_keys, start + heavy + 1, num_rows, segment_keys[start]);
        return true;
      }
    }
    return false;
  }
};

// One direction of a weighted cumulation: out[b, i] = scale (1/m) sum_h sum_{j in i's bucket}
// (lw_i . w_j) v_j for the lookup rows i, over the indexed rows j, and where plain_out is given, also
// plain_out[b, i] = (1/m) sum_h sum_{j in i's bucket} w_j (lsh_lower_bound_gradients' grad V beside
// its grad K). lsh_weighted_cumulation_both and lsh_lower_bound_gradients run two directions at once.
template <typename scalar_t, typename Buckets>
struct WeightedPass {
  Buckets buckets;                  // the indexed rows j
  const int* lookup_codes;          // (B, nl, m)
  const bool* lookup_mask;          // (B, nl)
  const scalar_t* lookup_weights;   // (B, nl, w)
  const scalar_t* weights;          // (B, nj, w)
  const scalar_t* values;           // (B, nj, c)
  float* tables;                    // per heavy-bucket slot: sum over its rows of w_j (x) [v_j, 1 if plain_out], (w, table_columns)
  float* out;                       // (B, nl, c)
  float* plain_out;                 // (B, nl, w), or nullptr
  int64_t num_lookups, channels, table_columns, heavy, slots;
  float scale;
  bool lookup_queries;              // names the lookup codes in the range assertion
};

// The pass of a block or warp: pass0's, or pass1's past the first pass's blocks or warps.
template <typename scalar_t, typename Buckets>
__device__ __forceinline__ const WeightedPass<scalar_t, Buckets>& pick(const WeightedPass<scalar_t, Buckets>& pass0,
                                                                      const WeightedPass<scalar_t, Buckets>& pass1,
                                                                      bool second) {
  return second ? pass1 : pass0;
}

// One block per (slot of pass0, then of pass1; group of kTableOutputs entries): warp 0 finds the
// slot's heavy bucket (blocks of slots without one return), then table[a][c] = sum over the bucket's
// rows j, in sorted order, of w[b, j, a] * v[b, j, c], and with a plain output table[a][channels] =
// sum of w[b, j, a].
template <typename scalar_t, typename Buckets>
__global__ void __launch_bounds__(kBlock) heavy_bucket_tables_kernel(WeightedPass<scalar_t, Buckets> pass0,
                                                                     WeightedPass<scalar_t, Buckets> pass1,
                                                                     int64_t slots0, int64_t width) {
  __shared__ int64_t bucket[2];
  __shared__ int staged[kBlock];
  const bool second = static_cast<int64_t>(blockIdx.x) >= slots0;
  const WeightedPass<scalar_t, Buckets>& pass = pick(pass0, pass1, second);
  const int64_t item = static_cast<int64_t>(blockIdx.x) - (second ? slots0 : 0);
  const int64_t segment = item / pass.slots;
  const int64_t slot = item - segment * pass.slots;
  if (threadIdx.x < kWarp) {
    int64_t start = -1, end = -1;
    if (!pass.buckets.heavy_bucket(segment, slot, pass.heavy, threadIdx.x, start, end)) {
      start = -1;
    }
    if (threadIdx.x == 0) {
      bucket[0] = start;
      bucket[1] = end;
    }
  }
  __syncthreads();
  const int64_t start = bucket[0], end = bucket[1];
  if (start < 0) {
    return;  // block-uniform: no heavy bucket in this slot (no lookup reads its table)
  }
  const int* rows = pass.buckets.segment_rows(segment);
  const int64_t b = pass.buckets.batch_of(segment);
  const int64_t channels = pass.channels, columns = pass.table_columns;
  const scalar_t* batch_weights = pass.weights + b * pass.buckets.num_rows * width;
  const scalar_t* batch_values = pass.values + b * pass.buckets.num_rows * channels;
  const int64_t entries = width * columns;
  float* table = pass.tables + item * entries;
  const int64_t groups = (entries + kTableOutputs - 1) / kTableOutputs;
  for (int64_t group = blockIdx.y; group < groups; group += gridDim.y) {  // block-uniform
    int64_t a[4], c[4];
    bool ok[4];
    float acc[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int64_t entry = group * kTableOutputs + k * kBlock + threadIdx.x;
      ok[k] = entry < entries;
      a[k] = ok[k] ? entry / columns : 0;
      c[k] = ok[k] ? entry - a[k] * columns : 0;
      acc[k] = 0.0f;
    }
    for (int64_t pos0 = start; pos0 < end; pos0 += kBlock) {  // block-uniform
      const int count = static_cast<int>(min64(kBlock, end - pos0));
      __syncthreads();  // the previous batch of staged indices is consumed
      if (static_cast<int>(threadIdx.x) < count) {
        staged[threadIdx.x] = rows[pos0 + threadIdx.x];
      }
      __syncthreads();
      for (int t = 0; t < count; ++t) {
        const int64_t j = staged[t];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if (ok[k]) {
            const float value = c[k] < channels ? static_cast<float>(batch_values[j * channels + c[k]]) : 1.0f;
            acc[k] += static_cast<float>(batch_weights[j * width + a[k]]) * value;
          }
        }
      }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (ok[k]) {
        table[a[k] * columns + c[k]] = acc[k];
      }
    }
  }
}

// One warp per lookup row (b, i) of pass0, then of pass1, owning out[b, i] (and plain_out[b, i]).
// For each 128-column tile: acc = 0 on the first chunk of hashes (else the out row: the sums of
// earlier chunks), then for each hash of the view in order, a heavy bucket contributes sum_a lw[a] *
// table[a][:], a light one sum over its rows j in sorted order of (lw . w_j) v_j; the last chunk
// multiplies by scale / m. The plain output's tiles follow: each hash adds a heavy bucket's
// table[:][channels], or a light one's rows' w_j. A padded lookup row gets zeros.
template <typename scalar_t, typename Buckets>
__global__ void __launch_bounds__(kBlock, 3) weighted_lookup_kernel(WeightedPass<scalar_t, Buckets> pass0,
                                                                    WeightedPass<scalar_t, Buckets> pass1,
                                                                    int64_t lookups0, int64_t lookups, int64_t width,
                                                                    int num_hashes, bool first, bool last) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (warp >= lookups) {
    return;  // warp-uniform
  }
  const bool second = warp >= lookups0;
  const WeightedPass<scalar_t, Buckets>& pass = pick(pass0, pass1, second);
  const Buckets& buckets = pass.buckets;
  const int64_t row = second ? warp - lookups0 : warp;
  const int64_t channels = pass.channels;
  const int* row_codes = pass.lookup_codes + row * num_hashes;
  assert_codes_in_range(row_codes, buckets.h0, buckets.hc, buckets.hash_bits, pass.lookup_queries, lane);
  float* out_row = pass.out + row * channels;
  float* plain_row = pass.plain_out == nullptr ? nullptr : pass.plain_out + row * width;
  if (!pass.lookup_mask[row]) {  // warp-uniform
    for (int64_t column = lane; first && column < channels; column += kWarp) {
      out_row[column] = 0.0f;
    }
    for (int64_t a = lane; first && plain_row != nullptr && a < width; a += kWarp) {
      plain_row[a] = 0.0f;
    }
    return;
  }
  const int64_t b = row / pass.num_lookups;
  const scalar_t* lw = pass.lookup_weights + row * width;
  const scalar_t* batch_weights = pass.weights + b * buckets.num_rows * width;
  const scalar_t* batch_values = pass.values + b * buckets.num_rows * channels;
  float lw_lane[kLaneColumns];  // lw[lane + 32 k], the first 128 weights
#pragma unroll
  for (int k = 0; k < kLaneColumns; ++k) {
    const int64_t a = lane + k * kWarp;
    lw_lane[k] = a < width ? static_cast<float>(lw[a]) : 0.0f;
  }
  const int64_t columns = pass.table_columns;
  const int64_t entries = width * columns;

  for (int64_t tile = 0; tile < channels; tile += kTileColumns) {
    float acc[kLaneColumns];
#pragma unroll
    for (int k = 0; k < kLaneColumns; ++k) {
      const int64_t column = tile + lane + k * kWarp;
      acc[k] = !first && column < channels ? out_row[column] : 0.0f;
    }
    for (int hl = 0; hl < buckets.hc; ++hl) {
      int64_t segment, lo, hi;
      if (!buckets.find(b, hl, row_codes[buckets.h0 + hl], segment, lo, hi)) {
        continue;
      }
      float contribution[kLaneColumns];
#pragma unroll
      for (int k = 0; k < kLaneColumns; ++k) {
        contribution[k] = 0.0f;
      }
      if (hi - lo > pass.heavy) {
        const float* table = pass.tables + (segment * pass.slots + lo / (pass.heavy + 1)) * entries;
        for (int64_t a = 0; a < width; ++a) {
          const float weight = static_cast<float>(lw[a]);
#pragma unroll
          for (int k = 0; k < kLaneColumns; ++k) {
            const int64_t column = tile + lane + k * kWarp;
            if (column < channels) {
              contribution[k] += weight * table[a * columns + column];
            }
          }
        }
      } else {
        const int* rows = buckets.segment_rows(segment);
        for (int64_t pos0 = lo; pos0 < hi; pos0 += kWarp) {
          const int count = static_cast<int>(min64(kWarp, hi - pos0));
          const int lane_j = lane < count ? rows[pos0 + lane] : 0;
          for (int t = 0; t < count; ++t) {
            const int64_t j = __shfl_sync(kFullMask, lane_j, t);
            const scalar_t* w = batch_weights + j * width;
            float dot = 0.0f;
#pragma unroll
            for (int k = 0; k < kLaneColumns; ++k) {
              const int64_t a = lane + k * kWarp;
              if (a < width) {
                dot += lw_lane[k] * static_cast<float>(w[a]);
              }
            }
            for (int64_t a = kTileColumns + lane; a < width; a += kWarp) {
              dot += static_cast<float>(lw[a]) * static_cast<float>(w[a]);
            }
            dot = warp_sum(dot);
            const scalar_t* v = batch_values + j * channels;
#pragma unroll
            for (int k = 0; k < kLaneColumns; ++k) {
              const int64_t column = tile + lane + k * kWarp;
              if (column < channels) {
                contribution[k] += dot * static_cast<float>(v[column]);
              }
            }
          }
        }
      }
#pragma unroll
      for (int k = 0; k < kLaneColumns; ++k) {
        acc[k] += contribution[k];
      }
    }
#pragma unroll
    for (int k = 0; k < kLaneColumns; ++k) {
      const int64_t column = tile + lane + k * kWarp;
      if (column < channels) {
        out_row[column] = last ? acc[k] / static_cast<float>(num_hashes) * pass.scale : acc[k];
      }
    }
  }

  for (int64_t tile = 0; plain_row != nullptr && tile < width; tile += kTileColumns) {  // warp-uniform
    float acc[kLaneColumns];
#pragma unroll
    for (int k = 0; k < kLaneColumns; ++k) {
      const int64_t a = tile + lane + k * kWarp;
      acc[k] = !first && a < width ? plain_row[a] : 0.0f;
    }
    for (int hl = 0; hl < buckets.hc; ++hl) {
      int64_t segment, lo, hi;
      if (!buckets.find(b, hl, row_codes[buckets.h0 + hl], segment, lo, hi)) {
        continue;
      }
      float sum[kLaneColumns];
      if (hi - lo > pass.heavy) {
        const float* table = pass.tables + (segment * pass.slots + lo / (pass.heavy + 1)) * entries;
#pragma unroll
        for (int k = 0; k < kLaneColumns; ++k) {
          const int64_t a = tile + lane + k * kWarp;
          sum[k] = a < width ? table[a * columns + channels] : 0.0f;
        }
      } else {
        sum_bucket_rows(buckets.segment_rows(segment), lo, hi, batch_weights, width, tile, lane, sum);
      }
#pragma unroll
      for (int k = 0; k < kLaneColumns; ++k) {
        acc[k] += sum[k];
      }
    }
#pragma unroll
    for (int k = 0; k < kLaneColumns; ++k) {
      const int64_t a = tile + lane + k * kWarp;
      if (a < width) {
        plain_row[a] = last ? acc[k] / static_cast<float>(num_hashes) : acc[k];
      }
    }
  }
}

// One warp per query (b, i), owning out[b, i]. For each 128-column tile of d: acc = 0 on the first
// chunk of hashes (else the out row), then for each hash h of the view in order, each key j of the
// query's bucket in sorted order, unless (q, j) collides in an earlier hash h' < h:
// acc += (qw . kw_j) f'(0.99 qv . kv_j) kv_j. A padded query gets zeros.
template <typename scalar_t, typename Buckets>
__global__ void __launch_bounds__(kBlock, 3) collided_gradient_kernel(
    Buckets buckets, const int* __restrict__ query_codes, const bool* __restrict__ query_mask,
    const scalar_t* __restrict__ query_vectors, const scalar_t* __restrict__ query_weights,
    const int* __restrict__ key_codes, const scalar_t* __restrict__ key_vectors, const scalar_t* __restrict__ key_weights,
    float* __restrict__ out, int64_t num_queries_total, int64_t num_queries, int64_t dim, int64_t width, int num_hashes,
    bool first) {
  const int64_t query = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (query >= num_queries_total) {
    return;  // warp-uniform
  }
  const int* q_codes = query_codes + query * num_hashes;
  const int hash_bits = buckets.hash_bits;
  assert_codes_in_range(q_codes, buckets.h0, buckets.hc, hash_bits, true, lane);
  float* out_row = out + query * dim;
  if (!query_mask[query]) {  // warp-uniform
    for (int64_t column = lane; first && column < dim; column += kWarp) {
      out_row[column] = 0.0f;
    }
    return;
  }
  const int64_t num_keys = buckets.num_rows;
  const int64_t b = query / num_queries;
  const unsigned code_mask = (1u << hash_bits) - 1u;
  const scalar_t* qv = query_vectors + query * dim;
  const scalar_t* qw = query_weights + query * width;
  const scalar_t* batch_vectors = key_vectors + b * num_keys * dim;
  const scalar_t* batch_weights = key_weights + b * num_keys * width;
  const int* batch_codes = key_codes + b * num_keys * num_hashes;
  float qv_lane[kLaneColumns], qw_lane[kLaneColumns];
#pragma unroll
  for (int k = 0; k < kLaneColumns; ++k) {
    const int64_t a = lane + k * kWarp;
    qv_lane[k] = a < dim ? static_cast<float>(qv[a]) : 0.0f;
    qw_lane[k] = a < width ? static_cast<float>(qw[a]) : 0.0f;
  }
  const float tau = static_cast<float>(hash_bits);
  const float power = static_cast<float>(hash_bits - 1);

  for (int64_t tile = 0; tile < dim; tile += kTileColumns) {
    float acc[kLaneColumns];
#pragma unroll
    for (int k = 0; k < kLaneColumns; ++k) {
      const int64_t column = tile + lane + k * kWarp;
      acc[k] = !first && column < dim ? out_row[column] : 0.0f;
    }
    for (int hl = 0; hl < buckets.hc; ++hl) {
      const int h = buckets.h0 + hl;
      int64_t segment, lo, hi;
      if (!buckets.find(b, hl, q_codes[h], segment, lo, hi)) {
        continue;
      }
      const int* rows = buckets.segment_rows(segment);
      for (int64_t pos0 = lo; pos0 < hi; pos0 += kWarp) {
        const int count = static_cast<int>(min64(kWarp, hi - pos0));
        const int lane_j = lane < count ? rows[pos0 + lane] : 0;
        for (int t = 0; t < count; ++t) {
          const int64_t j = __shfl_sync(kFullMask, lane_j, t);
          // Counted only in its first colliding hash (warp-uniform decision).
          bool earlier = false;
          for (int h_first = 0; h_first < h && !earlier; h_first += kWarp) {
            const int h_lane = h_first + lane;
            const bool equal = h_lane < h &&
                ((static_cast<unsigned>(q_codes[h_lane]) ^ static_cast<unsigned>(batch_codes[j * num_hashes + h_lane])) & code_mask) == 0u;
            earlier = __any_sync(kFullMask, equal);
          }
          if (earlier) {
            continue;
          }
          const scalar_t* kv = batch_vectors + j * dim;
          const scalar_t* kw = batch_weights + j * width;
          float kv_lane[kLaneColumns];
          float dot_v = 0.0f, dot_w = 0.0f;
#pragma unroll
          for (int k = 0; k < kLaneColumns; ++k) {
            const int64_t a = lane + k * kWarp;
            kv_lane[k] = a < dim ? static_cast<float>(kv[a]) : 0.0f;
            dot_v += qv_lane[k] * kv_lane[k];
            if (a < width) {
              dot_w += qw_lane[k] * static_cast<float>(kw[a]);
            }
          }
          for (int64_t a = kTileColumns + lane; a < dim; a += kWarp) {
            dot_v += static_cast<float>(qv[a]) * static_cast<float>(kv[a]);
          }
          for (int64_t a = kTileColumns + lane; a < width; a += kWarp) {
            dot_w += static_cast<float>(qw[a]) * static_cast<float>(kw[a]);
          }
          dot_v = warp_sum(dot_v);
          dot_w = warp_sum(dot_w);
          const float x = dot_v * kShrink;
          const float p = 1.0f - acosf(x) / kPi;
          const float derivative = tau * powf(p, power) / (kPi * sqrtf(1.0f - x * x));
          const float coefficient = dot_w * derivative;
#pragma unroll
          for (int k = 0; k < kLaneColumns; ++k) {
            const int64_t column = tile + lane + k * kWarp;
            if (column < dim) {
              acc[k] += coefficient * (tile == 0 ? kv_lane[k] : static_cast<float>(kv[column]));
            }
          }
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kLaneColumns; ++k) {
      const int64_t column = tile + lane + k * kWarp;
      if (column < dim) {
        out_row[column] = acc[k];
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Host side: checks and launches (the device-agnostic argument checks are checks.h's, shared with
// the CPU kernels)

using TensorArg = std::pair<const at::Tensor*, const char*>;

// Every tensor argument on one CUDA device, the first one's.
void check_device(std::initializer_list<TensorArg> tensors) {
  const at::Device device = tensors.begin()->first->device();
  for (const auto& [tensor, name] : tensors) {
    TORCH_CHECK_VALUE(tensor->is_cuda(), name, " must be a CUDA tensor, got one on ", tensor->device());
    TORCH_CHECK_VALUE(tensor->device() == device, name, " is on ", tensor->device(), ", the other arguments on ", device);
  }
}

// The sorted positions and row indices are int32.
void check_row_count(const at::Tensor& codes, const char* name) {
  TORCH_CHECK_VALUE(codes.size(0) * codes.size(1) <= std::numeric_limits<int32_t>::max(), "the CUDA kernels take at most ",
                    "2^31 - 1 rows over all batch rows, ", name, " has ", codes.size(0) * codes.size(1));
}

// An op's host-side checks, in the same order for every op: each of `tensors` on one CUDA device;
// then `check_args()`, the op's device-agnostic checks (its check_<...>_args of checks.h, shared
// with the CPU kernels); then the CUDA kernels' own limit on the rows of each of `codes`.
template <typename CheckArgs>
void check_op_args(std::initializer_list<TensorArg> tensors, const CheckArgs& check_args,
                   std::initializer_list<TensorArg> codes = {}) {
  check_device(tensors);
  check_args();
  for (const auto& [tensor, name] : codes) {
    check_row_count(*tensor, name);
  }
}

// Hash codes outside [0, 2^hash_bits) are an error, never truncated (bucket_key masks the code: a
// wrong code would silently join another bucket). The check runs on the device with no host
// synchronisation: a bad code fails a device-side assertion, as PyTorch's own index kernels
// (index_select, embedding, gather) do for a bad index. The op then returns no result the caller can
// use: the CUDA context is lost and the next synchronisation raises the assertion (at the op itself
// under CUDA_LAUNCH_BLOCKING=1). A host-side check with its readable ValueError would copy a flag to
// the host in every cumulation, three times per YOSO layer per training step; the CPU kernels and
// the reference keep that check (csrc/checks.h, argument_checks.check_codes_in_range), so the same codes
// give the readable error there. Codes from hash_codes are in range by construction.
__global__ void __launch_bounds__(kBlock) codes_in_range_kernel(const int* __restrict__ codes, int64_t count, int hash_bits,
                                                                bool query_side) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) {
    const bool in_range = (static_cast<unsigned>(codes[i]) >> hash_bits) == 0u;
    CUDA_KERNEL_ASSERT_MSG(in_range || !query_side,
                           "query_codes holds hash codes outside [0, 2^hash_bits): codes must come from hash_codes with the "
                           "same hash_bits");
    CUDA_KERNEL_ASSERT_MSG(in_range || query_side,
                           "key_codes holds hash codes outside [0, 2^hash_bits): codes must come from hash_codes with the "
                           "same hash_bits");
  }
}

// Rejects a query or key code outside [0, 2^hash_bits) on the device (see codes_in_range_kernel).
void check_codes_in_range(const at::Tensor& query_codes, const at::Tensor& key_codes, int hash_bits, cudaStream_t stream) {
  const at::Tensor* codes[2] = {&query_codes, &key_codes};
  for (int s = 0; s < 2; ++s) {
    if (codes[s]->numel() > 0) {
      codes_in_range_kernel<<<thread_grid(codes[s]->numel()), kBlock, 0, stream>>>(codes[s]->data_ptr<int>(),
                                                                                 codes[s]->numel(), hash_bits, s == 0);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  }
}

// Buckets of more than this many rows are contracted through an outer-product table. With heavy >=
// 2 w c / (w + c), enumerating a light bucket costs at most heavy (w + c) ~ 2 w c per lookup, about
// two table contractions; with heavy + 1 >= w c / kTableFloatsPerRow the tables (at most n / (heavy
// + 1) per segment) hold at most kTableFloatsPerRow floats per indexed row and hash.
int64_t heavy_threshold(int64_t width, int64_t channels) {
  const int64_t balanced = (2 * width * channels + width + channels - 1) / std::max<int64_t>(width + channels, 1);
  const int64_t bounded = (width * channels + kTableFloatsPerRow - 1) / kTableFloatsPerRow - 1;
  return std::max({static_cast<int64_t>(kHeavyMin), balanced, bounded});
}

// Scratch bytes per hash of a radix-path weighted cumulation over `rows` sorted rows per batch row:
// the sort's double buffers (24 bytes per row) and the heavy buckets' tables.
int64_t weighted_bytes_per_hash(int64_t batch, int64_t rows, int64_t width, int64_t channels) {
  const int64_t slots = rows / (heavy_threshold(width, channels) + 1);
  return batch * rows * 24 + batch * slots * 4 * width * channels;
}

// One direction of a weighted cumulation, as the host holds it (see WeightedPass).
struct WeightedDirection {
  const Side* lookup;              // the lookup rows' codes and mask
  const at::Tensor* lookup_weights;
  const at::Tensor* weights;       // the indexed rows'
  const at::Tensor* values;        // the indexed rows'
  at::Tensor* out;
  bool lookup_queries;
  at::Tensor* plain_out = nullptr;  // (B, nl, w): the sums of the indexed rows' weights, if wanted
  float scale = 1.0f;               // of out
};

// One or two directions of a weighted cumulation over `views` of their indexed sides (every hash,
// or one chunk of hashes [h0, h0 + hc)): the heavy buckets' tables of both in one launch, then the
// lookups of both in one launch. `first`: no earlier chunk wrote out; `last`: divide by m.
template <typename scalar_t, typename Buckets>
void run_weighted(const WeightedDirection* directions, const Buckets* views, int count, int64_t num_hashes, bool first,
                  bool last, cudaStream_t stream) {
  const int64_t width = directions[0].lookup_weights->size(2);
  WeightedPass<scalar_t, Buckets> passes[2];
  at::Tensor tables[2];
  int64_t slot_items[2] = {0, 0}, lookups[2] = {0, 0};
  int64_t entries_max = 0;
  for (int d = 0; d < count; ++d) {
    const WeightedDirection& direction = directions[d];
    const int64_t batch = direction.lookup->codes.size(0), num_lookups = direction.lookup->codes.size(1);
    const int64_t num_rows = direction.values->size(1), channels = direction.values->size(2);
    const bool plain = direction.plain_out != nullptr;
    const int64_t columns = channels + (plain ? 1 : 0);
    const bool any_output = direction.out->numel() > 0 || (plain && direction.plain_out->numel() > 0);
    const int64_t heavy = heavy_threshold(width, columns);
    const int64_t slots = any_output ? num_rows / (heavy + 1) : 0;
    slot_items[d] = batch * views[d].hc * slots;
    lookups[d] = any_output ? batch * num_lookups : 0;
    entries_max = std::max(entries_max, width * columns);
    tables[d] = at::empty({slot_items[d] * width * columns}, direction.out->options());
    passes[d] = WeightedPass<scalar_t, Buckets>{views[d],
                                                direction.lookup->codes.data_ptr<int>(),
                                                direction.lookup->mask.data_ptr<bool>(),
                                                direction.lookup_weights->data_ptr<scalar_t>(),
                                                direction.weights->data_ptr<scalar_t>(),
                                                direction.values->data_ptr<scalar_t>(),
                                                tables[d].data_ptr<float>(),
                                                direction.out->data_ptr<float>(),
                                                plain ? direction.plain_out->data_ptr<float>() : nullptr,
                                                num_lookups,
                                                channels,
                                                columns,
                                                heavy,
                                                slots,
                                                direction.scale,
                                                direction.lookup_queries};
  }
  if (count == 1) {
    passes[1] = passes[0];  // never read: no block or warp past the first direction's
  }
  const int64_t slot_total = slot_items[0] + slot_items[1];
  if (slot_total > 0 && entries_max > 0) {
    TORCH_CHECK(slot_total <= std::numeric_limits<int32_t>::max(), "yoso: too many bucket tables (", slot_total, ")");
    const int64_t groups = (entries_max + kTableOutputs - 1) / kTableOutputs;
    const dim3 grid(static_cast<unsigned>(slot_total), static_cast<unsigned>(std::min<int64_t>(groups, 65535)));
    heavy_bucket_tables_kernel<scalar_t, Buckets><<<grid, kBlock, 0, stream>>>(passes[0], passes[1], slot_items[0], width);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  const int64_t lookup_total = lookups[0] + lookups[1];
  if (lookup_total > 0) {
    weighted_lookup_kernel<scalar_t, Buckets><<<warp_grid(lookup_total), kBlock, 0, stream>>>(
        passes[0], passes[1], lookups[0], lookup_total, width, static_cast<int>(num_hashes), first, last);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

at::Tensor hash_codes_cuda(const at::Tensor& vectors_in, const at::Tensor& signs_in, int64_t num_hashes,
                           int64_t hash_bits) {
  check_op_args({{&vectors_in, "vectors"}, {&signs_in, "signs"}},
                [&] { check_hash_codes_args(vectors_in, signs_in, num_hashes, hash_bits); });
  const int64_t batch = vectors_in.size(0), length = vectors_in.size(1), dim = vectors_in.size(2);
  const int64_t rotations = signs_in.size(2), width = signs_in.size(3), per_rotation = width / hash_bits;
  TORCH_CHECK_VALUE(width <= kMaxWidth, "the CUDA hash_codes takes a Hadamard width (signs.size(3)) of at most ", kMaxWidth,
                    ", got ", width);
  TORCH_CHECK_VALUE(num_hashes <= std::numeric_limits<int32_t>::max() / 2, "num_hashes too large: ", num_hashes);

  auto codes = at::empty({batch, length, num_hashes}, vectors_in.options().dtype(at::kInt));
  const int64_t num_vectors = batch * length;
  if (num_vectors == 0) {
    return codes;
  }
  const c10::cuda::OptionalCUDAGuard guard(vectors_in.device());
  const at::Tensor vectors = vectors_in.contiguous();
  const at::Tensor signs = signs_in.contiguous();
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();

  const int64_t rotations_used = (num_hashes + per_rotation - 1) / per_rotation;
  // Up to kWarp * kMaxPerLane coordinates a vector stay in registers; a wider transform takes the
  // block's shared memory.
  const int64_t lanes = std::min<int64_t>(width, kWarp);
  const int64_t per_lane = width / lanes;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, vectors.scalar_type(), "yoso_hash_codes_cuda", [&] {
    if (per_lane <= kMaxPerLane) {
      const HashCodesArgs<scalar_t> a{vectors.data_ptr<scalar_t>(), signs.data_ptr<float>(), codes.data_ptr<int>(),
                                      num_vectors, length, static_cast<int>(dim), static_cast<int>(width),
                                      static_cast<int>(rotations), static_cast<int>(rotations_used),
                                      static_cast<int>(per_rotation), static_cast<int>(num_hashes),
                                      static_cast<int>(hash_bits)};
      const unsigned blocks = thread_grid(num_vectors * lanes);
      switch (per_lane) {
        case 1: hash_codes_warp_kernel<scalar_t, 1><<<blocks, kBlock, 0, stream>>>(a, static_cast<int>(lanes)); break;
        case 2: hash_codes_warp_kernel<scalar_t, 2><<<blocks, kBlock, 0, stream>>>(a, static_cast<int>(lanes)); break;
        case 4: hash_codes_warp_kernel<scalar_t, 4><<<blocks, kBlock, 0, stream>>>(a, static_cast<int>(lanes)); break;
        default: hash_codes_warp_kernel<scalar_t, kMaxPerLane><<<blocks, kBlock, 0, stream>>>(a, static_cast<int>(lanes));
      }
    } else {
      const int threads_per_vector = static_cast<int>(std::min<int64_t>(width / 2, kBlock));
      const int vectors_per_block = kBlock / threads_per_vector;
      const int64_t blocks = (num_vectors + vectors_per_block - 1) / vectors_per_block;
      TORCH_CHECK(blocks <= std::numeric_limits<int32_t>::max(), "yoso: too many vectors (", num_vectors, ")");
      const size_t shared_bytes = sizeof(float) * static_cast<size_t>(vectors_per_block) * static_cast<size_t>(width);
      hash_codes_kernel<scalar_t><<<static_cast<unsigned>(blocks), kBlock, shared_bytes, stream>>>(
          vectors.data_ptr<scalar_t>(), signs.data_ptr<float>(), codes.data_ptr<int>(), num_vectors, length,
          static_cast<int>(dim), static_cast<int>(width), static_cast<int>(rotations), static_cast<int>(rotations_used),
          static_cast<int>(per_rotation), static_cast<int>(num_hashes), static_cast<int>(hash_bits), threads_per_vector);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return codes;
}

// Whether a cumulation runs on the counting sort. YOSO_CUDA_CUMULATION=radix forces the radix path
// (its tests use it); otherwise the table of 2^tau bucket ends per hash must hold at most
// max(kCountingMinBuckets, 2 n) entries (n the longer indexed side), true for the LRA rule
// tau = ceil(log2 n). A larger tau, whose buckets hold about one row, takes the radix path rather
// than a table mostly empty.
bool use_counting_sort(int hash_bits, int64_t num_rows) {
  const char* text = std::getenv("YOSO_CUDA_CUMULATION");
  const std::string choice = text == nullptr ? "" : text;
  TORCH_CHECK_VALUE(choice.empty() || choice == "counting" || choice == "radix",
                    "YOSO_CUDA_CUMULATION must be 'counting' or 'radix', got '", choice, "'");
  return choice != "radix" && hash_bits <= 30 &&
         (int64_t(1) << hash_bits) <= std::max<int64_t>(kCountingMinBuckets, 2 * num_rows);
}

// The counting sort's index of one side: (B m, 2^tau) bucket ends and (B m, n) row indices.
struct BucketIndex {
  at::Tensor bucket_end, rows;
};

// Indexes every hash of one or two sides in one launch of bucket_index_kernel.
void index_buckets(const Side* sides, int num_sides, int hash_bits, BucketIndex* index, cudaStream_t stream) {
  const int64_t segments = sides[0].codes.size(0) * sides[0].codes.size(2);
  IndexedSide indexed[2];
  int64_t longest = 0;
  for (int s = 0; s < num_sides; ++s) {
    const int64_t length = sides[s].codes.size(1);
    longest = std::max(longest, length);
    index[s].bucket_end = at::empty({segments << hash_bits}, sides[s].codes.options());
    index[s].rows = at::empty({segments * length}, sides[s].codes.options());
    indexed[s] = IndexedSide{sides[s].codes.data_ptr<int>(), sides[s].mask.data_ptr<bool>(),
                             index[s].bucket_end.data_ptr<int>(), index[s].rows.data_ptr<int>(), length, sides[s].queries};
  }
  if (num_sides == 1) {
    indexed[1] = indexed[0];  // never read: no block past the first side's segments
  }
  if (segments > 0) {
    int round = 2;  // the rows sorted at a time: a power of two, at most kIndexRound
    while (round < longest && round < kIndexRound) {
      round *= 2;
    }
    TORCH_CHECK(num_sides * segments <= std::numeric_limits<int32_t>::max(), "yoso: too many hashes x batch rows (",
                num_sides * segments, ") for one launch");
    bucket_index_kernel<<<static_cast<unsigned>(num_sides * segments), kBlock, 0, stream>>>(
        indexed[0], indexed[1], segments, static_cast<int>(sides[0].codes.size(2)), hash_bits, round);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

CountingBuckets counting_view(const Side& side, const BucketIndex& index, int hash_bits) {
  return CountingBuckets{side.codes.data_ptr<int>(), index.bucket_end.data_ptr<int>(), index.rows.data_ptr<int>(),
                         side.codes.size(1), 0, static_cast<int>(side.codes.size(2)), hash_bits};
}

RadixBuckets radix_view(const SortedBuckets& sorted, int side, int64_t num_rows, int64_t h0, int64_t hc, int hash_bits) {
  return RadixBuckets{sorted.keys + sorted.offset[side], sorted.order + sorted.offset[side], num_rows,
                      sorted.segment0[side], static_cast<int>(h0), static_cast<int>(hc), hash_bits};
}

// Calls pass(views, first, last) with one bucket view per side (sides[0]: the keys): once over every
// hash with the counting sort's index where its 2^tau table fits (use_counting_sort), else once per
// chunk of hashes radix-sorted within the scratch budget, which one hash of a chunk takes
// bytes_per_hash of (the sort's buffers and the pass's own), first and last telling the chunk's
// place. query_codes: what the radix path's range check pairs with the keys' codes (the counting
// sort's kernels check their own).
template <typename Pass>
void over_bucket_views(const Side* sides, int num_sides, const at::Tensor& query_codes, int hash_bits,
                       int64_t bytes_per_hash, cudaStream_t stream, const Pass& pass) {
  const int64_t batch = sides[0].codes.size(0), num_hashes = sides[0].codes.size(2);
  int64_t rows = 0, longest = 0;
  for (int s = 0; s < num_sides; ++s) {
    rows += sides[s].codes.size(1);
    longest = std::max(longest, sides[s].codes.size(1));
  }
  if (use_counting_sort(hash_bits, longest)) {
    BucketIndex index[2];
    index_buckets(sides, num_sides, hash_bits, index, stream);
    CountingBuckets views[2] = {};
    for (int s = 0; s < num_sides; ++s) {
      views[s] = counting_view(sides[s], index[s], hash_bits);
    }
    pass(views, true, true);
    return;
  }
  check_codes_in_range(query_codes, sides[0].codes, hash_bits, stream);
  const int64_t hc_max = hashes_per_chunk(num_hashes, batch * rows, bytes_per_hash);
  for (int64_t h0 = 0; h0 < num_hashes; h0 += hc_max) {
    const int64_t hc = std::min(hc_max, num_hashes - h0);
    const SortedBuckets sorted = sort_buckets(sides, num_sides, batch, num_hashes, h0, hc, hash_bits, stream);
    RadixBuckets views[2] = {};
    for (int s = 0; s < num_sides; ++s) {
      views[s] = radix_view(sorted, s, sides[s].codes.size(1), h0, hc, hash_bits);
    }
    pass(views, h0 == 0, h0 + hc == num_hashes);
  }
}

// lsh_cumulation by counting sort: three launches (bucket_index_kernel, heavy_bucket_sums_kernel,
// bucket_lookup_kernel), the values read in their own dtype, the output written whole.
at::Tensor lsh_cumulation_counting(const at::Tensor& query_codes, const at::Tensor& query_mask, const Side& keys,
                                   const at::Tensor& values, int hash_bits, cudaStream_t stream) {
  const int64_t batch = query_codes.size(0), num_queries = query_codes.size(1), num_keys = keys.codes.size(1);
  const int64_t num_hashes = query_codes.size(2), channels = values.size(2);
  auto out = at::empty({batch, num_queries, channels}, values.options().dtype(at::kFloat));
  if (out.numel() == 0) {
    check_codes_in_range(query_codes, keys.codes, hash_bits, stream);  // nothing to look up, but bad codes still fail
    return out;
  }
  const int64_t segments = batch * num_hashes;
  const int64_t slots = num_keys / (kHeavyMin + 1);
  BucketIndex index;
  index_buckets(&keys, 1, hash_bits, &index, stream);
  const CountingBuckets view = counting_view(keys, index, hash_bits);
  at::Tensor heavy_sums = at::empty({segments * slots * channels}, out.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, values.scalar_type(), "yoso_lsh_cumulation_counting", [&] {
    if (segments * slots > 0) {
      heavy_bucket_sums_kernel<scalar_t><<<warp_grid(segments * slots), kBlock, 0, stream>>>(
          view, values.data_ptr<scalar_t>(), heavy_sums.data_ptr<float>(), segments * slots, slots, channels);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    bucket_lookup_kernel<scalar_t><<<warp_grid(batch * num_queries), kBlock, 0, stream>>>(
        view, query_codes.data_ptr<int>(), query_mask.data_ptr<bool>(), values.data_ptr<scalar_t>(),
        heavy_sums.data_ptr<float>(), out.data_ptr<float>(), batch * num_queries, num_queries, channels, slots,
        static_cast<int>(num_hashes));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

at::Tensor lsh_cumulation_cuda(const at::Tensor& query_codes_in, const at::Tensor& query_mask_in,
                               const at::Tensor& key_codes_in, const at::Tensor& key_mask_in, const at::Tensor& values_in,
                               int64_t hash_bits) {
  check_op_args({{&query_codes_in, "query_codes"}, {&query_mask_in, "query_mask"}, {&key_codes_in, "key_codes"},
                 {&key_mask_in, "key_mask"}, {&values_in, "values"}},
                [&] {
                  check_cumulation_args(query_codes_in, query_mask_in, key_codes_in, key_mask_in, values_in, hash_bits);
                },
                {{&query_codes_in, "query_codes"}, {&key_codes_in, "key_codes"}});
  const int64_t batch = query_codes_in.size(0), num_queries = query_codes_in.size(1);
  const int64_t num_keys = key_codes_in.size(1), num_hashes = query_codes_in.size(2), channels = values_in.size(2);
  const int tau = static_cast<int>(hash_bits);

  const c10::cuda::OptionalCUDAGuard guard(query_codes_in.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const Side keys{key_codes_in.contiguous(), key_mask_in.contiguous(), false};
  const at::Tensor query_codes = query_codes_in.contiguous(), query_mask = query_mask_in.contiguous();
  if (use_counting_sort(tau, num_keys)) {
    return lsh_cumulation_counting(query_codes, query_mask, keys, values_in.contiguous(), tau, stream);
  }
  check_codes_in_range(query_codes, keys.codes, tau, stream);
  auto out = at::zeros({batch, num_queries, channels}, values_in.options().dtype(at::kFloat));
  if (batch == 0 || num_queries == 0 || num_keys == 0 || channels == 0) {
    return out;
  }
  const at::Tensor values = values_in.contiguous();

  const int64_t hc_max = hashes_per_chunk(num_hashes, batch * num_keys, batch * num_keys * (24 + 4 * channels));
  for (int64_t h0 = 0; h0 < num_hashes; h0 += hc_max) {
    const int64_t hc = std::min(hc_max, num_hashes - h0);
    const SortedBuckets sorted = sort_buckets(&keys, 1, batch, num_hashes, h0, hc, tau, stream);
    const int64_t total = batch * hc * num_keys;
    at::Tensor partial = at::empty({total, channels}, out.options());
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, values.scalar_type(), "yoso_lsh_cumulation_cuda", [&] {
      bucket_piece_sums_kernel<scalar_t><<<warp_grid(total), kBlock, 0, stream>>>(
          sorted.keys, sorted.order, values.data_ptr<scalar_t>(), partial.data_ptr<float>(), total, num_keys, channels,
          static_cast<int>(hc), tau);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    cumulation_query_kernel<<<warp_grid(batch * num_queries), kBlock, 0, stream>>>(
        query_codes.data_ptr<int>(), query_mask.data_ptr<bool>(), sorted.keys, partial.data_ptr<float>(),
        out.data_ptr<float>(), batch * num_queries, num_queries, num_keys, channels, static_cast<int>(num_hashes),
        static_cast<int>(h0), static_cast<int>(hc), tau, sorted.segment0[0], h0 + hc == num_hashes);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return out;
}

at::Tensor lsh_weighted_cumulation_cuda(const at::Tensor& query_codes_in, const at::Tensor& query_mask_in,
                                        const at::Tensor& query_weights_in, const at::Tensor& key_codes_in,
                                        const at::Tensor& key_mask_in, const at::Tensor& key_weights_in,
                                        const at::Tensor& values_in, int64_t hash_bits) {
  check_op_args({{&query_codes_in, "query_codes"}, {&query_mask_in, "query_mask"}, {&query_weights_in, "query_weights"},
                 {&key_codes_in, "key_codes"}, {&key_mask_in, "key_mask"}, {&key_weights_in, "key_weights"},
                 {&values_in, "values"}},
                [&] {
                  check_weighted_args(query_codes_in, query_mask_in, query_weights_in, key_codes_in, key_mask_in,
                                      key_weights_in, values_in, hash_bits);
                },
                {{&query_codes_in, "query_codes"}, {&key_codes_in, "key_codes"}});
  const int64_t batch = query_codes_in.size(0), num_queries = query_codes_in.size(1), num_keys = key_codes_in.size(1);
  const int64_t num_hashes = query_codes_in.size(2), channels = values_in.size(2);
  const int tau = static_cast<int>(hash_bits);

  const c10::cuda::OptionalCUDAGuard guard(query_codes_in.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const Side queries{query_codes_in.contiguous(), query_mask_in.contiguous(), true};
  const Side keys{key_codes_in.contiguous(), key_mask_in.contiguous(), false};
  auto out = at::empty({batch, num_queries, channels}, values_in.options().dtype(at::kFloat));
  if (out.numel() == 0) {
    check_codes_in_range(queries.codes, keys.codes, tau, stream);  // nothing to look up, but bad codes still fail
    return out;
  }
  const auto type = at::promote_types(at::promote_types(query_weights_in.scalar_type(), key_weights_in.scalar_type()),
                                      values_in.scalar_type());
  const at::Tensor query_weights = query_weights_in.to(type).contiguous();
  const at::Tensor key_weights = key_weights_in.to(type).contiguous();
  const at::Tensor values = values_in.to(type).contiguous();
  const WeightedDirection direction{&queries, &query_weights, &key_weights, &values, &out, true};

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, type, "yoso_lsh_weighted_cumulation_cuda", [&] {
    const int64_t bytes_per_hash = weighted_bytes_per_hash(batch, num_keys, query_weights.size(2), channels);
    over_bucket_views(&keys, 1, queries.codes, tau, bytes_per_hash, stream, [&](const auto* views, bool first, bool last) {
      run_weighted<scalar_t>(&direction, views, 1, num_hashes, first, last, stream);
    });
  });
  return out;
}

// Both sides of the weighted cumulation (YOSO's lower-bound grad Q and grad K, which share the pair
// weights s_ij = qw_i . kw_j): query_out_i = sum_j s_ij key_values_j over i's bucket among the keys
// and key_out_j = sum_i s_ij query_values_i over j's bucket among the queries. Both sides are indexed
// in one launch (or sorted in one radix sort per chunk), then each step runs for both directions at once.
std::tuple<at::Tensor, at::Tensor> lsh_weighted_cumulation_both_cuda(
    const at::Tensor& query_codes_in, const at::Tensor& query_mask_in, const at::Tensor& query_weights_in,
    const at::Tensor& query_values_in, const at::Tensor& key_codes_in, const at::Tensor& key_mask_in,
    const at::Tensor& key_weights_in, const at::Tensor& key_values_in, int64_t hash_bits) {
  check_op_args({{&query_codes_in, "query_codes"}, {&query_mask_in, "query_mask"}, {&query_weights_in, "query_weights"},
                 {&query_values_in, "query_values"}, {&key_codes_in, "key_codes"}, {&key_mask_in, "key_mask"},
                 {&key_weights_in, "key_weights"}, {&key_values_in, "key_values"}},
                [&] {
                  check_weighted_both_args(query_codes_in, query_mask_in, query_weights_in, query_values_in, key_codes_in,
                                           key_mask_in, key_weights_in, key_values_in, hash_bits);
                },
                {{&query_codes_in, "query_codes"}, {&key_codes_in, "key_codes"}});
  const int64_t batch = query_codes_in.size(0), num_queries = query_codes_in.size(1), num_keys = key_codes_in.size(1);
  const int64_t num_hashes = query_codes_in.size(2), width = query_weights_in.size(2);
  const int64_t query_channels = query_values_in.size(2), key_channels = key_values_in.size(2);
  const int tau = static_cast<int>(hash_bits);

  const c10::cuda::OptionalCUDAGuard guard(query_codes_in.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const Side sides[2] = {{key_codes_in.contiguous(), key_mask_in.contiguous(), false},
                         {query_codes_in.contiguous(), query_mask_in.contiguous(), true}};
  const Side& keys = sides[0];
  const Side& queries = sides[1];
  auto query_out = at::empty({batch, num_queries, key_channels}, key_values_in.options().dtype(at::kFloat));
  auto key_out = at::empty({batch, num_keys, query_channels}, query_values_in.options().dtype(at::kFloat));
  if (query_out.numel() == 0 && key_out.numel() == 0) {
    check_codes_in_range(queries.codes, keys.codes, tau, stream);  // nothing to look up, but bad codes still fail
    return {query_out, key_out};
  }
  const auto type = at::promote_types(at::promote_types(query_weights_in.scalar_type(), key_weights_in.scalar_type()),
                                      at::promote_types(query_values_in.scalar_type(), key_values_in.scalar_type()));
  const at::Tensor query_weights = query_weights_in.to(type).contiguous();
  const at::Tensor query_values = query_values_in.to(type).contiguous();
  const at::Tensor key_weights = key_weights_in.to(type).contiguous();
  const at::Tensor key_values = key_values_in.to(type).contiguous();
  // Direction 0 looks the queries up among the keys (side 0), direction 1 the keys among the queries.
  const WeightedDirection directions[2] = {{&queries, &query_weights, &key_weights, &key_values, &query_out, true},
                                           {&keys, &key_weights, &query_weights, &query_values, &key_out, false}};

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, type, "yoso_lsh_weighted_cumulation_both_cuda", [&] {
    const int64_t bytes_per_hash = weighted_bytes_per_hash(batch, num_keys, width, key_channels) +
                                   weighted_bytes_per_hash(batch, num_queries, width, query_channels);
    over_bucket_views(sides, 2, queries.codes, tau, bytes_per_hash, stream, [&](const auto* views, bool first, bool last) {
      run_weighted<scalar_t>(directions, views, 2, num_hashes, first, last, stream);
    });
  });
  return {query_out, key_out};
}

// YOSO's lower-bound backward in one pass (see lsh_lower_bound_gradients in ../yoso.cpp): the
// queries and the keys indexed in one launch, the heavy buckets' tables of both directions in one
// (the key direction's with a column of ones, whose entries are grad V's bucket sums), both
// directions' lookups in one, the keys' rows writing grad K and grad V together.
std::tuple<at::Tensor, at::Tensor, at::Tensor> lsh_lower_bound_gradients_cuda(
    const at::Tensor& query_codes_in, const at::Tensor& query_mask_in, const at::Tensor& query_vectors_in,
    const at::Tensor& query_weights_in, const at::Tensor& key_codes_in, const at::Tensor& key_mask_in,
    const at::Tensor& key_vectors_in, const at::Tensor& key_weights_in, int64_t hash_bits) {
  check_op_args({{&query_codes_in, "query_codes"}, {&query_mask_in, "query_mask"}, {&query_vectors_in, "query_vectors"},
                 {&query_weights_in, "query_weights"}, {&key_codes_in, "key_codes"}, {&key_mask_in, "key_mask"},
                 {&key_vectors_in, "key_vectors"}, {&key_weights_in, "key_weights"}},
                [&] {
                  check_pair_args(query_codes_in, query_mask_in, query_vectors_in, query_weights_in, key_codes_in,
                                  key_mask_in, key_vectors_in, key_weights_in, hash_bits);
                },
                {{&query_codes_in, "query_codes"}, {&key_codes_in, "key_codes"}});
  const int64_t batch = query_codes_in.size(0), num_queries = query_codes_in.size(1), num_keys = key_codes_in.size(1);
  const int64_t num_hashes = query_codes_in.size(2), dim = query_vectors_in.size(2), width = query_weights_in.size(2);
  const int tau = static_cast<int>(hash_bits);

  const c10::cuda::OptionalCUDAGuard guard(query_codes_in.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const Side sides[2] = {{key_codes_in.contiguous(), key_mask_in.contiguous(), false},
                         {query_codes_in.contiguous(), query_mask_in.contiguous(), true}};
  const Side& keys = sides[0];
  const Side& queries = sides[1];
  const auto options = query_vectors_in.options().dtype(at::kFloat);
  auto grad_queries = at::empty({batch, num_queries, dim}, options);
  auto grad_keys = at::empty({batch, num_keys, dim}, options);
  auto grad_key_weights = at::empty({batch, num_keys, width}, options);
  if (grad_queries.numel() == 0 && grad_keys.numel() == 0 && grad_key_weights.numel() == 0) {
    check_codes_in_range(queries.codes, keys.codes, tau, stream);  // nothing to look up, but bad codes still fail
    return {grad_queries, grad_keys, grad_key_weights};
  }
  const auto type = at::promote_types(
      at::promote_types(query_vectors_in.scalar_type(), query_weights_in.scalar_type()),
      at::promote_types(key_vectors_in.scalar_type(), key_weights_in.scalar_type()));
  const at::Tensor query_vectors = query_vectors_in.to(type).contiguous();
  const at::Tensor query_weights = query_weights_in.to(type).contiguous();
  const at::Tensor key_vectors = key_vectors_in.to(type).contiguous();
  const at::Tensor key_weights = key_weights_in.to(type).contiguous();
  const float half_tau = static_cast<float>(tau) / 2.0f;
  // Direction 0 looks the queries up among the keys, direction 1 the keys among the queries.
  const WeightedDirection directions[2] = {
      {&queries, &query_weights, &key_weights, &key_vectors, &grad_queries, true, nullptr, half_tau},
      {&keys, &key_weights, &query_weights, &query_vectors, &grad_keys, false, &grad_key_weights, half_tau}};

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, type, "yoso_lsh_lower_bound_gradients_cuda", [&] {
    const int64_t bytes_per_hash = weighted_bytes_per_hash(batch, num_keys, width, dim) +
                                   weighted_bytes_per_hash(batch, num_queries, width, dim + 1);
    over_bucket_views(sides, 2, queries.codes, tau, bytes_per_hash, stream, [&](const auto* views, bool first, bool last) {
      run_weighted<scalar_t>(directions, views, 2, num_hashes, first, last, stream);
    });
  });
  return {grad_queries, grad_keys, grad_key_weights};
}

at::Tensor lsh_collided_gradient_cuda(const at::Tensor& query_codes_in, const at::Tensor& query_mask_in,
                                      const at::Tensor& query_vectors_in, const at::Tensor& query_weights_in,
                                      const at::Tensor& key_codes_in, const at::Tensor& key_mask_in,
                                      const at::Tensor& key_vectors_in, const at::Tensor& key_weights_in,
                                      int64_t hash_bits) {
  check_op_args({{&query_codes_in, "query_codes"}, {&query_mask_in, "query_mask"}, {&query_vectors_in, "query_vectors"},
                 {&query_weights_in, "query_weights"}, {&key_codes_in, "key_codes"}, {&key_mask_in, "key_mask"},
                 {&key_vectors_in, "key_vectors"}, {&key_weights_in, "key_weights"}},
                [&] {
                  check_pair_args(query_codes_in, query_mask_in, query_vectors_in, query_weights_in, key_codes_in,
                                  key_mask_in, key_vectors_in, key_weights_in, hash_bits);
                },
                {{&query_codes_in, "query_codes"}, {&key_codes_in, "key_codes"}});
  const int64_t batch = query_codes_in.size(0), num_queries = query_codes_in.size(1), num_keys = key_codes_in.size(1);
  const int64_t num_hashes = query_codes_in.size(2), dim = query_vectors_in.size(2), width = query_weights_in.size(2);
  const int tau = static_cast<int>(hash_bits);

  const c10::cuda::OptionalCUDAGuard guard(query_codes_in.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const Side keys{key_codes_in.contiguous(), key_mask_in.contiguous(), false};
  const at::Tensor query_codes = query_codes_in.contiguous(), query_mask = query_mask_in.contiguous();
  auto out = at::empty({batch, num_queries, dim}, query_vectors_in.options().dtype(at::kFloat));
  if (out.numel() == 0) {
    check_codes_in_range(query_codes, keys.codes, tau, stream);  // nothing to look up, but bad codes still fail
    return out;
  }
  const auto type = at::promote_types(
      at::promote_types(query_vectors_in.scalar_type(), query_weights_in.scalar_type()),
      at::promote_types(key_vectors_in.scalar_type(), key_weights_in.scalar_type()));
  const at::Tensor query_vectors = query_vectors_in.to(type).contiguous();
  const at::Tensor query_weights = query_weights_in.to(type).contiguous();
  const at::Tensor key_vectors = key_vectors_in.to(type).contiguous();
  const at::Tensor key_weights = key_weights_in.to(type).contiguous();

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, type, "yoso_lsh_collided_gradient_cuda", [&] {
    const auto launch = [&](const auto& view, bool first) {
      collided_gradient_kernel<scalar_t, std::decay_t<decltype(view)>><<<warp_grid(batch * num_queries), kBlock, 0, stream>>>(
          view, query_codes.data_ptr<int>(), query_mask.data_ptr<bool>(), query_vectors.data_ptr<scalar_t>(),
          query_weights.data_ptr<scalar_t>(), keys.codes.data_ptr<int>(), key_vectors.data_ptr<scalar_t>(),
          key_weights.data_ptr<scalar_t>(), out.data_ptr<float>(), batch * num_queries, num_queries, dim, width,
          static_cast<int>(num_hashes), first);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    over_bucket_views(&keys, 1, query_codes, tau, batch * num_keys * 24, stream,
                      [&](const auto* views, bool first, bool) { launch(views[0], first); });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(yoso, CUDA, m) {
  m.impl("hash_codes", &hash_codes_cuda);
  m.impl("lsh_cumulation", &lsh_cumulation_cuda);
  m.impl("lsh_weighted_cumulation", &lsh_weighted_cumulation_cuda);
  m.impl("lsh_weighted_cumulation_both", &lsh_weighted_cumulation_both_cuda);
  m.impl("lsh_collided_gradient", &lsh_collided_gradient_cuda);
  m.impl("lsh_lower_bound_gradients", &lsh_lower_bound_gradients_cuda);
}

}  // namespace yoso
