// The ops' argument checks, shared by the CPU kernels (yoso.cpp) and the CUDA kernels
// (cuda/yoso_cuda.cu), so that both reject the same inputs in the same words: one function per op
// (check_<...>_args), each called first by that op's kernels. The pure-PyTorch reference calls the
// functions of the same names in yoso_cuda/argument_checks.py, which word every message as here
// (tests/yoso_cuda/test_argument_checks.py holds all backends to the same messages).

#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <string>

namespace yoso {

constexpr int64_t kMaxHashBits = 30;  // codes are int32

inline void check_hash_bits(int64_t hash_bits) {
  TORCH_CHECK_VALUE(hash_bits >= 1 && hash_bits <= kMaxHashBits, "hash_bits must be in [1, ", kMaxHashBits,
                    "] (int32 codes), got ", hash_bits);
}

inline void check_codes(const at::Tensor& codes, const char* name) {
  TORCH_CHECK_VALUE(codes.dim() == 3 && codes.scalar_type() == at::kInt, name,
                    " must be an int32 tensor of shape (B, n, num_hashes), got ", codes.scalar_type(), " ", codes.sizes());
}

inline void check_mask(const at::Tensor& mask, const at::Tensor& codes, const char* name) {
  TORCH_CHECK_VALUE(mask.scalar_type() == at::kBool && mask.dim() == 2 && mask.size(0) == codes.size(0) &&
                        mask.size(1) == codes.size(1),
                    name, " must be a bool tensor of shape (B, n) = ", codes.sizes().slice(0, 2), ", got ",
                    mask.scalar_type(), " ", mask.sizes());
}

// (B, n, channels) floats whose (B, n) are those of `codes`.
inline void check_rows(const at::Tensor& tensor, const at::Tensor& codes, const char* name) {
  TORCH_CHECK_VALUE(tensor.dim() == 3 && tensor.size(0) == codes.size(0) && tensor.size(1) == codes.size(1), name,
                    " must have shape (B, n, channels) with (B, n) = ", codes.sizes().slice(0, 2), ", got ", tensor.sizes());
  TORCH_CHECK_VALUE(at::isFloatingType(tensor.scalar_type()), name, " must be float32, float16 or bfloat16, got ",
                    tensor.scalar_type());
}

inline void check_same_width(const at::Tensor& a, const at::Tensor& b, const char* a_name, const char* b_name) {
  TORCH_CHECK_VALUE(a.size(2) == b.size(2), a_name, " and ", b_name, " must have the same width, got ", a.size(2), " and ",
                    b.size(2));
}

// The arguments every cumulation shares: int32 codes of queries and keys with the same B and
// number of hashes (at least one), bool masks matching them, and a supported hash_bits.
inline void check_codes_and_masks(const at::Tensor& query_codes, const at::Tensor& query_mask,
                                  const at::Tensor& key_codes, const at::Tensor& key_mask, int64_t hash_bits) {
  check_hash_bits(hash_bits);
  check_codes(query_codes, "query_codes");
  check_codes(key_codes, "key_codes");
  TORCH_CHECK_VALUE(query_codes.size(0) == key_codes.size(0) && query_codes.size(2) == key_codes.size(2),
                    "query_codes and key_codes must share B and num_hashes, got ", query_codes.sizes(), " and ",
                    key_codes.sizes());
  TORCH_CHECK_VALUE(query_codes.size(2) >= 1, "at least one hash is needed, got codes of shape ", query_codes.sizes());
  check_mask(query_mask, query_codes, "query_mask");
  check_mask(key_mask, key_codes, "key_mask");
}

// The arguments of lsh_cumulation: codes and masks, and (B, nk, c) values of the keys.
inline void check_cumulation_args(const at::Tensor& query_codes, const at::Tensor& query_mask, const at::Tensor& key_codes,
                                  const at::Tensor& key_mask, const at::Tensor& values, int64_t hash_bits) {
  check_codes_and_masks(query_codes, query_mask, key_codes, key_mask, hash_bits);
  check_rows(values, key_codes, "values");
}

// The arguments of lsh_weighted_cumulation: codes and masks, (B, n, w) weights of each side and
// (B, nk, c) values of the keys.
inline void check_weighted_args(const at::Tensor& query_codes, const at::Tensor& query_mask,
                                const at::Tensor& query_weights, const at::Tensor& key_codes, const at::Tensor& key_mask,
                                const at::Tensor& key_weights, const at::Tensor& values, int64_t hash_bits) {
  check_codes_and_masks(query_codes, query_mask, key_codes, key_mask, hash_bits);
  check_rows(query_weights, query_codes, "query_weights");
  check_rows(key_weights, key_codes, "key_weights");
  check_rows(values, key_codes, "values");
  check_same_width(query_weights, key_weights, "query_weights", "key_weights");
}

// The arguments of lsh_weighted_cumulation_both: codes and masks, (B, n, w) weights and (B, n, c)
// values of each side.
inline void check_weighted_both_args(const at::Tensor& query_codes, const at::Tensor& query_mask,
                                     const at::Tensor& query_weights, const at::Tensor& query_values,
                                     const at::Tensor& key_codes, const at::Tensor& key_mask, const at::Tensor& key_weights,
                                     const at::Tensor& key_values, int64_t hash_bits) {
  check_codes_and_masks(query_codes, query_mask, key_codes, key_mask, hash_bits);
  check_rows(query_weights, query_codes, "query_weights");
  check_rows(query_values, query_codes, "query_values");
  check_rows(key_weights, key_codes, "key_weights");
  check_rows(key_values, key_codes, "key_values");
  check_same_width(query_weights, key_weights, "query_weights", "key_weights");
}

// The arguments of the ops that take vectors and weights of both sides (lsh_collided_gradient,
// lsh_lower_bound_gradients): codes and masks, (B, n, d) vectors and (B, n, w) weights of each side.
inline void check_pair_args(const at::Tensor& query_codes, const at::Tensor& query_mask, const at::Tensor& query_vectors,
                            const at::Tensor& query_weights, const at::Tensor& key_codes, const at::Tensor& key_mask,
                            const at::Tensor& key_vectors, const at::Tensor& key_weights, int64_t hash_bits) {
  check_codes_and_masks(query_codes, query_mask, key_codes, key_mask, hash_bits);
  check_rows(query_vectors, query_codes, "query_vectors");
  check_rows(query_weights, query_codes, "query_weights");
  check_rows(key_vectors, key_codes, "key_vectors");
  check_rows(key_weights, key_codes, "key_weights");
  check_same_width(query_vectors, key_vectors, "query_vectors", "key_vectors");
  check_same_width(query_weights, key_weights, "query_weights", "key_weights");
}

// The message of a code outside [0, 2^hash_bits), which every backend rejects.
inline std::string codes_out_of_range(const char* name, int64_t hash_bits) {
  return std::string(name) + " holds hash codes outside [0, 2^" + std::to_string(hash_bits) +
         "): codes must come from hash_codes with the same hash_bits";
}

// hash_codes' arguments: vectors (B, n, d) floats and the rotations' signs (B, 3, rotations,
// width) float32, width a power of two >= max(d, hash_bits) holding num_hashes codes.
inline void check_hash_codes_args(const at::Tensor& vectors, const at::Tensor& signs, int64_t num_hashes,
                                  int64_t hash_bits) {
  check_hash_bits(hash_bits);
  TORCH_CHECK_VALUE(vectors.dim() == 3 && at::isFloatingType(vectors.scalar_type()),
                    "vectors must be a float tensor (B, n, d), got ", vectors.scalar_type(), " ", vectors.sizes());
  TORCH_CHECK_VALUE(signs.dim() == 4 && signs.size(0) == vectors.size(0) && signs.size(1) == 3 &&
                        signs.scalar_type() == at::kFloat,
                    "signs must be float32 (B, 3, rotations, width) with B = ", vectors.size(0), ", got ",
                    signs.scalar_type(), " ", signs.sizes());
  const int64_t dim = vectors.size(2), width = signs.size(3);
  TORCH_CHECK_VALUE(width >= dim && width >= hash_bits && width >= 1 && (width & (width - 1)) == 0,
                    "signs' width must be a power of two >= max(d, hash_bits) = ", std::max(dim, hash_bits), ", got ",
                    width);
  const int64_t held = signs.size(2) * (width / hash_bits);
  TORCH_CHECK_VALUE(num_hashes >= 1 && held >= num_hashes, "signs hold ", held, " hashes of ", hash_bits, " bits, ",
                    num_hashes, " requested");
}

}  // namespace yoso
