"""Reformer LSH attention (Kitaev, Kaiser and Levskaya, "Reformer: The Efficient Transformer", ICLR 2020).

Shared-QK attention in which every query sees only the keys that a locality-sensitive hash puts near
it, found by sorting instead of comparing all pairs:

1. Shared QK. Queries and keys come from one projection (``tie_query_key``, read by
   ``MultiHeadAttention``). The keys are the length-normalised queries, k_j = q_j / ||q_j||, and the
   score is q_i . k_j with no further 1/sqrt(d): the query norm acts as a learned temperature, as in
   the authors' trax code and HF ``LSHSelfAttention`` (lucidrains also divides by sqrt(d)).
2. Angular LSH (Andoni et al., 2015). Each of ``num_hashes`` rounds draws a random rotation R of
   shape (head_dim, num_buckets / 2), one per head as HF does, fresh on every forward call from
   torch's global RNG (R does not depend on the data, so a seed reproduces it). The bucket of x is
   argmax([xR, -xR]), so nearby directions tend to share a bucket. Padded tokens get the extra bucket
   ``num_buckets`` whatever their values, so they sort after every real token and cannot move real
   tokens between chunks (the rule of trax and HF).
3. Sort. In each round, tokens are sorted by bucket and, within a bucket, by position.
4. Chunked attention. The rounds' sorted sequences, one after the other, are cut into chunks of
   ``chunk_length``; each chunk attends to itself and to the previous chunk. Like trax and HF, the
   look-back is circular over the concatenated rounds, so the first chunk of a round looks at the
   last chunk of the round before (the very first chunk at the very last).
5. Masks. A token's score with itself is -1e5 rather than -inf (the paper's and HF's value): it
   attends to itself only when every other key in reach is padding, e.g. in a one-token sequence.
   Padded keys score -1e9 (HF's float32 value), which underflows to an exact zero weight because
   every real query's own key, at worst -1e5, is in reach.
6. Rounds. Each round gives, per query, an output o_r and the log-sum-exp z_r of its scores; the
   result is sum_r softmax_r(z_r) o_r, one softmax over the keys all rounds found.

The sequence is padded to a multiple of ``chunk_length`` and cropped back; the math runs in float32.
On a CPU in float32, steps 4 and 5 run on ``yoso_cuda.chunked_attention``, a fused kernel that leaves
out what weighs exactly zero: padded keys, and the chunks of padded queries (padding sorts last, so
a round's chunks after its real tokens), whose rows are zeroed anyway; ListOps' sequences are about
half padding. Elsewhere ``chunked_dense`` computes every chunk.
With ``num_buckets=None`` the bucket count follows HF: the largest power of two at most
2 * ceil(seq_len / chunk_length), about two buckets per chunk as the paper recommends, fixed at
build time from ``seq_len`` (HF fixes it on the first call, whose length is the padded maximum in
LRA). Memory is linear in the sequence: scores are (chunk, 2 * chunk) blocks, and the hashing, whose
(tokens x num_buckets) product would grow quadratically under the automatic bucket count, runs over
slices of the sequence.

Choices, where the sources differ:
- Keys of other buckets inside the two-chunk window are attended to, and a key found by several
  rounds counts that many times, as in the authors' later trax ``LSHSelfAttention`` and in HF (the
  NF/YOSO LRA tables' baseline). The paper's equation 3 masks keys of other buckets and its appendix
  discounts duplicates by log N_ij; neither is done here.
- HF factorises the bucket count into two smaller hashes above 128 buckets (8192 tokens or more at
  chunk 64, with the LRA code's max_position_embeddings); this module always uses the paper's single
  rotation, which hashes the LRA lengths exactly as HF does. Its O(n * num_buckets * d) time
  matches the attention's own at 16384 tokens (chunk 64) and grows quadratically beyond.
- The core receives q and k separately. Each token is hashed once, by its key k (the same buckets
  as hashing q when they are tied, since argmax([xR, -xR]) ignores the length of x); queries are q
  and keys are k / ||k||.
- No attention dropout: HF's ``lsh_attention_probs_dropout_prob`` defaults to 0, which the NF/YOSO
  LRA code keeps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from yoso_cuda import chunked_attention, has_kernel

from .registry import Attention, register

SELF_SCORE = -1e5  # a token's score with itself: lower than any real score, higher than padding
PAD_SCORE = -1e9  # a padded key's score: exactly zero weight beside any real score, the self-score included
HASH_SLICE = 1024  # tokens hashed at once, which bounds the (tokens x num_buckets) rotation product


@dataclass
class ReformerConfig:
    num_hashes: int = 2  # hash rounds; 2 as in the reformer-2 row of the NF/YOSO LRA tables (HF: 1, lucidrains: 8)
    chunk_length: int = 64  # queries per chunk (HF lsh_attn_chunk_length); a chunk sees itself and the one before
    num_buckets: int | None = None  # even; None: the power of two at most 2 * ceil(seq_len / chunk_length) (HF)

    def __post_init__(self) -> None:
        if self.num_hashes < 1:
            raise ValueError(f"num_hashes must be at least 1, got {self.num_hashes}")
        if self.chunk_length < 1:
            raise ValueError(f"chunk_length must be at least 1, got {self.chunk_length}")
        if self.num_buckets is not None and (self.num_buckets < 2 or self.num_buckets % 2):
            raise ValueError(
                f"num_buckets must be an even number >= 2 (the hash is an argmax over [xR, -xR]), or None to "
                f"choose it from seq_len; got {self.num_buckets}"
            )


def auto_num_buckets(seq_len: int, chunk_length: int) -> int:
    """HF's rule: the largest power of two at most twice the number of chunks (at least 2)."""
    num_chunks = -(-seq_len // chunk_length)
    return 1 << ((2 * num_chunks).bit_length() - 1)


def angular_lsh(x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """Bucket of every vector in every round: argmax over [xR, -xR].

    ``x``: (b, h, n, d); ``rotations``: (h, d, rounds, num_buckets / 2). Returns (b, h, rounds, n)
    bucket ids in [0, num_buckets). The hash is discrete, so it carries no gradient.
    """
    buckets = []
    for piece in x.detach().split(HASH_SLICE, dim=2):
        rotated = torch.einsum("bhnd,hdrk->bhrnk", piece, rotations)  # (b, h, rounds, slice, num_buckets/2)
        buckets.append(torch.cat([rotated, -rotated], dim=-1).argmax(dim=-1))  # (b, h, rounds, slice)
    return torch.cat(buckets, dim=-1)  # (b, h, rounds, n)


def chunked_dense(query, key, value, position, real):
    """Each chunk of queries against its own keys and the previous chunk's: the output (b, h, C, c, dv) and each
    query's log-sum-exp (b, h, C, c), from the sorted ``query, key`` (b, h, C, c, d), ``value`` (b, h, C, c, dv) and
    each token's ``position`` and ``real`` flag (b, h, C, c)."""
    key, value = look_one_back(key), look_one_back(value)  # (b, h, C, 2c, d), (b, h, C, 2c, dv)
    key_pos, key_real = look_one_back(position), look_one_back(real)  # (b, h, C, 2c)
    scores = query @ key.transpose(-1, -2)  # (b, h, C, c, 2c)
    scores = scores.masked_fill(~key_real[..., None, :], PAD_SCORE)
    scores = scores.masked_fill(position[..., :, None] == key_pos[..., None, :], SELF_SCORE)
    # softmax rather than exp(scores - lse): near -1e5, float32 would round lse by up to 0.004.
    return scores.softmax(dim=-1) @ value, scores.logsumexp(dim=-1)


def look_one_back(x: torch.Tensor) -> torch.Tensor:
    """Put the previous chunk before each chunk: (b, h, chunks, c, ...) -> (b, h, chunks, 2c, ...).

    The roll is circular over all chunks of all rounds, as in trax and HF.
    """
    return torch.cat([x.roll(1, dims=2), x], dim=3)


@register("reformer")
class ReformerAttention(Attention):
    Config = ReformerConfig
    tie_query_key = True  # the shared-QK projection; the keys are the normalised queries
    in_float32 = True  # scores near -1e5 and the log-sum-exp over rounds

    def __init__(self, *, seq_len: int, num_heads: int, head_dim: int, config: ReformerConfig) -> None:
        super().__init__(seq_len=seq_len, num_heads=num_heads, head_dim=head_dim, config=config)
        self.num_buckets = config.num_buckets or auto_num_buckets(seq_len, config.chunk_length)

    def attend(self, q, k, v, mask):
        batch, heads, n, dim = q.shape
        chunk, rounds = self.config.chunk_length, self.config.num_hashes
        padded = -(-n // chunk) * chunk
        real = torch.ones(batch, n, dtype=torch.bool, device=q.device) if mask is None else mask
        real = F.pad(real, (0, padded - n), value=False)  # (b, n_pad)
        q, k, v = (F.pad(t, (0, 0, 0, padded - n)) for t in (q, k, v))  # (b, h, n_pad, d)

        # Hash and sort: the rotations come from the global RNG and padding always takes the last bucket.
        rotations = torch.randn(heads, dim, rounds, self.num_buckets // 2, device=q.device)
        buckets = angular_lsh(k, rotations).masked_fill(~real[:, None, None, :], self.num_buckets)  # (b, h, r, n_pad)
        position = torch.arange(padded, device=q.device)
        order = (buckets * padded + position).argsort(dim=-1)  # (b, h, r, n_pad): positions by (bucket, position)

        def to_chunks(x: torch.Tensor) -> torch.Tensor:  # (b, h, n_pad, e) -> (b, h, r*n_pad/c, c, e)
            width = x.shape[-1]  # the query/key dim, or the value dim where v's differs
            index = order.flatten(2)[..., None].expand(-1, -1, -1, width)  # (b, h, r*n_pad, e)
            return x.gather(2, index).view(batch, heads, -1, chunk, width)

        query_pos = order.view(batch, heads, -1, chunk)  # (b, h, C, c)
        chunks = (
            to_chunks(q),  # (b, h, C, c, d)
            to_chunks(F.normalize(k, dim=-1)),  # (b, h, C, c, d)
            to_chunks(v),  # (b, h, C, c, dv)
            query_pos,
            real.gather(1, query_pos.flatten(1)).view_as(query_pos),  # (b, h, C, c)
        )
        if q.device.type == "cpu" and q.dtype == torch.float32 and has_kernel(q.device):
            out, lse = chunked_attention(*(x.flatten(0, 1) for x in chunks))  # (b*h, C, c, dv), (b*h, C, c)
        else:
            out, lse = chunked_dense(*chunks)  # (b, h, C, c, dv), (b, h, C, c)

        # Undo the sort, then weigh each round by its share of the total softmax mass.
        unsort = order.argsort(dim=-1)  # (b, h, r, n_pad): where each position sits in its round's order
        value_dim = v.shape[-1]
        out = out.view(batch, heads, rounds, padded, value_dim).gather(3, unsort[..., None].expand(-1, -1, -1, -1, value_dim))
        lse = lse.view(batch, heads, rounds, padded).gather(3, unsort)  # (b, h, r, n_pad)
        out = (lse.softmax(dim=2)[..., None] * out).sum(dim=2)  # (b, h, n_pad, dv)
        return out[:, :, :n]
