"""YOSO's raw ops and its hashing, on the compiled kernels or the pure-PyTorch reference, by choice.

``torch.ops.yoso.*`` are the compiled ops (schemas in ``csrc/yoso.cpp``); their fake (meta)
kernels, registered here, let them run under ``torch.compile``, and so do their gradients: the
cumulations are linear in the values and bilinear in the weights, so each one's gradient is again
a cumulation (exact, not an estimate). ``lsh_collided_gradient`` and ``lsh_lower_bound_gradients``
are themselves gradient estimates and their derivatives are errors; ``hash_codes`` returns
integers. The functions below take the same arguments as :mod:`yoso_cuda.reference` plus
``backend``:

* ``"auto"``: the compiled kernel of the tensors' device if it is built, else the reference;
* ``"compiled"``: the compiled kernel, and an error saying why if it is not built;
* ``"reference"``: the pure-PyTorch reference (the tests' oracle), whatever is built.

The kernels are built on first use (or by ``python -m yoso_cuda``); if a library this machine
should have fails to build, one warning says why and how to get it (``YOSO_KERNELS=require`` makes
that an error, see :mod:`yoso_cuda.build`).
"""

from __future__ import annotations

import functools
import warnings
from typing import Literal, get_args

import torch

from . import reference
from .build import BuildReport, build

Backend = Literal["auto", "compiled", "reference"]
BACKENDS = get_args(Backend)
HashProjection = Literal["hadamard", "gaussian"]


@functools.cache
def kernels() -> BuildReport:
    """Build or load the kernel libraries once per process."""
    report = build()  # raises under YOSO_KERNELS=require when a wanted library is missing
    if report.cpu.loaded:
        from . import chunked, conv, dropout, expectation, softmax  # import ops: registered once the library is loaded

        _register_fake_kernels()
        _register_autograd()
        softmax.register()
        conv.register()
        dropout.register()
        expectation.register()
        chunked.register()
    if report.missing:
        reasons = "; ".join(f"{library.device}: {library.reason}" for library in report.missing)
        warnings.warn(
            f"YOSO's compiled kernels are unavailable ({reasons}); YOSO runs on the pure-PyTorch reference there, "
            "which is slower. To build them, install a C++ compiler (and for GPUs a CUDA toolkit matching torch's "
            "CUDA, with CUDA_HOME), then run `python -m yoso_cuda` to see what was built and why not.",
            stacklevel=3,
        )
    for library in report.unsafe:
        warnings.warn(f"YOSO's {library.device} kernels are unsafe: {library.unsafe}", stacklevel=3)
    return report


def has_kernel(device: torch.device) -> bool:
    report = kernels()
    return report.cuda.loaded if device.type == "cuda" else device.type == "cpu" and report.cpu.loaded


# Fixed once the kernels are built: torch.compile takes the answer as a constant, with no graph break. This is what
# torch.compiler.assume_constant_result sets, which would import Dynamo (1.4 s) into every command that imports
# yoso_cuda, training or not; tests/lra/test_compile_rows.py finds a graph break if it stops working.
has_kernel._dynamo_marked_constant = True


def cuda_path(device: torch.device) -> bool:
    """Whether tensors on ``device`` take the CUDA path: randomness drawn on the device and nothing
    that synchronises the host. :meth:`yoso_cuda.emulator.Emulator.cuda_path` points it, with
    :func:`compiled_ops` and :func:`has_kernel`, at CPU tensors, so CI runs this path on the emulated
    CUDA kernels."""
    return device.type == "cuda"


def compiled_ops(device: torch.device):
    """The compiled ops' namespace (``torch.ops.yoso``; the emulator's under ``Emulator.cuda_path``)."""
    return torch.ops.yoso


