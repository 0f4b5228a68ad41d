"""Rotary position embedding (RoPE; Su et al., "RoFormer", 2021) for queries and keys.

Each head's ``d`` features are ``d / 2`` pairs ``(x_i, x_{i + d/2})`` (the half-split layout of
GPT-NeoX and most later code); the pair at position ``m`` is rotated by the angle ``m * theta_i``
with ``theta_i = base ** (-2 i / d)``. A query at position ``m`` and a key at position ``n`` then
have the dot product ``<R_m q, R_n k> = <q, R_{n - m} k>``: it depends on their offset only, which
is what makes the positions relative. Applied before the core attention, it works with every
attention that reads queries and keys, whatever it does with them.
"""

from __future__ import annotations

import torch


def rotary_angles(seq_len: int, head_dim: int, base: float = 10000.0, device: torch.device | None = None) -> torch.Tensor:
    """``(seq_len, head_dim / 2)`` float32 angles ``m * theta_i``."""
    if head_dim % 2:
        raise ValueError(f"rotary positions rotate pairs of features: head_dim must be even, got {head_dim}")
    theta = base ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)  # (d/2,)
    positions = torch.arange(seq_len, device=device, dtype=torch.float32)
    return positions[:, None] * theta[None, :]  # (n, d/2)


def apply_rotary(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``(..., seq, head_dim)`` by ``angles`` ``(seq, head_dim / 2)``; computed in float32, returned in x's dtype."""
    half = x.shape[-1] // 2
    first, second = x.float()[..., :half], x.float()[..., half:]  # (..., n, d/2) each
    cos, sin = angles.cos(), angles.sin()
    rotated = torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)  # (..., n, d)
    return rotated.to(x.dtype)
