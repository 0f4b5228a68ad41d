"""Local attention: exact softmax attention within non-overlapping blocks of the sequence.

The "Local Attention" baseline of Yi Tay, Mostafa Dehghani, Samira Abnar et al., "Long Range Arena:
A Benchmark for Efficient Transformers", ICLR 2021 (code: google-research/long-range-arena,
``lra_benchmarks/models/local/``). The sequence is cut into blocks of ``block_size`` consecutive
tokens and every query attends, with exact softmax, to the keys of its own block only: position i
sees position j exactly when i // block_size == j // block_size. No block sees its neighbours, so
cost and memory are O(n * block_size).

Algorithm, for one (batch, head):

1. Clamp the block to ``B = min(block_size, n)``: one block holding a shorter sequence is the same
   attention, without padding it up to ``block_size``.
2. Pad the sequence at the end to a multiple of B (never truncating it) and view it as c = n_pad / B
   blocks of B tokens, with heads and blocks on one batch axis: (b, h * c, B, d).
3. Key mask per block, (b, h * c, B, B): real keys only (padded ones and the positions past the end are
   masked), except that every position may always see its own key. A real query's own key is real,
   so this changes nothing for it; a padded query (a padded token, or a position past the end) would
   otherwise have no key at all in a fully padded block, and the softmax of an empty row is NaN in the
   forward and backward pass. Its row is cropped or zeroed afterwards, and no real query ever sees a
   padded key. Without padding and a mask, no mask is passed (SDPA's fastest backends take none).
4. softmax(q k^T / sqrt(d)) v within each block, on fused kernels
   (``torch.nn.functional.scaled_dot_product_attention``), with dropout on the probabilities in
   training.
5. Crop the padding; :meth:`Attention.forward` zeroes the padded query rows.

What the LRA code does, and what is chosen here:

- Block size. ``LocalAttention`` defaults to 20, but ``LocalTransformerEncoder`` and its block pass
  ``block_size=50``, which is what ListOps, Text and Retrieval (whose configs set nothing) ran; the
  CIFAR-10 and Pathfinder-32 configs set ``config.model.block_size = 64``. The default here is 50; an
  image row takes ``block_size=64``.
- No neighbouring blocks. The LRA code attends within one block only (no overlap, no look-around),
  as here.
- Which tokens form a block. The LRA code reshapes the projected (batch, n_pad, heads, d) queries,
  keys and values to (batch, block_size, n_pad / block_size, heads, d) and attends over the
  ``block_size`` axis. In row-major order that groups position p with the positions congruent to it
  modulo n_pad / block_size: group g is {g, g + n_pad / B, g + 2 n_pad / B, ...}, a strided set
  spanning the whole sequence, not B consecutive tokens. Its padding mask, by contrast, is reshaped
  to (batch * n_pad / B, B) and so describes *consecutive* blocks: the mask that group g receives is
  the one of tokens g B .. g B + B - 1. The code's own names ("block reshape", "divide padding mask
  into block") and its padding mask say consecutive blocks, as does the name local attention, so this
  module implements consecutive blocks with the mask of their own tokens; the strided grouping and
  the mismatched mask of the LRA code are not reproduced.
- Padding to a multiple. The LRA code always pads ``block_size - n % block_size`` tokens, a whole
  extra block when n is already a multiple, and pads its padding mask with the value -1e9, which as a
  boolean is True: the appended positions count as real keys there. Here the padding is the least
  that reaches a multiple of B, the appended positions are masked keys, and the output is cropped to
  n, as the LRA code crops it.
- Dropout 0.1 on the attention probabilities (training only) is the LRA ``attention_dropout_rate``;
  the LRA code draws it per element (``broadcast_dropout=False``), as SDPA does.
- Precision. The LRA code computes in its model dtype (float32 in the LRA runs); here, as for
  ``softmax`` and its SDPA call, the input dtype is kept (``attention_in_float32`` forces float32).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ._checks import check_dropout
from .registry import Attention, register


@dataclass
class LocalConfig:
    block_size: int = 50  # consecutive tokens per block (the LRA text tasks' 50; its image tasks ran 64)
    dropout: float = 0.1  # attention-probability dropout, training only (the LRA attention_dropout_rate)

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1 (tokens per block), got {self.block_size}")
        check_dropout(self.dropout)


@register("local")
class LocalAttention(Attention):
    Config = LocalConfig

    def attend(self, q, k, v, mask):
        batch, heads, n, head_dim = q.shape
        value_dim = v.shape[-1]
        dropout = self.config.dropout if self.training else 0.0

        # Steps 1-2: blocks of B consecutive tokens, the tail padded up to a multiple of B.
        block = min(self.config.block_size, n)
        num_blocks = -(-n // block)
        pad = num_blocks * block - n
        # The head and block axes merge into one batch axis of SDPA: (b, h, c * B, d) -> (b, h * c, B, d) is a view.
        q = F.pad(q, (0, 0, 0, pad)).reshape(batch, heads * num_blocks, block, head_dim)  # (b, h*c, B, d)
        k = F.pad(k, (0, 0, 0, pad)).reshape(batch, heads * num_blocks, block, head_dim)  # (b, h*c, B, d)
        v = F.pad(v, (0, 0, 0, pad)).reshape(batch, heads * num_blocks, block, value_dim)  # (b, h*c, B, dv)

        # Step 3: real keys, and each position's own key so that no row is empty.
        attn_mask = None
        if mask is not None or pad:
            real = torch.ones(batch, n, dtype=torch.bool, device=q.device) if mask is None else mask  # (b, n)
            real = F.pad(real, (0, pad), value=False).view(batch, 1, num_blocks, 1, block)  # (b, 1, c, 1, B): per key
            own = torch.eye(block, dtype=torch.bool, device=q.device)  # (B, B)
            attn_mask = (real | own).expand(batch, heads, num_blocks, block, block)  # (b, h, c, B, B)
            attn_mask = attn_mask.reshape(batch, heads * num_blocks, block, block)  # (b, h*c, B, B)

        # Step 4: exact softmax attention within each block.
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout)  # (b, h*c, B, dv)

        # Step 5: crop the padding (Attention.forward zeroes the padded query rows).
        return out.reshape(batch, heads, num_blocks * block, value_dim)[:, :, :n]  # (b, h, n, dv)
