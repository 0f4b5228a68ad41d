"""Reformer's attention within chunks of LSH-sorted tokens, fused on the CPU: ``yoso::chunked_attention``.

Each chunk of queries attends to its own keys and to the previous chunk's, circularly over all chunks of a row; a
query's own token scores -1e5 and padded keys weigh 0. The op returns each query's output and log-sum-exp, which
attention_zoo's ``reformer`` combines over the hash rounds. It computes what ``reformer``'s dense path computes
(tests/yoso_cuda/test_chunked.py holds it to a float64 oracle and to that path), without the padding's work: padded
keys are left out, and padded queries, whose rows come out as zeros, are skipped, with the chunks that hold no real
token (``csrc/chunked_attention.cpp``).

As for the other compiled ops, the fake kernels and the gradient are registered here once the CPU library is loaded
(:func:`yoso_cuda.ops.kernels`), so ``torch.compile`` traces the op whole.
"""

from __future__ import annotations

import torch
from torch import Tensor


def register() -> None:
    """The fake kernels and the autograd of the op (needs the CPU library loaded)."""

    @torch.library.register_fake("yoso::chunked_attention")
    def _(queries, keys, values, position, real):
        return values.new_empty(values.shape), values.new_empty(real.shape)

    @torch.library.register_fake("yoso::chunked_attention_backward")
    def _(grad_out, grad_lse, queries, keys, values, position, real):
        return queries.new_empty(queries.shape), keys.new_empty(keys.shape), values.new_empty(values.shape)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def backward(ctx, grad_out, grad_lse):
        grads = torch.ops.yoso.chunked_attention_backward(grad_out, grad_lse, *ctx.saved_tensors)
        return (*grads, None, None)

    torch.library.register_autograd("yoso::chunked_attention", backward, setup_context=setup_context)


def chunked_attention(queries: Tensor, keys: Tensor, values: Tensor, position: Tensor, real: Tensor) -> tuple[Tensor, Tensor]:
    """Output (batch, chunks, chunk, c) and log-sum-exp (batch, chunks, chunk) of ``queries, keys`` (batch, chunks,
    chunk, d) and ``values`` (batch, chunks, chunk, c), given each token's ``position`` in its sequence (int64) and
    whether it is ``real`` (bool), all (batch, chunks, chunk); zero rows for padded queries. float32 on the CPU."""
    return torch.ops.yoso.chunked_attention(queries, keys, values, position, real)
