"""Exact softmax attention (Vaswani et al., 2017) on fused kernels.

softmax(Q K^T / sqrt(d)) V with dropout on the attention probabilities in training, as the
Nystromformer/YOSO LRA code runs it. Two paths compute it:

* ``torch.nn.functional.scaled_dot_product_attention``, which picks the fastest backend available
  (flash, memory-efficient, cuDNN, or the math fallback): evaluation, GPUs, and non-float32 inputs;
* on a CPU in training with dropout, ``yoso_cuda.softmax_dropout_attention``, a fused kernel with
  the dropout inside: PyTorch's CPU flash kernel has no dropout, so SDPA would fall back to its
  math path, which materialises every head's n x n probabilities and mask (a ListOps training step
  of the paper's model, batch 32, n = 2048: 15 s on that path; results/README.md has the measurements).
  Its mask has dropout's distribution but its own random stream (:mod:`yoso_cuda.softmax`).

A key padding mask is passed to SDPA only when some token is padded, because any mask moves SDPA
off its flash backend (under ``torch.compile``, which cannot branch on the mask's values, it is
always passed). A sequence whose every key is padded has no well-defined softmax; its keys are
unmasked for the computation (so no NaN reaches the forward or backward pass) and every query row
of such a sequence is padded too, so its output is zeroed like any other padded query.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from yoso_cuda import has_kernel, softmax_dropout_attention

from ._checks import check_dropout
from .registry import Attention, register


@dataclass
class SoftmaxConfig:
    dropout: float = 0.1  # attention-probability dropout of the Nystromformer/YOSO LRA setup (training only)

    def __post_init__(self) -> None:
        check_dropout(self.dropout)


@register("softmax")
class SoftmaxAttention(Attention):
    Config = SoftmaxConfig
    linear_memory = False  # the exact n x n attention; fused kernels only avoid storing it on some backends

    def attend(self, q, k, v, mask):
        dropout = self.config.dropout if self.training else 0.0
        key_mask = None if mask is None else mask | ~mask.any(dim=1, keepdim=True)  # (b, n)
        if dropout > 0 and q.device.type == "cpu" and q.dtype == torch.float32 and has_kernel(q.device):
            return softmax_dropout_attention(q, k, v, key_mask, dropout)
        if key_mask is not None and not torch.compiler.is_compiling() and bool(key_mask.all()):
            key_mask = None
        attn_mask = None if key_mask is None else key_mask[:, None, None, :]  # (b, 1, 1, n)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout)
