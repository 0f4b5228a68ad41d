"""YOSO's ops, dispatched to the compiled kernels when they are built and to the reference otherwise.

``torch.ops.yoso.*`` are the compiled ops (schemas in ``csrc/yoso.cpp``); their fake (meta)
kernels, registered here, let them run under ``torch.compile``. The functions below take the same
arguments as :mod:`yoso_cuda.reference` and pick, per call, the compiled kernel for the tensors'
device if there is one, else the reference. The kernels are built on first use (or by
``python -m yoso_cuda``); if that fails, one warning says why and how to get them.
"""

from __future__ import annotations

import functools
import warnings

import torch

from . import reference
from .build import BuildReport, build


@functools.cache
def kernels() -> BuildReport:
    """Build or load the kernels once per process."""
    report = build()
    if report.cpu:
        _register_fake_kernels()
    else:
        warnings.warn(
            f"YOSO's compiled kernels are unavailable ({report.error}); using the pure-PyTorch reference, "
            "which is slower. To build them, install a C++ compiler (and a CUDA toolkit with CUDA_HOME for GPUs), "
            "then run `python -m yoso_cuda` to see the build log.",
            stacklevel=3,
        )
    return report


@torch.compiler.assume_constant_result  # fixed once the kernels are built: no graph break under torch.compile
def has_kernel(device: torch.device) -> bool:
    report = kernels()
    return report.cuda if device.type == "cuda" else device.type == "cpu" and report.cpu


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


def hash_codes(vectors, signs, num_hashes, hash_bits):
    if has_kernel(vectors.device):
        return torch.ops.yoso.hash_codes(vectors, signs, num_hashes, hash_bits)
    return reference.hash_codes(vectors, signs, num_hashes, hash_bits)


def lsh_cumulation(query_codes, query_mask, key_codes, key_mask, values, hash_bits):
    if has_kernel(values.device):
        return torch.ops.yoso.lsh_cumulation(query_codes, query_mask, key_codes, key_mask, values, hash_bits)
    return reference.lsh_cumulation(query_codes, query_mask, key_codes, key_mask, values, hash_bits)


def lsh_weighted_cumulation(query_codes, query_mask, query_weights, key_codes, key_mask, key_weights, values, hash_bits):
    args = (query_codes, query_mask, query_weights, key_codes, key_mask, key_weights, values, hash_bits)
    if has_kernel(values.device):
        return torch.ops.yoso.lsh_weighted_cumulation(*args)
    return reference.lsh_weighted_cumulation(*args)


def lsh_weighted_cumulation_both(
    query_codes, query_mask, query_weights, query_values, key_codes, key_mask, key_weights, key_values, hash_bits
):
    args = (query_codes, query_mask, query_weights, query_values, key_codes, key_mask, key_weights, key_values, hash_bits)
    if query_values.device.type == "cpu" and has_kernel(query_values.device):  # one pass on the CPU kernel
        return torch.ops.yoso.lsh_weighted_cumulation_both(*args)
    return (
        lsh_weighted_cumulation(query_codes, query_mask, query_weights, key_codes, key_mask, key_weights, key_values, hash_bits),
        lsh_weighted_cumulation(key_codes, key_mask, key_weights, query_codes, query_mask, query_weights, query_values, hash_bits),
    )


def lsh_collided_gradient(
    query_codes, query_mask, query_vectors, query_weights, key_codes, key_mask, key_vectors, key_weights, hash_bits
):
    args = (query_codes, query_mask, query_vectors, query_weights, key_codes, key_mask, key_vectors, key_weights, hash_bits)
    if has_kernel(query_vectors.device):
        return torch.ops.yoso.lsh_collided_gradient(*args)
    return reference.lsh_collided_gradient(*args)
