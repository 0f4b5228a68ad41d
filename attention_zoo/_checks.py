"""Input checks shared by the core attentions, so every attention rejects bad input the same way."""

from __future__ import annotations

import torch

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> None:
    """Raise a ValueError naming the problem when q, k, v or mask break the attention contract.

    q and k share one shape; v shares their (batch, heads, seq) and may have its own head dim (the
    output then has v's).
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            "q, k and v must have shape (batch, heads, seq, head_dim); got "
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if q.shape != k.shape or q.shape[:3] != v.shape[:3]:
        raise ValueError(
            "q and k must have the same shape and v the same (batch, heads, seq); got "
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if q.shape[2] < 1:
        raise ValueError("sequence length must be at least 1")
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if tensor.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} has dtype {tensor.dtype}; attentions take float32, float16 or bfloat16")
    if mask is not None:
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must be a bool tensor (True = real token), got dtype {mask.dtype}")
        if mask.shape != (q.shape[0], q.shape[2]):
            raise ValueError(f"mask must have shape (batch, seq) = {(q.shape[0], q.shape[2])}, got {tuple(mask.shape)}")


def check_dropout(dropout: float) -> None:
    """The rule of every attention's ``dropout`` (the probability of dropping an attention weight in training), which
    each config's ``__post_init__`` applies: a ValueError unless 0 <= dropout < 1 (at 1 every weight is dropped)."""
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")


def zero_padded_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``q, k, v`` with every padded position (``mask`` False) set to zero, by selection.

    Whatever a padded position holds, a NaN or an inf included, then never reaches the algorithm: neither a real
    row's output nor, through the backward, a real position's gradient (a product with a 0/1 mask would let it
    through, 0 * NaN being NaN), and a padded position gets no gradient. ``q, k, v``: (b, h, n, d), ``mask``: (b, n).
    """
    if mask is None:
        return q, k, v
    padded = ~mask[:, None, :, None]  # (b, 1, n, 1)
    return q.masked_fill(padded, 0.0), k.masked_fill(padded, 0.0), v.masked_fill(padded, 0.0)


def zero_masked_queries(out: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Set the rows of padded queries to exactly zero. ``out``: (b, h, n, d), ``mask``: (b, n)."""
    if mask is None:
        return out
    return out.masked_fill(~mask[:, None, :, None], 0.0)
