"""BigBird block-sparse attention, the ITC variant that the Long Range Arena ran.

Manzil Zaheer, Guru Guruganesh, Avinava Dubey et al., "Big Bird: Transformers for Longer Sequences",
NeurIPS 2020. The sequence is cut into blocks of ``block_size`` tokens. In the ITC (internal
transformer construction) variant the first and the last block are global: they attend to every
key and every query attends to them. Every other query block attends to

* the two global blocks,
* a sliding window of three blocks: its own and both neighbours,
* ``num_random_blocks`` random blocks, drawn outside the global blocks and the window.

Algorithm, for one (batch, head), with B = ``block_size``, c blocks and r random blocks:

1. Pad the sequence to a multiple of B (padded positions are masked keys) and scale q by 1/sqrt(d).
2. Global rows: the queries of the first and last block score every key, a (2B, n) block, linear in n.
3. Other rows: query block i gathers its 5 + r key blocks [first, last, i - 1, i, i + 1, random...]
   and scores them, a (c - 2, B, (5 + r) B) tensor. A slot that repeats an earlier one (the window's
   i - 1 is the first block when i = 1, its i + 1 the last when i = c - 2) or a random slot left
   empty is masked, so the softmax runs exactly once over the union of the attended blocks.
4. Masked keys score the dtype's minimum (finite, so a fully padded row stays NaN-free) and get an
   exact zero weight beside any real key; every real query has one, itself, in its own block.
5. One softmax per row, probabilities times the gathered values, crop the padding.

Memory is block-linear: the largest tensors are the (c - 2) (5 + r) B^2 scores and the 2 B n global
rows. A sequence of at most two blocks is all global, i.e. full softmax attention.

Random blocks, as the LRA code draws them and where this module differs:

- **Fixed per layer and head.** LRA seeds numpy with the layer index (``connectivity_seed=lyr``) on
  every call and draws an independent set per head, shared by the batch, so a layer always sees the
  same blocks. Here each layer draws its random integers once, at build time, from torch's global
  RNG (a ``draws`` buffer, so a checkpoint keeps them): the model's seed fixes them, and they never
  change between calls, in training or evaluation.
- **Drawn from the first 1024 tokens.** The original BigBird code, which LRA copies, passes
  ``last_idx=1024`` (``min(seq_len, 1024)`` in LRA): random blocks come only from blocks 1 ..
  1024 // B - 1, whatever the length (that cap applies only when 1024 > 2 B). ``random_within``
  keeps that rule; ``None`` draws from the whole sequence as the paper describes.
- **Candidates.** A block's random blocks are distinct, never global and never in its window,
  drawn uniformly. LRA's numpy rules special-case the second, third and the last two blocks, and
  exclude a few extra neighbours of the last blocks under the 1024-token cap; here every block draws
  from the same clean pool. When the pool holds fewer than r blocks, all of them are taken and the
  remaining slots stay empty (LRA would fail on such short sequences; HF falls back to full attention).
- The draws depend on the number of blocks, so inputs longer than ``seq_len`` (the build length)
  are rejected: the buffer holds draws for ``seq_len`` only.
- **No attention dropout**: LRA's sparse path takes ``dropout_rate`` but never applies it.
- **Masking** is exact (a zero weight) instead of LRA's additive -10000, and the softmax runs in
  float32 for float16/bfloat16 inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .registry import Attention, register


@dataclass
class BigBirdConfig:
    block_size: int = 64  # tokens per block (LRA's _DEFAULT_BLOCK_SIZE)
    num_random_blocks: int = 3  # random key blocks per query block (LRA's num_rand_blocks)
    random_within: int | None = 1024  # random blocks come from the first tokens (the original last_idx); None: anywhere

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {self.block_size}")
        if self.num_random_blocks < 0:
            raise ValueError(f"num_random_blocks must be >= 0, got {self.num_random_blocks}")
        if self.random_within is not None and self.random_within < 1:
            raise ValueError(f"random_within must be a positive number of tokens or None, got {self.random_within}")


@register("bigbird")
class BigBirdAttention(Attention):
    Config = BigBirdConfig

    def __init__(self, *, seq_len: int, num_heads: int, head_dim: int, config: BigBirdConfig) -> None:
        super().__init__(seq_len=seq_len, num_heads=num_heads, head_dim=head_dim, config=config)
        self.max_blocks = -(-seq_len // config.block_size)
        # One non-negative integer per (head, non-global block, random slot), reduced modulo the pool
        # size when the blocks are chosen. Integers, so casting the model to bfloat16 leaves them as they are.
        draws = torch.randint(0, 2**31 - 1, (num_heads, max(self.max_blocks - 2, 0), config.num_random_blocks))
        self.register_buffer("draws", draws)

    def random_blocks(self, num_blocks: int) -> torch.Tensor:
        """The random key blocks of query blocks 1 .. num_blocks - 2, per head: (h, num_blocks - 2, r), -1 where empty."""
        if num_blocks > self.max_blocks:
            raise ValueError(
                f"bigbird was built for seq_len={self.seq_len} ({self.max_blocks} blocks of {self.config.block_size}); "
                f"an input of {num_blocks} blocks has no random draws"
            )
        block, r = self.config.block_size, self.config.num_random_blocks
        middle = max(num_blocks - 2, 0)
        draws = self.draws[:, :middle]  # (h, m, r)
        # The pool: non-global blocks 1 .. top, minus the window i - 1, i, i + 1.
        top = num_blocks - 2
        if self.config.random_within is not None and self.config.random_within > 2 * block:
            top = min(top, self.config.random_within // block - 1)
        query_block = torch.arange(1, middle + 1, device=draws.device)[None, :, None]  # (1, m, 1)
        left = (torch.clamp(query_block - 2, max=top)).clamp(min=0)  # blocks 1 .. i - 2
        right = (top - query_block - 1).clamp(min=0)  # blocks i + 2 .. top
        pool = left + right  # (1, m, 1)

        # Sampling without replacement: slot j takes the u-th of the pool's ranks still free, u < pool - j.
        rank = draws[..., :0]  # (h, m, 0): the ranks taken so far
        for j in range(r):
            pick = draws[..., j : j + 1] % (pool - j).clamp(min=1)  # (h, m, 1)
            for taken in rank.sort(dim=-1).values.unbind(-1):  # skip the ranks taken, in increasing order
                pick = pick + (pick >= taken[..., None]).long()
            rank = torch.cat([rank, pick], dim=-1)  # (h, m, j + 1)
        blocks = torch.where(rank < left, rank + 1, query_block + 2 + rank - left)  # (h, m, r)
        slot = torch.arange(r, device=draws.device)
        return torch.where(slot < pool, blocks, -1)

    def attend(self, q, k, v, mask):
        batch, heads, n, head_dim = q.shape
        value_dim = v.shape[-1]
        block = self.config.block_size
        num_blocks = -(-n // block)
        pad = num_blocks * block - n
        real = torch.ones(batch, n, dtype=torch.bool, device=q.device) if mask is None else mask  # (b, n)

        # Step 1: pad to whole blocks; padded positions are masked keys.
        real = F.pad(real, (0, pad), value=False)  # (b, N)
        q = F.pad(q, (0, 0, 0, pad)) / math.sqrt(head_dim)  # (b, h, N, d)
        k, v = F.pad(k, (0, 0, 0, pad)), F.pad(v, (0, 0, 0, pad))  # (b, h, N, d), (b, h, N, dv)
        q_blocks = q.view(batch, heads, num_blocks, block, head_dim)  # (b, h, c, B, d)

        # Step 2: the global query blocks (the first, and the last when it differs) attend to everything.
        global_index = [0] if num_blocks == 1 else [0, num_blocks - 1]
        global_q = q_blocks[:, :, global_index].flatten(2, 3)  # (b, h, gB, d)
        scores = global_q @ k.transpose(-1, -2)  # (b, h, gB, N)
        global_out = self._softmax(scores, real[:, None, None, :]) @ v  # (b, h, gB, dv)
        global_out = global_out.view(batch, heads, len(global_index), block, value_dim)  # (b, h, g, B, dv)
        if num_blocks <= 2:
            return global_out.reshape(batch, heads, num_blocks * block, value_dim)[:, :, :n]

        # Step 3: the key blocks of every other query block: [first, last, i - 1, i, i + 1, random...].
        middle = num_blocks - 2
        query_block = torch.arange(1, num_blocks - 1, device=q.device)[:, None]  # (m, 1)
        first, last = torch.zeros_like(query_block), torch.full_like(query_block, num_blocks - 1)  # (m, 1)
        window = query_block + torch.arange(-1, 2, device=q.device)  # (m, 3)
        fixed = torch.cat([first, last, window], dim=1)  # (m, 5)
        fixed_valid = torch.ones(middle, 5, dtype=torch.bool, device=q.device)
        fixed_valid[:, 2] = query_block[:, 0] != 1  # i - 1 is the first block
        fixed_valid[:, 4] = query_block[:, 0] != num_blocks - 2  # i + 1 is the last block
        random = self.random_blocks(num_blocks)  # (h, m, r)
        index = torch.cat([fixed.expand(heads, -1, -1), random.clamp(min=0)], dim=2)  # (h, m, S)
        valid = torch.cat([fixed_valid.expand(heads, -1, -1), random >= 0], dim=2)  # (h, m, S)
        slots = index.shape[-1]

        head = torch.arange(heads, device=q.device)[:, None]  # (h, 1)
        flat_index = index.flatten(1)  # (h, mS)
        k_blocks = k.view(batch, heads, num_blocks, block, head_dim)  # (b, h, c, B, d)
        v_blocks = v.view(batch, heads, num_blocks, block, value_dim)  # (b, h, c, B, dv)
        keys = k_blocks[:, head, flat_index].view(batch, heads, middle, slots * block, head_dim)  # (b, h, m, SB, d)
        values = v_blocks[:, head, flat_index].view(batch, heads, middle, slots * block, value_dim)  # (b, h, m, SB, dv)
        key_real = real.view(batch, num_blocks, block)[:, flat_index]  # (b, h, mS, B)
        allowed = key_real.view(batch, heads, middle, slots, block) & valid[None, :, :, :, None]  # (b, h, m, S, B)

        # Steps 4 and 5: one softmax over the union of the attended blocks.
        scores = torch.einsum("bhmxd,bhmyd->bhmxy", q_blocks[:, :, 1:-1], keys)  # (b, h, m, B, SB)
        middle_out = self._softmax(scores, allowed.view(batch, heads, middle, 1, slots * block)) @ values  # (b, h, m, B, dv)
        out = torch.cat([global_out[:, :, :1], middle_out, global_out[:, :, 1:]], dim=2)  # (b, h, c, B, dv)
        return out.reshape(batch, heads, num_blocks * block, value_dim)[:, :, :n]  # (b, h, n, dv)

    @staticmethod
    def _softmax(scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """Softmax over the allowed keys, normalised in float32 at least and returned in the scores' dtype."""
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        wide = torch.promote_types(scores.dtype, torch.float32)  # float16/bfloat16 sums drift; float64 stays
        return scores.softmax(dim=-1, dtype=wide).to(scores.dtype)
