"""Sparse Sinkhorn attention: local attention within a block plus attention to a learned, sorted block.

Yi Tay, Dara Bahri, Liu Yang, Donald Metzler and Da-Cheng Juan, "Sparse Sinkhorn Attention",
ICML 2020. A sorting network scores every pair of blocks, Sinkhorn normalisation turns the scores
into an approximately doubly stochastic matrix (a relaxed permutation), and each query block
attends to the keys of the block that matrix sorts into its place, as well as to its own.

Algorithm, for one (batch, head), with B = ``block_size`` and c = ceil(n / B) blocks:

1. Pad the sequence to c B (padded positions are masked) and cut q, k, v into c blocks.
2. Block embeddings: the sum of each block's real keys, (c, d).
3. Sorting network: a linear map, shared by the heads, from the embedding of block i to its scores
   R_i over the blocks j, (c, c). Its output has one column per block of a ``seq_len`` input and
   is cropped to the c blocks present.
4. Sinkhorn normalisation in log space: log P = R / temperature, then ``sinkhorn_iterations`` times
   subtract the row log-sum-exp and then the column log-sum-exp; P = exp(log P). Rows and columns
   then sum to one in the limit (columns exactly after every iteration).
5. Sorted blocks: K~_i = sum_j P_ij K_j and V~_i = sum_j P_ij V_j, with padded keys and values as
   zeros, so they never contribute. A sorted slot is masked when no real key reaches it.
6. Each query block attends to its own block, softmax(Q_i K_i^T / sqrt(d)) V_i, and to its sorted
   block, softmax(Q_i K~_i^T / sqrt(d)) V~_i; the output is the sum of the two, as the LRA code adds
   its local and sorted attentions. Attention dropout (training only) acts on both.

Padding. Blocks holding no real token take no part in the sorting: P is zero between such a block
and a real one (both directions), so the real blocks are balanced among themselves exactly as if
the padded blocks were absent; padded blocks are balanced among themselves, which keeps every row
finite. The arithmetic runs in float32 (log-sum-exps and the iterated normalisation).

Memory: the local and sorted scores are (c, B, B) each, linear in n; the sorting matrix is (c, c),
(n / B)^2, which stays far below the scores for B of tens of tokens at the LRA lengths.

Choices where this module differs from the LRA code, and why:

- **Sinkhorn, not softmax.** LRA's ``SinkhornAttention`` defaults to ``sort_activation='softmax'``
  (rows only) and its encoders never change it; this module runs the paper's Sinkhorn balancing
  with the LRA operator's defaults (1 iteration, temperature 1). LRA's operator also clips the final
  log P to [-1, 1], which undoes the normalisation; that clip is not done here. No Gumbel noise.
- **Sorting by the matrix.** LRA's einsum ``'bskhd,bnhl->bsnhd'`` sums the key blocks and the
  rows of P separately, so every "sorted" block is the plain sum of all blocks; here sorted block
  i is sum_j P_ij K_j as in the paper.
- **Contiguous blocks.** LRA reshapes (length,) to (block_size, num_blocks), so its "blocks" are
  strided sets of positions {k, k + c, k + 2c, ...}; here a block is B consecutive tokens, as in the
  paper. A length that is not a multiple of B is padded (LRA requires a multiple).
- **Masked keys never contribute.** LRA sums padded keys into the block embeddings and mixes them
  into the sorted blocks; here they are zeros in both and masked in the softmaxes.
- **Sorting network width.** LRA's dense layer has a fixed ``max_num_blocks=25`` outputs, fewer
  than the 40-80 blocks of its 2000-4000-token tasks; here it has one output per block of seq_len.
  It has no bias and a Xavier-uniform init, as LRA's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import check_dropout
from .registry import Attention, register


@dataclass
class SinkhornConfig:
    block_size: int = 50  # tokens per block (LRA's block_size for ListOps, Text and Retrieval; 64 on images)
    sinkhorn_iterations: int = 1  # row-then-column normalisations (the LRA sinkhorn_operator's n_iters)
    temperature: float = 1.0  # the scores are divided by it before balancing (the LRA operator's temp)
    dropout: float = 0.1  # attention-probability dropout, training only (LRA's attention_dropout_rate)

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {self.block_size}")
        if self.sinkhorn_iterations < 1:
            raise ValueError(f"sinkhorn_iterations must be at least 1, got {self.sinkhorn_iterations}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")
        check_dropout(self.dropout)


@register("sinkhorn")
class SinkhornAttention(Attention):
    Config = SinkhornConfig
    in_float32 = True  # log-sum-exps over the iterated normalisation

    def __init__(self, *, seq_len: int, num_heads: int, head_dim: int, config: SinkhornConfig) -> None:
        super().__init__(seq_len=seq_len, num_heads=num_heads, head_dim=head_dim, config=config)
        self.max_blocks = -(-seq_len // config.block_size)
        self.sort_net = nn.Linear(head_dim, self.max_blocks, bias=False)  # block embedding -> scores over blocks
        nn.init.xavier_uniform_(self.sort_net.weight)

    def _blocks(self, mask: torch.Tensor | None, batch: int, n: int, device: torch.device) -> tuple[int, int, torch.Tensor]:
        """Blocks, padding and the (b, c, B) real-token mask of the padded sequence."""
        block = self.config.block_size
        num_blocks = -(-n // block)
        if num_blocks > self.max_blocks:
            raise ValueError(
                f"sinkhorn was built for seq_len={self.seq_len} ({self.max_blocks} blocks of {block}); its sorting "
                f"network has no scores for an input of {num_blocks} blocks"
            )
        pad = num_blocks * block - n
        real = torch.ones(batch, n, dtype=torch.bool, device=device) if mask is None else mask  # (b, n)
        return num_blocks, pad, F.pad(real, (0, pad), value=False).view(batch, num_blocks, block)  # (b, c, B)

    def key_blocks(self, k: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Step 1 for the keys (b, h, n, d): their blocks (b, h, c, B, d), padded keys zero, and the (b, c, B) real mask."""
        batch, heads, n, head_dim = k.shape
        num_blocks, pad, real = self._blocks(mask, batch, n, k.device)
        blocks = F.pad(k, (0, 0, 0, pad)).view(batch, heads, num_blocks, -1, head_dim) * real[:, None, :, :, None]
        return blocks, real

    def sorting_matrix(self, key_blocks: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """The balanced sorting matrix P of steps 2-4, (b, h, c, c): row i mixes the blocks sorted into block i.
        ``key_blocks``, ``real``: what :meth:`key_blocks` makes of the keys and their mask."""
        num_blocks = key_blocks.shape[2]
        embedding = key_blocks.sum(dim=3)  # (b, h, c, d): padded keys add nothing
        scores = F.linear(embedding, self.sort_net.weight[:num_blocks].to(key_blocks.dtype))  # (b, h, c, c)
        # Real blocks are balanced among themselves, padded ones among themselves; the diagonal is
        # always allowed, so every row and column keeps a finite log-sum-exp.
        block_real = real.any(dim=2)  # (b, c)
        same_kind = block_real[:, :, None] == block_real[:, None, :]  # (b, c, c)
        log_p = (scores / self.config.temperature).masked_fill(~same_kind[:, None], float("-inf"))  # (b, h, c, c)
        for _ in range(self.config.sinkhorn_iterations):
            log_p = log_p - log_p.logsumexp(dim=-1, keepdim=True)  # rows
            log_p = log_p - log_p.logsumexp(dim=-2, keepdim=True)  # columns
        return log_p.exp()

    def attend(self, q, k, v, mask):
        batch, heads, n, head_dim = q.shape
        value_dim = v.shape[-1]
        dropout = self.config.dropout if self.training else 0.0

        # Step 1: blocks; padded keys and values are zeros, so no mixture below picks them up.
        k, real = self.key_blocks(k, mask)  # (b, h, c, B, d), (b, c, B)
        num_blocks = k.shape[2]
        pad = num_blocks * k.shape[3] - n
        q = F.pad(q, (0, 0, 0, pad)).view(batch, heads, num_blocks, -1, head_dim) / math.sqrt(head_dim)  # (b, h, c, B, d)
        v = F.pad(v, (0, 0, 0, pad)).view(batch, heads, num_blocks, -1, value_dim) * real[:, None, :, :, None]  # (b, h, c, B, dv)
        p = self.sorting_matrix(k, real)  # (b, h, c, c): steps 2-4

        # Step 5: sort the key and value blocks; a sorted slot is real when some real key reaches it.
        sorted_k = torch.einsum("bhij,bhjxd->bhixd", p, k)  # (b, h, c, B, d)
        sorted_v = torch.einsum("bhij,bhjxd->bhixd", p, v)  # (b, h, c, B, dv)
        sorted_real = torch.einsum("bhij,bjx->bhix", p, real.to(p.dtype)) > 0  # (b, h, c, B)

        # Step 6: local and sorted attention, each its own softmax, added.
        local = self._attention(q, k, v, real[:, None, :, None, :], dropout)  # (b, h, c, B, dv)
        sorted_out = self._attention(q, sorted_k, sorted_v, sorted_real[:, :, :, None, :], dropout)  # (b, h, c, B, dv)
        out = (local + sorted_out).reshape(batch, heads, -1, value_dim)  # (b, h, cB, dv)
        return out[:, :, :n]

    @staticmethod
    def _attention(q, k, v, allowed, dropout):
        """Block-wise softmax attention over the allowed keys; a row with none gets a finite uniform softmax."""
        scores = (q @ k.transpose(-1, -2)).masked_fill(~allowed, torch.finfo(q.dtype).min)  # (b, h, c, B, B)
        return F.dropout(scores.softmax(dim=-1), dropout) @ v
