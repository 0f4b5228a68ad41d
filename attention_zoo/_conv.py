"""The depthwise convolution of the values along the sequence that Nystromformer and YOSO-C add to their output."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SequenceConv(nn.Conv2d):
    """One kernel of ``width`` taps per head along the sequence, shared by the head's channels, zero
    padded, no bias: the authors' ``Conv2d(heads, heads, (width, 1), groups=heads)`` of both papers.

    Input and output ``(batch, heads, seq, head_dim)``. The weight is cast to the input's dtype, so
    an attention that runs in float32 inside a bfloat16 model convolves in float32.
    """

    def __init__(self, num_heads: int, width: int) -> None:
        super().__init__(num_heads, num_heads, (width, 1), padding=(width // 2, 0), groups=num_heads, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight.to(x.dtype), padding=self.padding, groups=self.groups)
