"""YOSO's differentiable LSH attention: ``yoso::lsh_attention``, a torch custom op with its autograd.

The forward is YOSO-m's cumulation ``Y = (1/m) sum_h B_h V`` with ``(B_h)_ij = [h(q_i) = h(k_j)]``
over real keys, from hash codes computed beforehand (:func:`yoso_cuda.hash_queries_and_keys`).
The backward estimates the gradients from the same codes (Zeng et al., ICML 2021):

* ``grad V = (1/m) sum_h B_h^T G``, the same cumulation with queries and keys swapped;
* ``backward="lower_bound"`` (YOSO): the collision probability's derivative replaced by its lower
  bound ``(tau/2) E_ij``, so that ``grad q_i = (tau/2) (1/m) sum_h sum_j [collide] (g_i . v_j) k_j``
  and ``grad k_j`` likewise share the pair weights ``g_i . v_j``: one weighted cumulation computes both;
* ``backward="exact"`` (*YOSO): ``grad q_i = sum_{j in U(i)} (g_i . v_j) f'(0.99 q_i . k_j) k_j``
  over the keys U(i) colliding with q_i in at least one hash, and ``grad k_j`` symmetrically.

As in pytorch/extension-cpp and flash-attention's interface, forward and backward are both custom
ops (``yoso::lsh_attention``, ``yoso::lsh_attention_backward``) with fake kernels, and the backward
is registered with ``register_autograd``: the op is differentiable on its own, ``torch.compile``
traces it whole (backward included) without looking inside, and ``torch.library.opcheck`` checks
the registration. ``backend`` picks the compiled kernels or the reference for every op inside
(:func:`yoso_cuda.ops.use_compiled`).

Outputs and the values' gradient accumulate in float32; each gradient has its input's dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import ops

BACKWARD_ESTIMATORS = ("lower_bound", "exact")


def _check_choices(backward: str, backend: str) -> None:
    if backward not in BACKWARD_ESTIMATORS:
        raise ValueError(f"backward must be one of {', '.join(map(repr, BACKWARD_ESTIMATORS))}, got {backward!r}")
    ops.check_backend(backend)


@torch.library.custom_op("yoso::lsh_attention", mutates_args=())
def lsh_attention(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    mask: Tensor,
    query_codes: Tensor,
    key_codes: Tensor,
    hash_bits: int,
    backward: str = "lower_bound",
    backend: str = "auto",
) -> Tensor:
    """``(1/m) sum_h B_h V``: unit queries and keys ``(B, n, d)``, values ``(B, n, c)``, mask ``(B, n)`` bool
    (padded tokens are neither keys nor queries), codes ``(B, n, m)`` int32 -> ``(B, n, c)`` float32."""
    _check_choices(backward, backend)
    return ops.lsh_cumulation(query_codes, mask, key_codes, mask, values, hash_bits, backend)


@lsh_attention.register_fake
def _(queries, keys, values, mask, query_codes, key_codes, hash_bits, backward="lower_bound", backend="auto"):
    _check_choices(backward, backend)
    return values.new_empty(query_codes.shape[0], query_codes.shape[1], values.shape[-1], dtype=torch.float32)


@torch.library.custom_op("yoso::lsh_attention_backward", mutates_args=())
def lsh_attention_backward(
    grad: Tensor,
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    mask: Tensor,
    query_codes: Tensor,
    key_codes: Tensor,
    hash_bits: int,
    backward: str,
    backend: str,
) -> tuple[Tensor, Tensor, Tensor]:
    """YOSO's gradient estimates ``(grad queries, grad keys, grad values)`` from the forward's codes."""
    _check_choices(backward, backend)
    tau = hash_bits
    if backward == "lower_bound":
        # grad q_i and grad k_j share the pair weights (g_i . v_j), grad V the buckets: one op, one pass.
        grad_q, grad_k, grad_v = ops.lsh_lower_bound_gradients(
            query_codes, mask, queries, grad, key_codes, mask, keys, values, tau, backend
        )
    else:
        grad_v = ops.lsh_cumulation(key_codes, mask, query_codes, mask, grad, tau, backend)
        grad_q = ops.lsh_collided_gradient(query_codes, mask, queries, grad, key_codes, mask, keys, values, tau, backend)
        grad_k = ops.lsh_collided_gradient(key_codes, mask, keys, values, query_codes, mask, queries, grad, tau, backend)
    return grad_q.to(queries.dtype), grad_k.to(keys.dtype), grad_v.to(values.dtype)


@lsh_attention_backward.register_fake
def _(grad, queries, keys, values, mask, query_codes, key_codes, hash_bits, backward, backend):
    return queries.new_empty(queries.shape), keys.new_empty(keys.shape), values.new_empty(values.shape)


def _setup_context(ctx, inputs, output) -> None:
    queries, keys, values, mask, query_codes, key_codes, hash_bits, backward, backend = inputs
    ctx.save_for_backward(queries, keys, values, mask, query_codes, key_codes)
    ctx.hash_bits, ctx.backward, ctx.backend = hash_bits, backward, backend


def _backward(ctx, grad):
    queries, keys, values, mask, query_codes, key_codes = ctx.saved_tensors
    grads = lsh_attention_backward(
        grad, queries, keys, values, mask, query_codes, key_codes, ctx.hash_bits, ctx.backward, ctx.backend
    )
    grad_q, grad_k, grad_v = (g if needed else None for g, needed in zip(grads, ctx.needs_input_grad[:3]))
    return grad_q, grad_k, grad_v, None, None, None, None, None, None


lsh_attention.register_autograd(_backward, setup_context=_setup_context)
