"""YOSO's hashing and LSH-cumulation ops in pure PyTorch: the oracle and the fallback of the kernels.

Notation: ``B`` folds batch and heads, ``n`` is the sequence length, ``d`` the vector width, ``m``
the number of hashes and ``tau`` (``hash_bits``) the bits of one hash code. A hash code of a unit
vector x is the sign pattern of tau projections of x; two vectors collide in one hash with
probability ``(1 - theta/pi)^tau`` for angle theta when the projections are independent Gaussians
(Charikar 2002), and approximately so for the fast pseudo-random rotation below.

Every YOSO function here is linear in n in memory: the cumulations sort codes and sum per occupied
bucket (memory independent of tau and of bucket sizes), rather than allocating 2^tau-row tables,
and the collided-pair gradient enumerates colliding pairs in bounded chunks.

* :func:`random_signs` / :func:`random_projections`: the randomness of one forward call, drawn from
  torch's RNG of the device that hashes (the CPU's numbers are those of every earlier run; on a
  GPU the draw never leaves the device, so a seeded run is reproducible there but draws other
  hash functions than the CPU).
* :func:`hash_codes`: codes from the fast random rotation ``H D3 H D2 H D1`` (Andoni et al. 2015),
  H the Walsh-Hadamard transform and D_i random sign diagonals; one rotation of a vector padded to
  ``d_pad`` (a power of two >= max(d, tau)) yields ``d_pad // tau`` codes.
* :func:`gaussian_hash_codes`: codes from independent Gaussian hyperplanes (exact collision law).
* :func:`lsh_cumulation`: ``out_i = (1/m) sum_h sum_j [q_h(i) = k_h(j)] v_j`` over real keys.
* :func:`lsh_weighted_cumulation`: ``out_i = (1/m) sum_h sum_j [q_h(i) = k_h(j)] (qw_i . kw_j) v_j``.
* :func:`lsh_weighted_cumulation_both`: that sum for queries and its transpose for keys at once.
* :func:`lsh_collided_gradient`: ``out_i = sum_{j in U(i)} (qw_i . kw_j) f'(s x_ij) kv_j`` with
  ``x_ij = qv_i . kv_j``, U(i) the real keys colliding with query i in at least one hash (each
  counted once), ``f(x) = (1 - arccos(x)/pi)^tau`` and ``s = 0.99`` keeping f' finite.

* :func:`softmax_dropout_attention`: exact softmax attention with dropout on its probabilities,
  under the counter-based mask of the fused CPU kernel (:func:`dropout_keep`), densely.
* :func:`element_keep`: the mask of ``yoso::dropout_add``, the model's fused dropout, by flat index.

Masked (padded) keys never enter a bucket and masked queries get zero rows. Every op refuses the
arguments the compiled kernels refuse, in their words (:mod:`yoso_cuda.argument_checks`), a code
outside ``[0, 2^hash_bits)`` included.
"""

from __future__ import annotations

import math

import torch

from .argument_checks import (
    check_codes_in_range,
    check_cumulation_args,
    check_hash_codes_args,
    check_pair_args,
    check_weighted_args,
    check_weighted_both_args,
)

DERIVATIVE_SHRINK = 0.99  # f' is evaluated at 0.99 x, as the official kernels do, so 1/sqrt(1 - x^2) <= 7.1
MAX_PAIRS_PER_CHUNK = 1 << 22  # collided pairs materialised at once by lsh_collided_gradient


def padded_dim(dim: int, hash_bits: int) -> int:
    """The Hadamard transform's width: the smallest power of two >= max(dim, hash_bits)."""
    return 1 << (max(dim, hash_bits) - 1).bit_length()


