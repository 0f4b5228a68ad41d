"""Exact softmax attention (Vaswani et al., 2017) on fused kernels.

softmax(Q K^T / sqrt(d)) V with dropout on the attention probabilities in training, as the
Nystromformer/YOSO LRA code runs it. Two paths compute it:

* ``torch.nn.functional.scaled_dot_product_attention``, which picks the fastest backend available
  (flash, memory-efficient, cuDNN, or the math fallback): GPUs, non-float32 inputs, and CPUs where
  YOSO's kernels are not built;
* on a CPU in float32, ``yoso_cuda.softmax_dropout_attention``, a fused kernel with the dropout
  inside: PyTorch's CPU flash kernel has no dropout, so in training SDPA would fall back to its
  math path, which materialises every head's n x n probabilities and mask (a ListOps training step
  of the paper's model, batch 32, n = 2048: 15 s on that path; results/README.md has the measurements).
  Its mask has dropout's distribution but its own random stream (:mod:`yoso_cuda.softmax`). In
  evaluation (no dropout) it also beats SDPA's flash kernel, since it skips the keys after a
  sequence's last real one (results/step_cpu_softmax_eval/).

A key padding mask is passed to SDPA only when some token is padded, because any mask moves SDPA
off its flash backend (under ``torch.compile``, which cannot branch on the mask's values, it is
always passed). A sequence whose every key is padded has no well-defined softmax; its keys are
unmasked for the computation (so no NaN reaches the forward or backward pass) and every query row
of such a sequence is padded too, so its output is zeroed like any other padded query.

``softmax_unpadded`` is the same attention without the padding's work: the masked path computes
all n x n scores of every padded sequence: ListOps' sequences are 586-1666 tokens at their 10th-90th
percentiles, padded to 2048, and for lengths spread evenly over that range two thirds of the scores
involve padding. It
runs SDPA on nested jagged tensors whose sequences are each row's own tokens, so no score involves
a padded position. Every shape stays static and nothing is copied to the host, so that a compiled
step can capture it, and every sequence holds at least one position, as SDPA's fused nested
kernels require (with an empty one it falls back to its math path, which reads the lengths on the
host): each row's tokens are moved in front of its padding (a stable sort of the mask, the identity
for right-padded rows), ``m = ceil(n / (PADDING_PIECE - 1))`` zero positions are appended, and the
padding with them is cut into ``m`` pieces of 1 to :data:`PADDING_PIECE` positions. Every row then
holds ``1 + m`` sequences, and the padding's own attention, computed only to keep the shapes
static and dropped after, costs at most 64 scores per padded position instead of n. A row with no
token keeps its first position as its sequence, as the masked path unmasks such a row's keys; its
output is zeroed like every padded query's. With dropout the probabilities are dropped as the
masked path drops them, from the nested kernel's random stream. On a CPU SDPA has no fused nested
kernel: eagerly it computes the nested sequences one by one (slow: this is a GPU path), and a
compiled step, which could not capture that, takes the masked path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from yoso_cuda import has_kernel, softmax_dropout_attention

from ._checks import check_dropout
from .registry import Attention, register

PADDING_PIECE = 64  # softmax_unpadded: the longest piece a row's padding is cut into, so its attention is small


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
        if q.device.type == "cpu" and q.dtype == torch.float32 and has_kernel(q.device):
            return softmax_dropout_attention(q, k, v, key_mask, dropout)
        if key_mask is not None and not torch.compiler.is_compiling() and bool(key_mask.all()):
            key_mask = None
        attn_mask = None if key_mask is None else key_mask[:, None, None, :]  # (b, 1, 1, n)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout)


@register("softmax_unpadded")
class UnpaddedSoftmaxAttention(SoftmaxAttention):
    """Softmax attention over each sequence's own tokens (nested jagged tensors): the same result as ``softmax``,
    without the n x n work on padding."""

    def attend(self, q, k, v, mask):
        if mask is None or (q.device.type == "cpu" and torch.compiler.is_compiling()):
            return super().attend(q, k, v, mask)
        b, h, n, _ = q.shape
        order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)  # (b, n): each row's tokens first, in order
        lengths = mask.sum(dim=1).clamp(min=1)  # (b,): a row with no token keeps its first position
        offsets = sequence_offsets(lengths, n)  # (b * (1 + m) + 1,)
        extra = (offsets.numel() - 1) // b - 1  # m: the zero positions appended to each row

        def nested(x):  # (b, h, n, e) -> nested (b * (1 + m), h, j, e)
            e = x.shape[-1]
            tokens_first = x.gather(2, order[:, None, :, None].expand(b, h, n, e))  # (b, h, n, e)
            padded = F.pad(tokens_first, (0, 0, 0, extra))  # (b, h, n + m, e)
            # A copy in token-major order: for one row, reshape would give a view whose tokens are not contiguous, which
            # SDPA's nested math path (a CPU's) refuses.
            packed = padded.transpose(1, 2).contiguous().view(b * (n + extra), h, e)  # (b * (n + m), h, e)
            return torch.nested.nested_tensor_from_jagged(packed, offsets, min_seqlen=1, max_seqlen=n).transpose(1, 2)

        dropout = self.config.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(nested(q), nested(k), nested(v), dropout_p=dropout)  # nested (b*(1+m), h, j, e)
        out = out.transpose(1, 2).values().reshape(b, n + extra, h, -1)[:, :n].transpose(1, 2)  # (b, h, n, e)
        back = order[:, None, :, None].expand_as(out)  # (b, h, n, e): where each position came from
        return torch.empty_like(out).scatter_(2, back, out)  # (b, h, n, e), in each row's order


def sequence_offsets(lengths: torch.Tensor, n: int) -> torch.Tensor:
    """The offsets of ``b`` rows of ``n + m`` positions laid end to end, ``m = ceil(n / (PADDING_PIECE - 1))``, each
    row cut into its ``lengths`` (>= 1) tokens and ``m`` pieces of its padding, each piece one appended position and
    up to ``PADDING_PIECE - 1`` of the row's: ``b * (1 + m) + 1`` offsets whatever the lengths, on their device."""
    starts = torch.arange(0, n, PADDING_PIECE - 1, device=lengths.device)  # (m,)
    pieces = 1 + ((n - lengths)[:, None] - starts).clamp(0, PADDING_PIECE - 1)  # (b, m)
    sizes = torch.cat([lengths[:, None], pieces], dim=1).flatten()  # (b * (1 + m),)
    return F.pad(sizes.cumsum(0), (1, 0))
