"""Exact softmax attention with dropout on its probabilities, fused on the CPU: ``yoso::softmax_dropout_attention``.

It computes the softmax baseline's training step, and with a ``radius`` Longformer's sliding window with global
tokens (a query sees the keys within the radius, and the first ``num_global`` positions see and are seen by every
query), scoring only the keys a block of queries can see.

PyTorch's CPU flash-attention kernel has no dropout, so ``scaled_dot_product_attention`` with
``dropout_p > 0`` runs its math path on a CPU, which materialises the n x n scores, probabilities and
dropout mask of every head. The compiled op (``csrc/softmax_dropout.cpp``) computes the same function
block by block of queries with the (n x block) scores of one head at a time, and draws its dropout
mask from a counter-based hash of (seed, head row, query, key), so the backward regenerates the mask
instead of storing it: memory linear in n for a fixed block, and the step of the paper's softmax
ListOps model drops from the math path's 15 s (results/step_cpu.csv). It skips the padding's work: the keys after a
sequence's last real one, and in the backward the queries after the last with a nonzero output gradient (a model's
padded positions), so a right-padded ListOps batch's step takes 1.7 s, not 2.9 (results/step_cpu_padding/); and the
queries after the last real key, whose rows it leaves zero (results/step_cpu_padded_queries/).

The mask has the distribution of ``torch.nn.functional.dropout``'s (each pair kept with probability
1 - p, to within 2^-33, kept probabilities scaled by 1 / (1 - p)) but not its random stream: the seed is
drawn from torch's global generator, so a seeded run is reproducible, but it does not drop the same
pairs as SDPA's math path would. :func:`yoso_cuda.reference.softmax_dropout_attention` computes the
same mask and function densely (the tests' oracle).

As for YOSO's ops, the fake kernels and the gradient are registered here, beside the op, once the CPU
library is loaded (:func:`yoso_cuda.ops.kernels`), so ``torch.compile`` traces the op whole.
"""

from __future__ import annotations

import torch
from torch import Tensor

SEED_RANGE = 2**62  # the seed is drawn from [0, 2^62) by torch's global generator


def register() -> None:
    """The fake kernels and the autograd of the two compiled ops (needs the CPU library loaded)."""

    @torch.library.register_fake("yoso::softmax_dropout_attention")
    def _(q, k, v, key_mask, dropout, seed, radius=-1, num_global=0):
        return v.new_empty(v.shape), q.new_empty(q.shape[:3])

    @torch.library.register_fake("yoso::softmax_dropout_attention_backward")
    def _(grad_out, q, k, v, key_mask, out, lse, dropout, seed, radius=-1, num_global=0):
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)

    def setup_context(ctx, inputs, output):
        q, k, v, key_mask, dropout, seed, radius, num_global = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, key_mask, out, lse, seed)
        ctx.dropout, ctx.radius, ctx.num_global = dropout, radius, num_global

    def backward(ctx, grad_out, grad_lse):
        q, k, v, key_mask, out, lse, seed = ctx.saved_tensors
        grads = torch.ops.yoso.softmax_dropout_attention_backward(
            grad_out, q, k, v, key_mask, out, lse, ctx.dropout, seed, ctx.radius, ctx.num_global
        )
        return (*grads, None, None, None, None, None)

    torch.library.register_autograd("yoso::softmax_dropout_attention", backward, setup_context=setup_context)


def softmax_dropout_attention(
    q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, dropout: float, radius: int = -1, num_global: int = 0
) -> Tensor:
    """``(softmax(q k^T / sqrt(d) + mask) * keep / (1 - p)) v``, differentiable, float32 on the CPU.

    ``q, k`` (batch, heads, n, d), ``v`` (batch, heads, n, c), ``key_mask`` (batch, n) bool (True = real
    key) or None, which marks the positions of a self-attention: the queries after a sequence's last real key are
    padding, and get zero rows. ``radius`` >= 0: query i sees key j only where ``|i - j| <= radius`` or either is
    among the first ``num_global`` positions (-1: every key). A query with no key to see gets a zero row (softmax's
    caller unmasks a sequence without a real key first). With ``dropout > 0`` a fresh mask seed is drawn from torch's
    generator; without, nothing is drawn, so an evaluation leaves training's random stream as it was."""
    seed = torch.randint(SEED_RANGE, (1,), dtype=torch.int64) if dropout > 0 else torch.zeros(1, dtype=torch.int64)
    return torch.ops.yoso.softmax_dropout_attention(q, k, v, key_mask, dropout, seed, radius, num_global)[0]
