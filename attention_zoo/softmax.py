"""Exact softmax attention (Vaswani et al., 2017) on PyTorch's fused kernels.

softmax(Q K^T / sqrt(d)) V, computed by ``torch.nn.functional.scaled_dot_product_attention``, which
picks the fastest backend available (flash, memory-efficient, cuDNN or the math fallback). A key
padding mask is passed only when some token is padded, because any mask moves SDPA off its flash
backend. A sequence whose every key is padded has no well-defined softmax; its keys are unmasked for
the computation (so no NaN reaches the forward or backward pass) and every query row of such a
sequence is padded too, so its output is zeroed like any other padded query.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F

from .registry import Attention, register


@dataclass
class SoftmaxConfig:
    dropout: float = 0.1  # attention-probability dropout of the Nystromformer/YOSO LRA setup (training only)

    def __post_init__(self) -> None:
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


@register("softmax")
class SoftmaxAttention(Attention):
    Config = SoftmaxConfig
    linear_memory = False  # the exact n x n attention; fused kernels only avoid storing it on some backends

    def attend(self, q, k, v, mask):
        dropout = self.config.dropout if self.training else 0.0
        if mask is None or bool(mask.all()):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout)
        has_real_key = mask.any(dim=1, keepdim=True)  # (b, 1)
        key_mask = mask | ~has_real_key  # (b, n)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask[:, None, None, :], dropout_p=dropout)
