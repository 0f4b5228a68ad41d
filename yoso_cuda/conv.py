"""The depthwise convolution of the values along the sequence that YOSO-C and Nystromformer add, compiled for the
CPU: ``yoso::sequence_conv``.

``out[b, h, i] = sum_t weight[h, t] x[b, h, i + t - width // 2]`` (zero outside the sequence): what
``F.conv2d(x, weight[:, None, :, None], padding=(width // 2, 0), groups=heads)`` computes (the tests' oracle), with
each tap one pass over a block of contiguous rows (``csrc/sequence_conv.cpp``) instead of oneDNN's depthwise
convolution, which is slow in this layout on a CPU.

As for the other compiled ops, the fake kernels and the gradient are registered here once the CPU library is loaded
(:func:`yoso_cuda.ops.kernels`), so ``torch.compile`` traces the op whole.
"""

from __future__ import annotations

import torch
from torch import Tensor


def register() -> None:
    """The fake kernels and the autograd of the op (needs the CPU library loaded)."""

    @torch.library.register_fake("yoso::sequence_conv")
    def _(x, weight):
        return x.new_empty(x.shape)

    @torch.library.register_fake("yoso::sequence_conv_backward")
    def _(grad_out, x, weight):
        return x.new_empty(x.shape), weight.new_empty(weight.shape)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        return tuple(torch.ops.yoso.sequence_conv_backward(grad_out, x, weight))

    torch.library.register_autograd("yoso::sequence_conv", backward, setup_context=setup_context)


def sequence_conv(x: Tensor, weight: Tensor) -> Tensor:
    """``x`` (batch, heads, n, c) convolved along n by ``weight`` (heads, width), width odd, zero padded; float32 on
    the CPU, differentiable in both."""
    return torch.ops.yoso.sequence_conv(x, weight)