def check_backend(backend: str) -> None:
    """Raise the one error for a ``backend`` that is not one of :data:`BACKENDS`."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")


def use_compiled(backend: str, device: torch.device) -> bool:
    """Whether ``backend`` runs the compiled kernel on ``device`` (see the module docstring)."""
    check_backend(backend)
    if backend == "reference":
        return False
    if backend == "auto":
        return has_kernel(device)
    if not has_kernel(device):  # backend == "compiled"
        library = kernels().cuda if device.type == "cuda" else kernels().cpu
        why = library.reason if device.type in ("cpu", "cuda") else "there are kernels for cpu and cuda only"
        raise RuntimeError(
            f"backend='compiled', but YOSO's {device.type} kernels are not built ({why}); run `python -m yoso_cuda` "
            "to see the build, or choose backend='auto' or 'reference'"
        )
    return True


def _register_fake_kernels() -> None:
    def rows_out(codes: torch.Tensor, channels: int, like: torch.Tensor) -> torch.Tensor:
        return like.new_empty(codes.shape[0], codes.shape[1], channels, dtype=torch.float32)

    @torch.library.register_fake("yoso::hash_codes")
    def _(vectors, signs, num_hashes, hash_bits):
        return vectors.new_empty(vectors.shape[0], vectors.shape[1], num_hashes, dtype=torch.int32)

    @torch.library.register_fake("yoso::lsh_cumulation")
    def _(query_codes, query_mask, key_codes, key_mask, values, hash_bits):
        return rows_out(query_codes, values.shape[-1], values)

    @torch.library.register_fake("yoso::lsh_weighted_cumulation")
    def _(query_codes, query_mask, query_weights, key_codes, key_mask, key_weights, values, hash_bits):
        return rows_out(query_codes, values.shape[-1], values)

    @torch.library.register_fake("yoso::lsh_weighted_cumulation_both")
    def _(query_codes, query_mask, query_weights, query_values, key_codes, key_mask, key_weights, key_values, hash_bits):
        return rows_out(query_codes, key_values.shape[-1], key_values), rows_out(key_codes, query_values.shape[-1], query_values)

    @torch.library.register_fake("yoso::lsh_collided_gradient")
    def _(query_codes, query_mask, query_vectors, query_weights, key_codes, key_mask, key_vectors, key_weights, hash_bits):
        return rows_out(query_codes, query_vectors.shape[-1], query_vectors)

    @torch.library.register_fake("yoso::lsh_lower_bound_gradients")
    def _(query_codes, query_mask, query_vectors, query_weights, key_codes, key_mask, key_vectors, key_weights, hash_bits):
        return (
            rows_out(query_codes, query_vectors.shape[-1], query_vectors),
            rows_out(key_codes, key_vectors.shape[-1], key_vectors),
            rows_out(key_codes, query_weights.shape[-1], query_weights),
        )


def _register_autograd() -> None:
    """Exact gradients of the raw cumulations, each a cumulation again (derivations inline)."""
    yoso = torch.ops.yoso

    def save_codes(ctx, inputs, output) -> None:
        ctx.save_for_backward(*inputs[:-1])
        ctx.hash_bits = inputs[-1]

    def cumulation_backward(ctx, grad):
        # out_i = (1/m) sum_h sum_j [collide] v_j  =>  grad v_j = (1/m) sum_h sum_i [collide] g_i.
        query_codes, query_mask, key_codes, key_mask, values = ctx.saved_tensors
        grad_values = yoso.lsh_cumulation(key_codes, key_mask, query_codes, query_mask, grad, ctx.hash_bits)
        return None, None, None, None, grad_values.to(values.dtype), None

    def weighted_backward(ctx, grad):
        # out_i = (1/m) sum_h sum_j [collide] (qw_i . kw_j) v_j, so with g_i = d loss / d out_i:
        # grad qw_i = (1/m) sum sum [collide] (g_i . v_j) kw_j,   grad kw_j = ... (v_j . g_i) qw_i,
        # grad v_j = (1/m) sum sum [collide] (kw_j . qw_i) g_i.
        query_codes, query_mask, query_weights, key_codes, key_mask, key_weights, values = ctx.saved_tensors
        tau, queries, keys = ctx.hash_bits, (query_codes, query_mask), (key_codes, key_mask)
        grad_qw = yoso.lsh_weighted_cumulation(*queries, grad, *keys, values, key_weights, tau)
        grad_kw = yoso.lsh_weighted_cumulation(*keys, values, *queries, grad, query_weights, tau)
        grad_v = yoso.lsh_weighted_cumulation(*keys, key_weights, *queries, query_weights, grad, tau)
        return (
            None,
            None,
            grad_qw.to(query_weights.dtype),
            None,
            None,
            grad_kw.to(key_weights.dtype),
            grad_v.to(values.dtype),
            None,
        )

    def weighted_both_backward(ctx, grad_query_out, grad_key_out):
        # query_out_i = sum_j s_ij kv_j and key_out_j = sum_i s_ij qv_i with s_ij = (1/m) sum_h [collide] qw_i . kw_j.
        # grad qv_i = sum_j s_ij gk_j and grad kv_j = sum_i s_ij gq_i: one pass of this op with the
        # output gradients as values; grad qw_i = sum_j [collide] (gq_i . kv_j + qv_i . gk_j) kw_j and
        # grad kw_j symmetrically: one pass with the concatenations [gq, qv] . [kv, gk] as weights.
        query_codes, query_mask, qw, qv, key_codes, key_mask, kw, kv = ctx.saved_tensors
        tau, queries, keys = ctx.hash_bits, (query_codes, query_mask), (key_codes, key_mask)
        grad_qv, grad_kv = yoso.lsh_weighted_cumulation_both(*queries, qw, grad_query_out, *keys, kw, grad_key_out, tau)
        pair_qw = torch.cat([grad_query_out.float(), qv.float()], dim=-1)  # (B, nq, c_kv + c_qv)
        pair_kw = torch.cat([kv.float(), grad_key_out.float()], dim=-1)  # (B, nk, c_kv + c_qv)
        grad_qw, grad_kw = yoso.lsh_weighted_cumulation_both(*queries, pair_qw, qw, *keys, pair_kw, kw, tau)
        return (
            None,
            None,
            grad_qw.to(qw.dtype),
            grad_qv.to(qv.dtype),
            None,
            None,
            grad_kw.to(kw.dtype),
            grad_kv.to(kv.dtype),
            None,
        )

    def estimate_backward(name: str, estimator: str):
        def backward(ctx, *grads):
            raise NotImplementedError(
                f"yoso::{name} is {estimator}'s gradient estimate; its own derivative (a double backward "
                f"through {estimator}'s estimator) is not implemented"
            )

        return backward

    for name, backward in (
        ("lsh_cumulation", cumulation_backward),
        ("lsh_weighted_cumulation", weighted_backward),
        ("lsh_weighted_cumulation_both", weighted_both_backward),
        ("lsh_collided_gradient", estimate_backward("lsh_collided_gradient", "*YOSO")),
        ("lsh_lower_bound_gradients", estimate_backward("lsh_lower_bound_gradients", "YOSO")),
    ):
        torch.library.register_autograd(f"yoso::{name}", backward, setup_context=save_codes)


def dispatch(op: str, device: torch.device, args: tuple, backend: Backend):
    """``yoso::<op>`` on ``args``: the compiled kernel of ``device`` or the reference, as ``backend`` says.
    The reference checks the arguments as the kernels do (:mod:`yoso_cuda.argument_checks`)."""
    if use_compiled(backend, device):
        return getattr(compiled_ops(device), op)(*args)
    return getattr(reference, op)(*args)


def hash_codes(vectors, signs, num_hashes, hash_bits, backend: Backend = "auto"):
    return dispatch("hash_codes", vectors.device, (vectors, signs, num_hashes, hash_bits), backend)


def lsh_cumulation(query_codes, query_mask, key_codes, key_mask, values, hash_bits, backend: Backend = "auto"):
    args = (query_codes, query_mask, key_codes, key_mask, values, hash_bits)
    return dispatch("lsh_cumulation", values.device, args, backend)


def lsh_weighted_cumulation(
    query_codes, query_mask, query_weights, key_codes, key_mask, key_weights, values, hash_bits, backend: Backend = "auto"
):
    args = (query_codes, query_mask, query_weights, key_codes, key_mask, key_weights, values, hash_bits)
    return dispatch("lsh_weighted_cumulation", values.device, args, backend)


def lsh_weighted_cumulation_both(
    query_codes,
    query_mask,
    query_weights,
    query_values,
    key_codes,
    key_mask,
    key_weights,
    key_values,
    hash_bits,
    backend: Backend = "auto",
):
    """Both sides at once: on the kernels, one sort of the codes serves both."""
    args = (query_codes, query_mask, query_weights, query_values, key_codes, key_mask, key_weights, key_values, hash_bits)
    return dispatch("lsh_weighted_cumulation_both", query_values.device, args, backend)


def lsh_collided_gradient(
    query_codes,
    query_mask,
    query_vectors,
    query_weights,
    key_codes,
    key_mask,
    key_vectors,
    key_weights,
    hash_bits,
    backend: Backend = "auto",
):
    args = (query_codes, query_mask, query_vectors, query_weights, key_codes, key_mask, key_vectors, key_weights, hash_bits)
    return dispatch("lsh_collided_gradient", query_vectors.device, args, backend)


def lsh_lower_bound_gradients(
    query_codes,
    query_mask,
    query_vectors,
    query_weights,
    key_codes,
    key_mask,
    key_vectors,
    key_weights,
    hash_bits,
    backend: Backend = "auto",
):
    """YOSO's three lower-bound gradients at once: on the kernels, one index, one table pass and one
    lookup pass serve all three."""
    args = (query_codes, query_mask, query_vectors, query_weights, key_codes, key_mask, key_vectors, key_weights, hash_bits)
    return dispatch("lsh_lower_bound_gradients", query_vectors.device, args, backend)


def hash_queries_and_keys(
    queries: torch.Tensor,
    keys: torch.Tensor,
    num_hashes: int,
    hash_bits: int,
    projection: HashProjection = "hadamard",
    backend: Backend = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``num_hashes`` fresh hash functions of ``hash_bits`` bits and hash queries and keys with them.

    Queries and keys ``(B, n, d)`` -> codes ``(B, n, num_hashes)`` int32 each. ``projection``:
    ``"hadamard"``, the fast pseudo-random rotation ``H D3 H D2 H D1`` (random sign diagonals,
    compiled or reference per ``backend``), or ``"gaussian"``, independent Gaussian hyperplanes (a
    matrix product, in PyTorch on any backend). The randomness is drawn from torch's RNG of the
    queries' device, on that device (:func:`reference.random_signs`): a seed gives the same codes
    run after run on one device, and the CUDA path copies nothing from the host.
    """
    batch, _, dim = queries.shape
    on_device = cuda_path(queries.device)
    if projection == "gaussian":
        projections = reference.random_projections(batch, dim, num_hashes, hash_bits, queries.device, on_device=on_device)
        return tuple(reference.gaussian_hash_codes(x, projections, num_hashes, hash_bits) for x in (queries, keys))
    if projection != "hadamard":
        raise ValueError(f"projection must be 'hadamard' or 'gaussian', got {projection!r}")
    signs = reference.random_signs(batch, dim, num_hashes, hash_bits, queries.device, on_device=on_device)
    return hash_codes(queries, signs, num_hashes, hash_bits, backend), hash_codes(keys, signs, num_hashes, hash_bits, backend)
