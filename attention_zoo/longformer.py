"""Longformer sliding-window attention with optional global tokens, computed in blocks.

Iz Beltagy, Matthew E. Peters and Arman Cohan, "Longformer: The Long-Document Transformer",
arXiv:2004.05150, 2020. Every query attends to the keys within a fixed window around it; a few
"global" tokens (the CLS token in classification) attend to every key and are attended to by every
query. Cost and memory are O(n * window) instead of O(n^2).

``window`` is the *total* window, as in Hugging Face's ``attention_window``: query ``i`` attends to
the keys ``j`` with ``|i - j| <= window / 2`` (``window + 1`` keys, itself included), so the window
must be positive and even. The default 512 is the paper's (and HF's) setting and the JAX LRA
Longformer's ``sliding_window_size``; the YOSO paper names 512 for its Table 3 baseline (its
authors' efficiency script ran 128).

Algorithm, for one (batch, head), with r = window / 2 and g global tokens (the first g positions):

1. Clamp the radius to ``min(r, n - 1)`` (a wider window already covers the whole sequence, so the
   result is unchanged) and use it as the block size ``B`` (at least 1).
2. Pad the sequence to a multiple of B and split the queries into blocks of B. Query block c
   attends to key blocks c - 1, c and c + 1 (3B keys, zero-padded at both ends): every key within
   distance r <= B of a query in block c lies there. The scores are a (n / B, B, 3B) tensor, about
   1.5 * n * window entries; nothing of size n x n is ever formed.
3. Mask the scores outside the exact band |i - j| <= r, the padded keys, the positions past the
   end, and the global keys (they get their own columns in the next step, so none counts twice).
4. Global keys: every query also scores the g global keys, a (n, g) block. One softmax runs over
   the concatenation [global keys, local band], and the probabilities weight the matching values.
5. Global queries: the g global rows attend to every key, a (g, n) block of full attention, and
   replace their sliding-window rows in the output.
6. Crop the padding and zero the padded query rows.

A sequence so short that a dense (n, n) score matrix is no bigger than the blocks' scores of steps 2-4
(n^2 <= padded n * (g + 3B), about n <= 1.5 * window: ListOps at 512 with the 512 window) gets steps 2-5
as one masked softmax over the same allowed pairs (band, global rows and columns, real keys), which
skips the padding, the gathering of windows and the separate global blocks: the same attention at about
half the cost on the CPU (n = 512, batch 32, 2 heads, forward and backward on one thread: 0.86 s against 1.74 s,
measured in one run).

On a CPU in float32 (with YOSO's CPU kernels built, :mod:`yoso_cuda`), steps 2-5 are one fused op instead,
``yoso_cuda.softmax_dropout_attention`` with the radius and the global tokens: it walks the queries in blocks and
scores only the keys a block can see (the band and the global keys), holding one block's scores at a time, with the
dropout inside, so no score tensor is ever stored for the backward. Its dropout mask has the distribution of
``F.dropout``'s but its own random stream (:mod:`yoso_cuda.softmax`). A query that sees no real key (only in the
padding) gets a zero row there; the padded rows are zeroed in the end either way.

The softmax and everything around it run in float32 (as HF's ``softmax(..., dtype=float32)``), and
the output is cast back to the input dtype. Masking fills scores with the float32 minimum rather
than -inf, so a fully padded sequence gets a finite (uniform) softmax whose rows are then zeroed: no
NaN in the forward or the backward pass.

Choices where this module differs from the originals, and why:

- **Tied global projections.** The paper (and HF) project the global queries, keys and values with
  separate weights (``query_global`` etc.). A core attention here receives q, k and v already
  projected by ``MultiHeadAttention``, so global tokens use the same projections as local ones.
  That is exactly the Longformer baseline of the YOSO and Nystromformer authors, whose wrapper ties
  every global weight and bias to the local one.
- **One window for all layers, no dilation.** The paper grows the window with depth and dilates
  some heads for autoregressive character modelling; its classification models, HF and the LRA
  baselines use one undilated window, as here.
- **Blocks of window / 2.** HF splits the sequence into chunks of ``window`` overlapping by
  ``window / 2`` and computes about 2 * n * window scores; three neighbouring blocks of
  ``window / 2`` need 1.5 * n * window. The masked result is the same exact band.
- **Padding beats "global".** The YOSO authors' wrapper marks token 0 global by overwriting the
  mask, which would turn a padded token 0 into a real one; here a padded global token contributes
  nothing, like any padded key. A sequence shorter than ``num_global_tokens`` has every token global,
  i.e. full softmax attention.
- **Dropout** on the attention probabilities (training only) is HF's ``attention_probs_dropout_prob``
  (0.1 in the ``LongformerConfig()`` the YOSO authors built), applied to local and global rows alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from yoso_cuda import has_kernel, softmax_dropout_attention

from ._checks import check_dropout
from .registry import Attention, register, register_preset

_MASKED = torch.finfo(torch.float32).min  # finite, so a row with no real key stays NaN-free


@dataclass
class LongformerConfig:
    window: int = 512  # total sliding window (HF attention_window): window / 2 keys on each side plus self
    num_global_tokens: int = 0  # the first tokens (e.g. CLS) attend everywhere and are attended by all
    dropout: float = 0.1  # attention-probability dropout, training only (HF attention_probs_dropout_prob)

    def __post_init__(self) -> None:
        if self.window < 2 or self.window % 2:
            raise ValueError(
                f"window must be a positive even number (window / 2 keys on each side of a query, as HF's "
                f"attention_window), got {self.window}; use e.g. {max(2, self.window + self.window % 2)}"
            )
        if self.num_global_tokens < 0:
            raise ValueError(f"num_global_tokens must be >= 0, got {self.num_global_tokens}")
        check_dropout(self.dropout)


@register("longformer")
class LongformerAttention(Attention):
    Config = LongformerConfig
    in_float32 = True  # the softmax and everything around it, as HF's softmax(..., dtype=float32)

    def attend(self, q, k, v, mask):
        batch, heads, n, head_dim = q.shape
        num_global = min(self.config.num_global_tokens, n)
        dropout = self.config.dropout if self.training else 0.0
        # Step 1: a radius past n - 1 changes nothing; the block must be at least the radius.
        radius = min(self.config.window // 2, n - 1)
        if q.device.type == "cpu" and q.dtype == torch.float32 and has_kernel(q.device):
            return softmax_dropout_attention(q, k, v, mask, dropout, radius, num_global)  # steps 2-5, fused

        q = q / math.sqrt(head_dim)
        real = torch.ones(batch, n, dtype=torch.bool, device=q.device) if mask is None else mask  # (b, n)
        block = max(radius, 1)
        num_blocks = -(-n // block)
        pad = num_blocks * block - n
        if n * n <= num_blocks * block * (num_global + 3 * block):
            return dense_band(q, k, v, real, num_global, radius, dropout)

        # Step 2: query blocks and, for each, its three neighbouring key/value blocks (unfold is a view).
        q_blocks = F.pad(q, (0, 0, 0, pad)).view(batch, heads, num_blocks, block, head_dim)  # (b, h, c, B, d)
        k_windows = F.pad(k, (0, 0, block, pad + block)).unfold(2, 3 * block, block)  # (b, h, c, d, 3B)
        v_windows = F.pad(v, (0, 0, block, pad + block)).unfold(2, 3 * block, block)  # (b, h, c, dv, 3B)
        scores = torch.einsum("bhcxd,bhcdy->bhcxy", q_blocks, k_windows)  # (b, h, c, B, 3B)

        # Step 3: query x of a block sits at window column x + B, so |i - j| <= r is |y - x - B| <= r.
        offset = torch.arange(3 * block, device=q.device) - torch.arange(block, device=q.device)[:, None] - block
        band = offset.abs() <= radius  # (B, 3B)
        local_key = real.clone()
        local_key[:, :num_global] = False  # global keys are scored separately in step 4
        local_key = F.pad(local_key, (block, pad + block)).unfold(1, 3 * block, block)  # (b, c, 3B)
        allowed = band & local_key[:, :, None, :]  # (b, c, B, 3B)
        scores = scores.masked_fill(~allowed[:, None], _MASKED)  # (b, h, c, B, 3B)

        # Step 4: one softmax over [global keys, local band].
        if num_global:
            k_global, v_global = k[:, :, :num_global], v[:, :, :num_global]  # (b, h, g, d), (b, h, g, dv)
            global_scores = torch.einsum("bhcxd,bhgd->bhcxg", q_blocks, k_global)  # (b, h, c, B, g)
            global_key = real[:, None, None, None, :num_global]  # (b, 1, 1, 1, g)
            scores = torch.cat([global_scores.masked_fill(~global_key, _MASKED), scores], dim=-1)  # (b, h, c, B, g+3B)
        probs = F.dropout(scores.softmax(dim=-1), dropout)  # (b, h, c, B, g+3B)
        out = torch.einsum("bhcxy,bhcdy->bhcxd", probs[..., num_global:], v_windows)  # (b, h, c, B, dv)
        if num_global:
            out = out + torch.einsum("bhcxg,bhgd->bhcxd", probs[..., :num_global], v_global)  # (b, h, c, B, dv)
        out = out.reshape(batch, heads, num_blocks * block, v.shape[-1])[:, :, :n]  # (b, h, n, dv)

        # Step 5: the global queries attend to every key.
        if num_global:
            row_scores = q[:, :, :num_global] @ k.transpose(-1, -2)  # (b, h, g, n)
            row_scores = row_scores.masked_fill(~real[:, None, None, :], _MASKED)
            row_probs = F.dropout(row_scores.softmax(dim=-1), dropout)  # (b, h, g, n)
            out = torch.cat([row_probs @ v, out[:, :, num_global:]], dim=2)  # (b, h, n, dv)

        return out  # step 6, zeroing the padded query rows, is Attention.forward's (the crop happened above)


def dense_band(q, k, v, real, num_global: int, radius: int, dropout: float) -> torch.Tensor:
    """Steps 2-5 as one (n, n) masked softmax per head, for sequences too short for the blocks to save anything.

    ``q`` is already scaled; ``real`` (b, n) marks the real tokens. A query attends to the keys within
    ``radius`` of it and to the global keys, a global query to every key, and nobody to a padded key."""
    n = q.shape[-2]
    position = torch.arange(n, device=q.device)
    allowed = (position[:, None] - position[None, :]).abs() <= radius  # (n, n): the band
    allowed[:num_global] = True  # global queries see every key
    allowed[:, :num_global] = True  # every query sees the global keys
    allowed = allowed & real[:, None, None, :]  # (b, 1, n, n)
    scores = (q @ k.transpose(-1, -2)).masked_fill(~allowed, _MASKED)  # (b, h, n, n)
    return F.dropout(scores.softmax(dim=-1), dropout) @ v  # (b, h, n, dv)


register_preset(
    "longformer_lra",
    "longformer",
    "the YOSO paper's Table 3 row: a 512-token window, the first token global (the authors' first_token_view), "
    "tied global projections",
    window=512,
    num_global_tokens=1,
    dropout=0.1,
)
