"""Dropout with the residual sum after it, fused on the CPU: ``yoso::dropout_add``.

``residual + dropout(y)``, where element i is kept when a counter-based hash of (seed, i) clears round(p 2^32)
(``csrc/dropout.cpp``): eight elements at a time on every thread, and the backward makes the mask again from the seed
instead of storing it. PyTorch's CPU dropout draws its mask with ``bernoulli_`` from one generator, which took 40% of
the paper's ListOps step of the ``none`` row (results/step_cpu_dropout/). The mask has dropout's distribution (each
element kept with probability 1 - p to within 2^-33, kept elements scaled by 1 / (1 - p)) but not its random stream:
the seed is drawn from torch's global generator, so a seeded run repeats. :func:`yoso_cuda.reference.element_keep`
computes the same mask (the tests' oracle).

As for the other compiled ops, the fake kernels and the gradient are registered here once the CPU library is loaded
(:func:`yoso_cuda.ops.kernels`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .softmax import SEED_RANGE


def register() -> None:
    """The fake kernels and the autograd of the op (needs the CPU library loaded)."""

    @torch.library.register_fake("yoso::dropout_add")
    def _(y, residual, p, seed):
        return y.new_empty(y.shape)

    @torch.library.register_fake("yoso::dropout_backward")
    def _(grad_out, p, seed):
        return grad_out.new_empty(grad_out.shape)

    def setup_context(ctx, inputs, output):
        _, residual, p, seed = inputs
        ctx.save_for_backward(seed)
        ctx.p, ctx.has_residual = p, residual is not None

    def backward(ctx, grad_out):
        (seed,) = ctx.saved_tensors
        grad_y = torch.ops.yoso.dropout_backward(grad_out, ctx.p, seed)
        return grad_y, grad_out if ctx.has_residual else None, None, None

    torch.library.register_autograd("yoso::dropout_add", backward, setup_context=setup_context)


def dropout_add(y: Tensor, residual: Tensor | None, p: float) -> Tensor:
    """``residual + dropout(y, p)`` (``dropout(y, p)`` without a residual), differentiable, float32 on the CPU; a fresh
    mask seed is drawn from torch's generator."""
    seed = torch.randint(SEED_RANGE, (1,), dtype=torch.int64)
    return torch.ops.yoso.dropout_add(y, residual, p, seed)