def num_rotations(dim: int, num_hashes: int, hash_bits: int) -> int:
    return math.ceil(num_hashes / (padded_dim(dim, hash_bits) // hash_bits))


def random_signs(
    batch: int,
    dim: int,
    num_hashes: int,
    hash_bits: int,
    device: torch.device | str = "cpu",
    *,
    on_device: bool | None = None,
) -> torch.Tensor:
    """Random +-1 diagonals ``(batch, 3, rotations, d_pad)`` float32 for :func:`hash_codes`.

    ``on_device`` (default: ``device`` is not the CPU) draws them on ``device`` with its generator:
    no host-to-device copy, which would block the host in every forward (a pageable copy). Without
    it they are drawn as before, on the CPU, so the CPU's codes under a seed do not change.
    """
    shape = (batch, 3, num_rotations(dim, num_hashes, hash_bits), padded_dim(dim, hash_bits))
    if on_device if on_device is not None else torch.device(device).type != "cpu":
        return torch.randint(0, 2, shape, device=device, dtype=torch.float32).mul_(2).sub_(1)
    return (torch.randint(0, 2, shape, dtype=torch.int8) * 2 - 1).to(device=device, dtype=torch.float32)


def random_projections(
    batch: int,
    dim: int,
    num_hashes: int,
    hash_bits: int,
    device: torch.device | str = "cpu",
    *,
    on_device: bool | None = None,
) -> torch.Tensor:
    """Gaussian hyperplanes ``(batch, dim, num_hashes * hash_bits)`` float32 for :func:`gaussian_hash_codes`,
    drawn on ``device`` or on the CPU as :func:`random_signs` says."""
    if on_device if on_device is not None else torch.device(device).type != "cpu":
        return torch.randn(batch, dim, num_hashes * hash_bits, device=device)
    return torch.randn(batch, dim, num_hashes * hash_bits).to(device)


def hadamard_matrix(size: int, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The unnormalised Walsh-Hadamard matrix of a power-of-two ``size`` (Sylvester's construction)."""
    matrix = torch.ones(1, 1, device=device, dtype=dtype)
    while matrix.shape[0] < size:
        matrix = torch.cat([torch.cat([matrix, matrix], 1), torch.cat([matrix, -matrix], 1)], 0)
    return matrix


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """``(..., tau)`` booleans -> ``(...)`` int32 codes, bit i of the code from element i."""
    weights = 1 << torch.arange(bits.shape[-1], device=bits.device, dtype=torch.int64)
    return (bits.long() * weights).sum(-1).int()


def hash_codes(vectors: torch.Tensor, signs: torch.Tensor, num_hashes: int, hash_bits: int) -> torch.Tensor:
    """Hash codes ``(B, n, num_hashes)`` int32 of ``vectors`` ``(B, n, d)`` under the rotations ``signs``."""
    check_hash_codes_args(vectors, signs, num_hashes, hash_bits)
    batch, length, dim = vectors.shape
    rotations, width = signs.shape[2], signs.shape[3]
    per_rotation = width // hash_bits
    hadamard = hadamard_matrix(width, vectors.device)
    x = torch.nn.functional.pad(vectors.float(), (0, width - dim))  # (B, n, d_pad)
    x = x[:, :, None, :].expand(batch, length, rotations, width)  # (B, n, r, d_pad)
    for step in range(3):
        x = (x * signs[:, None, step]) @ hadamard  # (B, n, r, d_pad)
    bits = x[..., : per_rotation * hash_bits] > 0  # (B, n, r, per_rotation * tau)
    bits = bits.reshape(batch, length, rotations * per_rotation, hash_bits)  # (B, n, hashes, tau)
    return pack_bits(bits)[:, :, :num_hashes]


def gaussian_hash_codes(vectors: torch.Tensor, projections: torch.Tensor, num_hashes: int, hash_bits: int) -> torch.Tensor:
    """Hash codes ``(B, n, num_hashes)`` int32 from independent Gaussian hyperplanes ``(B, d, m * tau)``."""
    batch, length, _ = vectors.shape
    bits = (vectors.float() @ projections) > 0  # (B, n, m * tau)
    return pack_bits(bits.view(batch, length, num_hashes, hash_bits))


def _bucket_ids(codes: torch.Tensor, hash_bits: int) -> torch.Tensor:
    """Codes ``(B, n)`` of one hash -> int64 ids unique per (batch row, code)."""
    rows = torch.arange(codes.shape[0], device=codes.device, dtype=torch.int64)[:, None]
    return (rows << hash_bits) | codes.long()  # (B, n)


def _cumulate_one_hash(query_codes, query_mask, key_codes, key_mask, values, hash_bits):
    """``sum_j [q(i) = k(j)] values_j`` for one hash: codes (B, n), values (B, nk, c) -> (B, nq, c)."""
    batch, num_queries = query_codes.shape
    key_ids = _bucket_ids(key_codes, hash_bits)[key_mask]  # (real keys,)
    buckets, key_bucket = torch.unique(key_ids, return_inverse=True)  # sorted occupied buckets
    sums = values.new_zeros(len(buckets), values.shape[-1]).index_add_(0, key_bucket, values[key_mask])
    query_ids = _bucket_ids(query_codes, hash_bits).flatten()  # (B * nq,)
    if len(buckets) == 0:
        return values.new_zeros(batch, num_queries, values.shape[-1])
    position = torch.searchsorted(buckets, query_ids).clamp(max=len(buckets) - 1)
    hit = (buckets[position] == query_ids) & query_mask.flatten()
    out = sums[position] * hit[:, None]  # (B * nq, c)
    return out.view(batch, num_queries, values.shape[-1])


def lsh_cumulation(
    query_codes: torch.Tensor,
    query_mask: torch.Tensor,
    key_codes: torch.Tensor,
    key_mask: torch.Tensor,
    values: torch.Tensor,
    hash_bits: int,
) -> torch.Tensor:
    """``(1/m) sum_h sum_j [q_h(i) = k_h(j)] v_j``: codes ``(B, n, m)``, masks ``(B, n)`` bool, values ``(B, nk, c)``."""
    check_cumulation_args(query_codes, query_mask, key_codes, key_mask, values, hash_bits)
    check_codes_in_range(query_codes, key_codes, hash_bits)
    num_hashes = query_codes.shape[-1]
    values = values.float()
    out = values.new_zeros(query_codes.shape[0], query_codes.shape[1], values.shape[-1])
    for h in range(num_hashes):
        out += _cumulate_one_hash(query_codes[..., h], query_mask, key_codes[..., h], key_mask, values, hash_bits)
    return out / num_hashes


def lsh_weighted_cumulation(
    query_codes: torch.Tensor,
    query_mask: torch.Tensor,
    query_weights: torch.Tensor,
    key_codes: torch.Tensor,
    key_mask: torch.Tensor,
    key_weights: torch.Tensor,
    values: torch.Tensor,
    hash_bits: int,
) -> torch.Tensor:
    """``(1/m) sum_h sum_j [q_h(i) = k_h(j)] (qw_i . kw_j) v_j`` with weights ``(B, n, w)``.

    Per hash, whichever is cheaper: enumerate the colliding pairs (cost ~ pairs * (w + c), small
    when buckets hold few keys, as with tau ~ log2 n), or let each bucket sum the outer products
    ``kw_j v_j^T`` (w x c) that each colliding query contracts with its weights, the paper's
    "d runs of LSH-based Bernoulli sampling" in one pass (cost ~ n * w * c, whatever the buckets).
    """
    check_weighted_args(query_codes, query_mask, query_weights, key_codes, key_mask, key_weights, values, hash_bits)
    check_codes_in_range(query_codes, key_codes, hash_bits)
    batch, num_queries, width = query_weights.shape
    num_keys, channels = values.shape[1], values.shape[2]
    query_weights, key_weights, values = query_weights.float(), key_weights.float(), values.float()
    outer = None  # kw_j v_j^T of every key, built once if some hash needs the table
    out = torch.zeros(batch * num_queries, channels, device=values.device)
    flat_qw, flat_kw, flat_v = (t.flatten(0, 1) for t in (query_weights, key_weights, values))  # (B * n, w or c)
    real_queries = query_mask.flatten().nonzero().squeeze(1)  # (real queries,) flat indices
    table_cost = (num_keys + num_queries) * batch * width * channels
    for h in range(query_codes.shape[-1]):
        buckets = _SortedBuckets(key_codes[..., h], key_mask, hash_bits)
        query_ids = _bucket_ids(query_codes[..., h], hash_bits).flatten()[real_queries]
        starts, counts = buckets.ranges(query_ids)
        if int(counts.sum()) * (width + channels) <= table_cost:
            for pair_query, j in buckets.pairs(starts, counts):
                i = real_queries[pair_query]
                out.index_add_(0, i, (flat_qw[i] * flat_kw[j]).sum(-1, keepdim=True) * flat_v[j])
            continue
        if outer is None:
            outer = (key_weights[..., :, None] * values[..., None, :]).view(batch, num_keys, width * channels)
        bucket_sums = _cumulate_one_hash(query_codes[..., h], query_mask, key_codes[..., h], key_mask, outer, hash_bits)
        bucket_sums = bucket_sums.view(batch * num_queries, width, channels)  # (B * nq, w, c)
        out += torch.einsum("nw,nwc->nc", flat_qw, bucket_sums)
    return out.view(batch, num_queries, channels) / query_codes.shape[-1]


class _SortedBuckets:
    """The real keys of one hash sorted by (batch row, code): each bucket is a contiguous range."""

    def __init__(self, key_codes: torch.Tensor, key_mask: torch.Tensor, hash_bits: int) -> None:
        key_ids = _bucket_ids(key_codes, hash_bits).masked_fill(~key_mask, -1).flatten()  # padded keys match nothing
        self.sorted_ids, self.order = torch.sort(key_ids, stable=True)

    def ranges(self, query_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Start in sorted order and number of keys of each query's bucket."""
        starts = torch.searchsorted(self.sorted_ids, query_ids, side="left")
        return starts, torch.searchsorted(self.sorted_ids, query_ids, side="right") - starts

    def pairs(self, starts: torch.Tensor, counts: torch.Tensor, max_pairs: int = MAX_PAIRS_PER_CHUNK):
        """Yield ``(query position, key flat index)`` of every colliding pair, at most ``max_pairs`` at a time."""
        pair_ends = torch.cumsum(counts, 0)
        chunk_start = 0
        while chunk_start < len(counts):
            budget = pair_ends[chunk_start] - counts[chunk_start] + max_pairs
            chunk_end = max(int(torch.searchsorted(pair_ends, budget, side="right")), chunk_start + 1)
            chunk_counts = counts[chunk_start:chunk_end]
            positions = torch.arange(chunk_start, chunk_end, device=counts.device)
            pair_query = torch.repeat_interleave(positions, chunk_counts)
            offset = torch.arange(len(pair_query), device=counts.device) - torch.repeat_interleave(
                torch.cumsum(chunk_counts, 0) - chunk_counts, chunk_counts
            )
            yield pair_query, self.order[starts[pair_query] + offset]
            chunk_start = chunk_end


def lsh_weighted_cumulation_both(
    query_codes: torch.Tensor,
    query_mask: torch.Tensor,
    query_weights: torch.Tensor,
    query_values: torch.Tensor,
    key_codes: torch.Tensor,
    key_mask: torch.Tensor,
    key_weights: torch.Tensor,
    key_values: torch.Tensor,
    hash_bits: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both sides of the weighted cumulation, which share the pair weights ``s_ij = qw_i . kw_j``:
    ``(1/m) sum_h sum_j [collide] s_ij key_values_j`` per query and ``(1/m) sum_h sum_i [collide]
    s_ij query_values_i`` per key (YOSO's lower-bound grad Q and grad K)."""
    check_weighted_both_args(
        query_codes, query_mask, query_weights, query_values, key_codes, key_mask, key_weights, key_values, hash_bits
    )
    return (
        lsh_weighted_cumulation(query_codes, query_mask, query_weights, key_codes, key_mask, key_weights, key_values, hash_bits),
        lsh_weighted_cumulation(
            key_codes, key_mask, key_weights, query_codes, query_mask, query_weights, query_values, hash_bits
        ),
    )


def lsh_lower_bound_gradients(
    query_codes: torch.Tensor,
    query_mask: torch.Tensor,
    query_vectors: torch.Tensor,
    query_weights: torch.Tensor,
    key_codes: torch.Tensor,
    key_mask: torch.Tensor,
    key_vectors: torch.Tensor,
    key_weights: torch.Tensor,
    hash_bits: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """YOSO's lower-bound backward in one op: with query vectors q, query weights g (the output's
    gradient), key vectors k and key weights v (the values), ``(tau/2) (1/m) sum_h sum_j [collide]
    (g_i . v_j) k_j`` per query, ``(tau/2) (1/m) sum_h sum_i [collide] (g_i . v_j) q_i`` per key and
    ``(1/m) sum_h sum_i [collide] g_i`` per key (grad Q, grad K, grad V)."""
    check_pair_args(
        query_codes, query_mask, query_vectors, query_weights, key_codes, key_mask, key_vectors, key_weights, hash_bits
    )
    grad_queries, grad_keys = lsh_weighted_cumulation_both(
        query_codes, query_mask, query_weights, query_vectors, key_codes, key_mask, key_weights, key_vectors, hash_bits
    )
    grad_key_weights = lsh_cumulation(key_codes, key_mask, query_codes, query_mask, query_weights.float(), hash_bits)
    return (hash_bits / 2) * grad_queries, (hash_bits / 2) * grad_keys, grad_key_weights


def collision_probability_derivative(x: torch.Tensor, hash_bits: int) -> torch.Tensor:
    """d/dx (1 - arccos(x)/pi)^tau = tau p^(tau-1) / (pi sqrt(1 - x^2)), p = 1 - arccos(x)/pi."""
    p = 1 - torch.arccos(x) / math.pi
    return hash_bits * p.pow(hash_bits - 1) / (math.pi * torch.sqrt(1 - x * x))


def lsh_collided_gradient(
    query_codes: torch.Tensor,
    query_mask: torch.Tensor,
    query_vectors: torch.Tensor,
    query_weights: torch.Tensor,
    key_codes: torch.Tensor,
    key_mask: torch.Tensor,
    key_vectors: torch.Tensor,
    key_weights: torch.Tensor,
    hash_bits: int,
) -> torch.Tensor:
    """``sum_{j in U(i)} (qw_i . kw_j) f'(0.99 qv_i . kv_j) kv_j`` over the union U(i) of collisions.

    A pair colliding in several hashes is counted once, in the first hash where it collides. Keys
    are sorted by code per hash; each query's bucket is a contiguous range of sorted keys, and the
    pairs are materialised in chunks of queries of at most ``MAX_PAIRS_PER_CHUNK`` pairs, so memory is
    linear in n; time is proportional to the number of colliding pairs.
    """
    check_pair_args(
        query_codes, query_mask, query_vectors, query_weights, key_codes, key_mask, key_vectors, key_weights, hash_bits
    )
    check_codes_in_range(query_codes, key_codes, hash_bits)
    batch, num_queries, _ = query_vectors.shape
    flat = lambda t: t.float().flatten(0, 1)  # noqa: E731  (B, n, c) -> (B * n, c)
    qv, kv, qw, kw = flat(query_vectors), flat(key_vectors), flat(query_weights), flat(key_weights)
    q_codes, k_codes = query_codes.reshape(-1, query_codes.shape[-1]), key_codes.reshape(-1, key_codes.shape[-1])
    out = torch.zeros_like(qv)
    real_queries = query_mask.flatten().nonzero().squeeze(1)  # (real queries,) flat indices
    for h in range(query_codes.shape[-1]):
        buckets = _SortedBuckets(key_codes[..., h], key_mask, hash_bits)
        query_ids = _bucket_ids(query_codes[..., h], hash_bits).flatten()[real_queries]
        for pair_query, j in buckets.pairs(*buckets.ranges(query_ids)):
            i = real_queries[pair_query]
            first = (q_codes[i, :h] != k_codes[j, :h]).all(dim=1)  # no earlier hash collided
            i, j = i[first], j[first]
            x = (qv[i] * kv[j]).sum(-1) * DERIVATIVE_SHRINK
            weight = (qw[i] * kw[j]).sum(-1) * collision_probability_derivative(x, hash_bits)
            out.index_add_(0, i, weight[:, None] * kv[j])
    return out.view(batch, num_queries, query_vectors.shape[-1])


def expected_collisions(queries: torch.Tensor, keys: torch.Tensor, hash_bits: int) -> torch.Tensor:
    """YOSO-E's weights ``(1 - arccos(q . k)/pi)^tau`` of unit vectors: ``(B, nq, d), (B, nk, d) -> (B, nq, nk)``."""
    cosine = (queries.float() @ keys.float().transpose(-1, -2)).clamp(-1.0, 1.0)
    return (1 - torch.arccos(cosine) / math.pi).pow(hash_bits)


# The dropout mask of yoso::softmax_dropout_attention (csrc/softmax_dropout.cpp): a key is dropped when
# the 32-bit hash of (seed, head row, query, key) is below round(p 2^32).
WORD = 0xFFFFFFFF
ROW_STRIDE, QUERY_STRIDE, KEY_STRIDE = 0x9E3779B9, 0x85EBCA77, 0xC2B2AE3D


def _mix(x: torch.Tensor) -> torch.Tensor:
    """The murmur3 finaliser on 32-bit words held in int64 (products keep their low 32 bits)."""
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & WORD
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & WORD
    return x ^ (x >> 16)


def dropout_keep(seed: int, batch: int, heads: int, length: int, dropout: float) -> torch.Tensor:
    """Which (query, key) pairs the fused softmax dropout keeps: ``(batch, heads, n, n)`` bool."""
    rows = torch.arange(batch * heads, dtype=torch.int64)[:, None, None]  # (b*h, 1, 1)
    queries = torch.arange(length, dtype=torch.int64)[None, :, None]  # (1, n, 1)
    keys = torch.arange(length, dtype=torch.int64)[None, None, :]  # (1, 1, n)
    seeded = _mix((rows * ROW_STRIDE + (seed & WORD)) & WORD)
    row_key = _mix((_mix(seeded ^ ((seed >> 32) & WORD)) + queries * QUERY_STRIDE) & WORD)  # (b*h, n, 1)
    hashes = _mix(row_key ^ ((keys * KEY_STRIDE) & WORD))  # (b*h, n, n)
    threshold = min(round(math.ldexp(dropout, 32)), WORD)
    return (hashes >= threshold).view(batch, heads, length, length)


def softmax_dropout_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None,
    dropout: float,
    seed: int,
    radius: int = -1,
    num_global: int = 0,
) -> torch.Tensor:
    """``(softmax(q k^T / sqrt(d)) * keep / (1 - p)) v`` densely, with :func:`dropout_keep`'s mask: ``(b, h, n, c)``.
    With ``radius`` >= 0 query i sees key j only where ``|i - j| <= radius`` or ``i`` or ``j`` < ``num_global``; a
    query with no key to see, or after its sequence's last real key (padding), gets a zero row."""
    batch, heads, length, dim = q.shape
    position = torch.arange(length, device=q.device)
    allowed = torch.ones(batch, 1, length, length, dtype=torch.bool, device=q.device)  # (b, 1, n, n)
    if radius >= 0:
        allowed &= ((position[:, None] - position).abs() <= radius) | (position[:, None] < num_global) | (position < num_global)
    if key_mask is not None:
        allowed &= key_mask[:, None, None, :]
        real_end = (key_mask * (position + 1)).amax(dim=-1)  # (b,): one past each sequence's last real key
        allowed &= (position < real_end[:, None])[:, None, :, None]  # the queries after it: padding
    seen = allowed.any(dim=-1, keepdim=True)  # (b, 1, n, 1): a query with no key gets zeros, not NaN
    scores = (q @ k.transpose(-1, -2) / math.sqrt(dim)).masked_fill(~allowed & seen, float("-inf"))  # (b, h, n, n)
    keep = dropout_keep(seed, batch, heads, length, dropout).to(q.device)
    return (scores.softmax(dim=-1) * seen * keep / (1 - dropout)) @ v


HIGH_STRIDE, ELEMENT_STRIDE = 0x9E3779B9, 0xC2B2AE3D  # csrc/dropout.cpp


def element_keep(seed: int, numel: int, dropout: float) -> torch.Tensor:
    """Which elements ``yoso::dropout_add`` keeps, by their flat index: ``(numel,)`` bool."""
    index = torch.arange(numel, dtype=torch.int64)
    high, low = index >> 32, index & WORD
    key = _mix(_mix(((seed & WORD) + high * HIGH_STRIDE) & WORD) ^ ((seed >> 32) & WORD))
    hashes = _mix(key ^ ((low * ELEMENT_STRIDE) & WORD))
    return hashes >= min(round(math.ldexp(dropout, 32)), WORD)
