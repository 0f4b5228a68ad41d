"""The ops' argument checks for the pure-PyTorch reference, in the words of the compiled kernels' (``csrc/checks.h``).

Every backend refuses the same inputs with the same ``ValueError``: the reference calls the
function of its op here, as each CPU and CUDA kernel calls the one of the same name in
``csrc/checks.h``, and ``tests/yoso_cuda/test_argument_checks.py`` holds the two to the same
messages. Without them the reference would compute on inputs the kernels refuse (codes of another
batch size give zero rows, vectors wider than the signs are hashed on their first coordinates only).
The checks read shapes and dtypes only, except :func:`check_codes_in_range`, which reads the codes.
"""

from __future__ import annotations

import torch

MAX_HASH_BITS = 30  # codes are int32


def _scalar_type(tensor: torch.Tensor) -> str:
    """The dtype as the C++ checks print it (c10's name: ``Long``, ``Float``, ``BFloat16``)."""
    return tensor.type().rsplit(".", 1)[-1].removesuffix("Tensor")  # "torch.LongTensor" -> "Long"


def _sizes(tensor: torch.Tensor, dims: int | None = None) -> str:
    """The shape as the C++ checks print it: ``[2, 10, 4]``."""
    return str(list(tensor.shape[:dims]))


def check_hash_bits(hash_bits: int) -> None:
    if not (1 <= hash_bits <= MAX_HASH_BITS):
        raise ValueError(f"hash_bits must be in [1, {MAX_HASH_BITS}] (int32 codes), got {hash_bits}")


def check_codes(codes: torch.Tensor, name: str) -> None:
    if not (codes.dim() == 3 and codes.dtype == torch.int32):
        raise ValueError(f"{name} must be an int32 tensor of shape (B, n, num_hashes), got {_scalar_type(codes)} {_sizes(codes)}")


def check_mask(mask: torch.Tensor, codes: torch.Tensor, name: str) -> None:
    if not (mask.dtype == torch.bool and mask.dim() == 2 and mask.shape == codes.shape[:2]):
        raise ValueError(
            f"{name} must be a bool tensor of shape (B, n) = {_sizes(codes, 2)}, got {_scalar_type(mask)} {_sizes(mask)}"
        )


def check_rows(tensor: torch.Tensor, codes: torch.Tensor, name: str) -> None:
    """(B, n, channels) floats whose (B, n) are those of ``codes``."""
    if not (tensor.dim() == 3 and tensor.shape[:2] == codes.shape[:2]):
        raise ValueError(f"{name} must have shape (B, n, channels) with (B, n) = {_sizes(codes, 2)}, got {_sizes(tensor)}")
    if not tensor.is_floating_point():
        raise ValueError(f"{name} must be float32, float16 or bfloat16, got {_scalar_type(tensor)}")


def check_same_width(a: torch.Tensor, b: torch.Tensor, a_name: str, b_name: str) -> None:
    if a.shape[2] != b.shape[2]:
        raise ValueError(f"{a_name} and {b_name} must have the same width, got {a.shape[2]} and {b.shape[2]}")


def check_codes_and_masks(query_codes, query_mask, key_codes, key_mask, hash_bits) -> None:
    """The arguments every cumulation shares: int32 codes of queries and keys with the same B and
    number of hashes (at least one), bool masks matching them, and a supported ``hash_bits``."""
    check_hash_bits(hash_bits)
    check_codes(query_codes, "query_codes")
    check_codes(key_codes, "key_codes")
    if not (query_codes.shape[0] == key_codes.shape[0] and query_codes.shape[2] == key_codes.shape[2]):
        raise ValueError(
            f"query_codes and key_codes must share B and num_hashes, got {_sizes(query_codes)} and {_sizes(key_codes)}"
        )
    if query_codes.shape[2] < 1:
        raise ValueError(f"at least one hash is needed, got codes of shape {_sizes(query_codes)}")
    check_mask(query_mask, query_codes, "query_mask")
    check_mask(key_mask, key_codes, "key_mask")


def check_cumulation_args(query_codes, query_mask, key_codes, key_mask, values, hash_bits) -> None:
    """lsh_cumulation's arguments: codes and masks, and (B, nk, c) values of the keys."""
    check_codes_and_masks(query_codes, query_mask, key_codes, key_mask, hash_bits)
    check_rows(values, key_codes, "values")


