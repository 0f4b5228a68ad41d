"""The depthwise convolution of the values along the sequence that Nystromformer and YOSO-C add to their output."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from yoso_cuda import has_kernel, sequence_conv


class SequenceConv(nn.Conv2d):
    """One kernel of ``width`` taps per head along the sequence, shared by the head's channels, zero
    padded, no bias: the authors' ``Conv2d(heads, heads, (width, 1), groups=heads)`` of both papers.

    Input and output ``(batch, heads, seq, head_dim)``. The weight is cast to the input's dtype, so
    an attention that runs in float32 inside a bfloat16 model convolves in float32. The width must
    be odd (:meth:`check_width`), so that the kernel is centred on each token.
    """

    @staticmethod
    def check_width(width: int | None, field: str = "width") -> None:
        """The width rule, which an attention's config applies to its own field (named in the error):
        a positive odd int, or None for no convolution."""
        if width is not None and (width < 1 or width % 2 == 0):
            raise ValueError(
                f"{field} must be a positive odd int (centred on each token) or None for no convolution, got {width}"
            )

    def __init__(self, num_heads: int, width: int) -> None:
        self.check_width(width)
        super().__init__(num_heads, num_heads, (width, 1), padding=(width // 2, 0), groups=num_heads, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu":
            return F.conv2d(x, self.weight.to(x.dtype), padding=self.padding, groups=self.groups)
        if x.dtype == torch.float32 and has_kernel(x.device):
            # The compiled op (yoso_cuda.conv): at the ListOps shape (32, 2, 2048, 32) with 33 taps, forward + backward
            # 21 ms against the channels-last convolution's 138 ms below (2-core AMD EPYC VM, torch 2.13.0+cpu).
            return sequence_conv(x, self.weight.to(x.dtype).view(self.weight.shape[0], -1))  # weight (h, width)
        # On a CPU, oneDNN's depthwise convolution of the (batch, heads, seq, head_dim) layout, heads as channels, is
        # slow; in channels-last (heads innermost) it is 3-8x faster. Measured on the 2-core AMD EPYC VM, torch
        # 2.13.0+cpu, the ListOps shape (32, 2, 2048, 32), 33 taps, forward + backward: 21-52 ms + 41-83 ms against
        # 113-193 ms + 232-396 ms (shared VM; same results, weight gradient within 2e-5 relative). The output is made
        # contiguous again, so what follows sees the usual layout.
        x = x.contiguous(memory_format=torch.channels_last)
        out = F.conv2d(x, self.weight.to(x.dtype), padding=self.padding, groups=self.groups)
        return out.contiguous()
