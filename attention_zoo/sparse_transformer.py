"""Sparse Transformer attention with the "fixed" factorised pattern, both heads merged, computed in blocks.

Rewon Child, Scott Gray, Alec Radford and Ilya Sutskever, "Generating Long Sequences with Sparse
Transformers", arXiv:1904.10509, 2019. Each query attends to an exact softmax over a sparse set of
keys, the union of two factorised patterns (the paper's "fixed" attention, Section 4.3), with block
length l = ``block_size`` and c = ``num_summary`` summary columns per block:

* A1, the block: query i sees every key j of its own block, floor(j / l) = floor(i / l);
* A2, the summaries: query i sees every key j whose offset in its block is a summary column,
  j mod l in {l - c, ..., l - 1} or j mod l = 0.

The paper writes A2 as j mod l in {t, t + 1, ..., l} with t = l - c; the Long Range Arena code reads
the last member, l, as 0 (mod l) and adds the first column of every block, as done here. LRA's
``train_utils.get_model`` runs l = 50, c = 10 (preset ``sparse_transformer_lra``); the defaults are
the paper's enwik8 setting l = 128, c = 32 (also the LRA code's own defaults).

Algorithm, for one (batch, head), with m = ceil(n / l) blocks and the r summary offsets of a block:

1. Pad the sequence to m * l and split queries, keys and values into m blocks of l.
2. Block scores: each query block against its own key block, (m, l, l).
3. Summary scores: every query against the m * r summary keys gathered from all blocks, (m, l, m * r).
   The summary keys of the query's own block are masked here, since step 2 already scores them,
   so no key counts twice.
4. Mask padded keys (and, when ``causal``, keys after the query), then one softmax over the
   concatenation [block keys, summary keys] of each query, and the probabilities weight the matching
   values. This is exactly softmax over the union A1 u A2.
5. Crop the padding; Attention.forward zeroes the padded query rows.

Memory is n * (l + m * r) scores per head, never n x n. The pattern itself is not linear: the
summary columns of all blocks are about n * (c + 1) / l keys per query, so with a fixed l the cost
grows as n^2 * (c + 1) / l (about n^2 / 4.5 for LRA's l = 50, c = 10); the paper makes it
O(n sqrt n) by choosing l ~ sqrt(n). Hence ``linear_memory = False``.

Masking fills scores with the dtype's most negative finite value rather than -inf, so a fully
padded sequence gets a finite softmax whose rows are then zeroed: no NaN forward or backward. A real
query always sees at least itself (its own block), so its softmax is never empty.

Choices where this module differs from the originals, and why:

- **Non-causal by default.** The paper's patterns are causal (autoregressive models). LRA is
  encoder-only, yet LRA's JAX code ANDs every pattern with the lower triangle even in the encoder;
  here the default is the non-causal pattern, j unrestricted, and ``causal=True`` gives LRA's exact
  masks (preset ``sparse_transformer_lra_causal``).
- **Merged heads.** Of the paper's three ways to use the two factorised patterns (interleaved
  layers, merged, split across heads), LRA merges them: every head attends over A1 u A2, as here.
- **Block-sparse, not a dense mask.** LRA builds an n x n boolean mask and runs dense masked
  attention; here only the allowed blocks and summary columns are ever scored. The result is the
  same softmax over the same keys.
- **No CLS row.** With CLS pooling LRA prepends a token that attends to, and is attended by, every
  position; this harness's model pools by mean and has no such token, so no position is special.
- **Dropout** on the attention probabilities (training only) is LRA's ``attention_dropout_rate``, 0.1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ._checks import check_dropout
from .registry import Attention, register, register_preset


@dataclass
class SparseTransformerConfig:
    block_size: int = 128  # l: block length of A1 and period of A2's summary columns (paper's enwik8)
    num_summary: int = 32  # c: the last c offsets of every block are summary columns (offset 0 is one too)
    causal: bool = False  # keep only keys j <= i, as LRA's code does even in its encoder
    dropout: float = 0.1  # attention-probability dropout, training only (LRA's attention_dropout_rate)

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {self.block_size}")
        if not 0 <= self.num_summary <= self.block_size:
            raise ValueError(f"num_summary must be in [0, block_size={self.block_size}], got {self.num_summary}")
        check_dropout(self.dropout)


@register("sparse_transformer")
class SparseTransformerAttention(Attention):
    Config = SparseTransformerConfig
    linear_memory = False  # the summary columns make n * (c + 1) / l keys per query: quadratic at fixed l

    def summary_offsets(self) -> list[int]:
        """The offsets within a block that A2 makes summary columns: 0 and the last c."""
        block, c = self.config.block_size, self.config.num_summary
        return sorted({0, *range(block - c, block)})

    def attend(self, q, k, v, mask):
        batch, heads, n, head_dim = q.shape
        block = self.config.block_size
        num_blocks = -(-n // block)
        pad = num_blocks * block - n
        dropout = self.config.dropout if self.training else 0.0
        device = q.device

        # Step 1: blocks of l (the padded positions are masked as keys below and cropped as queries).
        q = q / math.sqrt(head_dim)
        q_blocks = F.pad(q, (0, 0, 0, pad)).view(batch, heads, num_blocks, block, head_dim)  # (b, h, m, l, d)
        k_blocks = F.pad(k, (0, 0, 0, pad)).view(batch, heads, num_blocks, block, head_dim)  # (b, h, m, l, d)
        v_blocks = F.pad(v, (0, 0, 0, pad)).view(batch, heads, num_blocks, block, v.shape[-1])  # (b, h, m, l, dv)
        real = torch.ones(batch, n, dtype=torch.bool, device=device) if mask is None else mask  # (b, n)
        real = F.pad(real, (0, pad)).view(batch, num_blocks, block)  # (b, m, l); padding is not real

        # Step 2: each query block against its own key block.
        block_scores = torch.einsum("bhmxd,bhmyd->bhmxy", q_blocks, k_blocks)  # (b, h, m, l, l)
        block_allowed = real[:, :, None, :]  # (b, m, 1, l)
        if self.config.causal:
            offsets = torch.arange(block, device=device)
            block_allowed = block_allowed & (offsets[None, :] <= offsets[:, None])  # (b, m, l, l)

        # Step 3: every query against the summary keys of all blocks, its own block's masked.
        offsets = torch.tensor(self.summary_offsets(), device=device)  # (r,)
        k_summary = k_blocks[:, :, :, offsets].flatten(2, 3)  # (b, h, m * r, d)
        v_summary = v_blocks[:, :, :, offsets].flatten(2, 3)  # (b, h, m * r, dv)
        summary_scores = torch.einsum("bhmxd,bhsd->bhmxs", q_blocks, k_summary)  # (b, h, m, l, m * r)
        key_block = torch.arange(num_blocks, device=device).repeat_interleave(len(offsets))  # (m * r,)
        other_block = key_block[None, :] != torch.arange(num_blocks, device=device)[:, None]  # (m, m * r)
        summary_allowed = real[:, :, offsets].flatten(1, 2)[:, None, None, :] & other_block[None, :, None, :]  # (b, m, 1, m * r)
        if self.config.causal:
            key_position = key_block * block + offsets.repeat(num_blocks)  # (m * r,)
            query_position = torch.arange(num_blocks * block, device=device).view(num_blocks, block, 1)  # (m, l, 1)
            summary_allowed = summary_allowed & (key_position <= query_position)  # (b, m, l, m * r)

        # Step 4: one softmax over [block keys, summary keys]. The fill is the scores' own dtype's most negative
        # finite value (under autocast they may be bfloat16), so a row with no real key stays NaN-free.
        masked = torch.finfo(block_scores.dtype).min
        block_scores = block_scores.masked_fill(~block_allowed[:, None], masked)  # (b, h, m, l, l)
        summary_scores = summary_scores.masked_fill(~summary_allowed[:, None], masked)  # (b, h, m, l, m * r)
        scores = torch.cat([block_scores, summary_scores], dim=-1)  # (b, h, m, l, l + m * r)
        probs = F.dropout(scores.softmax(dim=-1), dropout)  # (b, h, m, l, l + m * r)
        out = torch.einsum("bhmxy,bhmyd->bhmxd", probs[..., :block], v_blocks)  # (b, h, m, l, dv)
        out = out + torch.einsum("bhmxs,bhsd->bhmxd", probs[..., block:], v_summary)  # (b, h, m, l, dv)

        # Step 5: crop the padding.
        return out.reshape(batch, heads, num_blocks * block, v.shape[-1])[:, :, :n]  # (b, h, n, dv)


register_preset(
    "sparse_transformer_lra",
    "sparse_transformer",
    "the LRA row's fixed pattern (train_utils.get_model): blocks of 50, 10 summary columns, both patterns merged in "
    "every head, non-causal as an encoder (LRA's code is causal: sparse_transformer_lra_causal)",
    block_size=50,
    num_summary=10,
    causal=False,
    dropout=0.1,
)

register_preset(
    "sparse_transformer_lra_causal",
    "sparse_transformer",
    "exactly the masks LRA's code built for its encoder: the lra pattern (blocks of 50, 10 summary columns) "
    "ANDed with the lower triangle",
    block_size=50,
    num_summary=10,
    causal=True,
    dropout=0.1,
)
