"""Multi-head attention: the Q/K/V/output projections around a registered core attention."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .registry import build
from .rotary import apply_rotary, rotary_angles


class MultiHeadAttention(nn.Module):
    """Project ``x`` to per-head queries, keys and values, run the core attention, project back.

    Args:
        dim: model width of ``x``.
        num_heads: number of heads.
        attention: registered name of the core attention or of a preset (``attention_zoo.available()``,
            ``attention_zoo.presets()``).
        seq_len: the longest sequence the module will see (some attentions size parameters by it).
        head_dim: width of one head; ``dim // num_heads`` when omitted.
        attention_in_float32: run every core attention in float32, also under autocast, as the YOSO and
            Nystromformer LRA code does (the projections still run in the autocast dtype); when
            False, only attentions whose arithmetic needs it do (``Attention.in_float32``).
        rotary: rotate queries and keys by their positions (:mod:`attention_zoo.rotary`) before the core
            attention, so that any attention sees relative positions.
        **hparams: the core attention's own hyperparameters.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        attention: str = "softmax",
        *,
        seq_len: int,
        head_dim: int | None = None,
        attention_in_float32: bool = True,
        rotary: bool = False,
        **hparams: Any,
    ) -> None:
        super().__init__()
        if head_dim is None:
            if dim % num_heads:
                raise ValueError(f"dim={dim} is not divisible by num_heads={num_heads}; pass head_dim explicitly")
            head_dim = dim // num_heads
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.rotary = rotary
        if rotary:
            rotary_angles(1, head_dim)  # an odd head_dim fails here, at construction
        self.attention = build(attention, seq_len=seq_len, num_heads=num_heads, head_dim=head_dim, **hparams)
        self.attention.in_float32 = self.attention.in_float32 or attention_in_float32
        inner = num_heads * head_dim
        self.query = nn.Linear(dim, inner)
        # Reformer-style attentions share one projection for queries and keys.
        self.key = None if self.attention.tie_query_key else nn.Linear(dim, inner)
        self.value = nn.Linear(dim, inner)
        self.output = nn.Linear(inner, dim)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        return x.view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)  # (b, h, n, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x``: (batch, seq, dim); ``mask``: (batch, seq) bool, True = real token, or None."""
        if x.dim() != 3:
            raise ValueError(f"MultiHeadAttention expects x of shape (batch, seq, dim), got {tuple(x.shape)}")
        q = self.split_heads(self.query(x))  # (b, h, n, d)
        k = q if self.key is None else self.split_heads(self.key(x))  # (b, h, n, d)
        v = self.split_heads(self.value(x))  # (b, h, n, d)
        if self.rotary:
            angles = rotary_angles(x.shape[1], self.head_dim, device=x.device)  # (n, d/2)
            q = apply_rotary(q, angles)
            k = q if self.key is None else apply_rotary(k, angles)
        out = self.attention(q, k, v, mask)  # (b, h, n, d), in the dtype of v
        batch, _, seq, _ = out.shape
        out = out.transpose(1, 2).reshape(batch, seq, self.num_heads * self.head_dim)  # (b, n, h*d)
        return self.output(out)