def check_weighted_args(query_codes, query_mask, query_weights, key_codes, key_mask, key_weights, values, hash_bits) -> None:
    """lsh_weighted_cumulation's arguments: codes and masks, (B, n, w) weights of each side, (B, nk, c) values."""
    check_codes_and_masks(query_codes, query_mask, key_codes, key_mask, hash_bits)
    check_rows(query_weights, query_codes, "query_weights")
    check_rows(key_weights, key_codes, "key_weights")
    check_rows(values, key_codes, "values")
    check_same_width(query_weights, key_weights, "query_weights", "key_weights")


def check_weighted_both_args(
    query_codes, query_mask, query_weights, query_values, key_codes, key_mask, key_weights, key_values, hash_bits
) -> None:
    """lsh_weighted_cumulation_both's arguments: codes and masks, (B, n, w) weights and (B, n, c) values of each side."""
    check_codes_and_masks(query_codes, query_mask, key_codes, key_mask, hash_bits)
    check_rows(query_weights, query_codes, "query_weights")
    check_rows(query_values, query_codes, "query_values")
    check_rows(key_weights, key_codes, "key_weights")
    check_rows(key_values, key_codes, "key_values")
    check_same_width(query_weights, key_weights, "query_weights", "key_weights")


def check_pair_args(
    query_codes, query_mask, query_vectors, query_weights, key_codes, key_mask, key_vectors, key_weights, hash_bits
) -> None:
    """The arguments of lsh_collided_gradient and lsh_lower_bound_gradients: codes and masks, (B, n, d)
    vectors and (B, n, w) weights of each side."""
    check_codes_and_masks(query_codes, query_mask, key_codes, key_mask, hash_bits)
    check_rows(query_vectors, query_codes, "query_vectors")
    check_rows(query_weights, query_codes, "query_weights")
    check_rows(key_vectors, key_codes, "key_vectors")
    check_rows(key_weights, key_codes, "key_weights")
    check_same_width(query_vectors, key_vectors, "query_vectors", "key_vectors")
    check_same_width(query_weights, key_weights, "query_weights", "key_weights")


def check_hash_codes_args(vectors: torch.Tensor, signs: torch.Tensor, num_hashes: int, hash_bits: int) -> None:
    """hash_codes' arguments: vectors (B, n, d) floats and the rotations' signs (B, 3, rotations, width)
    float32, width a power of two >= max(d, hash_bits) holding ``num_hashes`` codes."""
    check_hash_bits(hash_bits)
    if not (vectors.dim() == 3 and vectors.is_floating_point()):
        raise ValueError(f"vectors must be a float tensor (B, n, d), got {_scalar_type(vectors)} {_sizes(vectors)}")
    batch = vectors.shape[0]
    if not (signs.dim() == 4 and signs.shape[0] == batch and signs.shape[1] == 3 and signs.dtype == torch.float32):
        raise ValueError(
            f"signs must be float32 (B, 3, rotations, width) with B = {batch}, got {_scalar_type(signs)} {_sizes(signs)}"
        )
    dim, width = vectors.shape[2], signs.shape[3]
    if not (width >= dim and width >= hash_bits and width >= 1 and width & (width - 1) == 0):
        raise ValueError(f"signs' width must be a power of two >= max(d, hash_bits) = {max(dim, hash_bits)}, got {width}")
    held = signs.shape[2] * (width // hash_bits)
    if not (1 <= num_hashes <= held):
        raise ValueError(f"signs hold {held} hashes of {hash_bits} bits, {num_hashes} requested")


def check_codes_in_range(query_codes: torch.Tensor, key_codes: torch.Tensor, hash_bits: int) -> None:
    """Reject a code outside [0, 2^hash_bits) (``codes_out_of_range`` in csrc/checks.h)."""
    for name, codes in (("query_codes", query_codes), ("key_codes", key_codes)):
        if bool(((codes >> hash_bits) != 0).any()):  # negative codes too: >> keeps their sign bits
            raise ValueError(
                f"{name} holds hash codes outside [0, 2^{hash_bits}): codes must come from hash_codes with the same hash_bits"
            )
