"""YOSO-E's attention, fused on the CPU: ``yoso::expectation_attention``.

``out = W V`` with ``W_ij = real_i real_j (1 - arccos(q_i . k_j) / pi)^tau`` for unit queries and keys, and the
gradient of the official yoso_v1 YOSO-E, whose derivative of the collision probability is YOSO's lower bound
``(tau / 2) W_ij``: ``S = (G V^T) * W * tau / 2``, ``dQ = S K``, ``dK = S^T Q``, ``dV = W^T G``. It is
attention_zoo's ``yoso_e`` (``backward: lower_bound``) computed block by block of queries (``csrc/expectation.cpp``)
instead of through the dense (batch x heads, n, n) weights, and without the padding's work: padded queries get zero
rows and padded keys weigh 0, so a right-padded sequence costs its real length squared.

As for the other compiled ops, the fake kernels and the gradient are registered here once the CPU library is loaded
(:func:`yoso_cuda.ops.kernels`), so ``torch.compile`` traces the op whole.
"""

from __future__ import annotations

import torch
from torch import Tensor


def register() -> None:
    """The fake kernels and the autograd of the op (needs the CPU library loaded)."""

    @torch.library.register_fake("yoso::expectation_attention")
    def _(queries, keys, values, real, hash_bits):
        return values.new_empty(values.shape)

    @torch.library.register_fake("yoso::expectation_attention_backward")
    def _(grad_out, queries, keys, values, real, hash_bits):
        return queries.new_empty(queries.shape), keys.new_empty(keys.shape), values.new_empty(values.shape)

    def setup_context(ctx, inputs, output):
        queries, keys, values, real, hash_bits = inputs
        ctx.save_for_backward(queries, keys, values, real)
        ctx.hash_bits = hash_bits

    def backward(ctx, grad_out):
        queries, keys, values, real = ctx.saved_tensors
        grads = torch.ops.yoso.expectation_attention_backward(grad_out, queries, keys, values, real, ctx.hash_bits)
        return (*grads, None, None)

    torch.library.register_autograd("yoso::expectation_attention", backward, setup_context=setup_context)


def expectation_attention(queries: Tensor, keys: Tensor, values: Tensor, real: Tensor, hash_bits: int) -> Tensor:
    """YOSO-E's ``W V`` (batch, n, c) of unit ``queries, keys`` (batch, n, d), ``values`` (batch, n, c) and ``real``
    (batch, n) bool (True = a real token), with the (tau/2) W surrogate gradient; float32 on the CPU."""
    return torch.ops.yoso.expectation_attention(queries, keys, values, real, hash_bits)
