"""How closely the compiled kernels must match the reference: one definition for the tests and ``--check``.

Both sides read the same inputs and accumulate in float32; they differ in summation order only, so
the tolerance (``rtol = atol``, per input dtype) covers reordering plus, for a gradient returned in
its input's dtype, one rounding step of that dtype. Hash codes come from sums of +-x in different
orders (the kernels' butterfly, the reference's Hadamard matmul): a coordinate within rounding of
zero may flip one bit, so codes must agree on at least ``HASH_CODE_AGREEMENT`` of them.
"""

from __future__ import annotations

import torch

TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-3, torch.bfloat16: 1e-2}
HASH_CODE_AGREEMENT = 0.999


def excess_error(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> tuple[float, float]:
    """``(max |actual - expected|, max of |actual - expected| - (atol + rtol |expected|))``, the
    second <= 0 exactly when the values pass ``torch.testing.assert_close`` with ``TOLERANCE[dtype]``."""
    tolerance = TOLERANCE[dtype]
    actual, expected = actual.detach().double().cpu(), expected.detach().double().cpu()
    if actual.shape != expected.shape:
        raise ValueError(f"shapes differ: {tuple(actual.shape)} vs {tuple(expected.shape)}")
    if actual.numel() == 0:
        return 0.0, 0.0
    # As in assert_close: equal infinities pass, a NaN fails.
    same_nonfinite = expected.isinf() & (actual == expected)
    error = torch.where(same_nonfinite, 0.0, (actual - expected).abs().nan_to_num(nan=float("inf")))
    excess = torch.where(same_nonfinite, -1.0, error - tolerance * (1 + expected.abs()))
    return error.max().item(), excess.max().item()
