"""``yoso_cuda.lsh_attention``'s backward against its definition, computed densely in float64 from the same codes.

The kernel-against-reference tests share the Python backward (``yoso_cuda/attention.py``), so a
mistake there (a zeroed gradient, a wrong scale, a swapped argument) passes them all. Here every
gradient is compared with the estimator it is meant to be (see the module docstring of
``yoso_cuda.attention``), written out over dense (n x n) collision matrices:

* ``Bbar_ij = (1/m) sum_h [q_h(i) = k_h(j)]`` over real queries and keys, and the forward ``Bbar V``;
* ``grad V = Bbar^T G``;
* ``lower_bound``: ``S = (G V^T) * (tau/2) Bbar``, ``grad Q = S K``, ``grad K = S^T Q``;
* ``exact``: ``S = (G V^T) * f'(0.99 Q K^T) * U`` with ``U_ij`` = collided in at least one hash,
  ``grad Q = S K``, ``grad K = S^T Q``.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import yoso_cuda
from yoso_cuda import ops, reference

TAU, HASHES, LENGTH, DIM, VALUE_DIM = 3, 4, 40, 16, 8
BACKENDS = ["reference", pytest.param("compiled", id="compiled")]


def inputs(seed):
    """Unit queries, keys that are noisy copies of them (so pairs collide often but not always), values,
    an output gradient, a padding mask and the codes of one draw of hash functions."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(2, LENGTH, DIM, generator=generator)
    queries = F.normalize(x, dim=-1)
    keys = F.normalize(x + 0.8 * torch.randn(2, LENGTH, DIM, generator=generator), dim=-1)
    values = torch.randn(2, LENGTH, VALUE_DIM, generator=generator)
    grad = torch.randn(2, LENGTH, VALUE_DIM, generator=generator)
    mask = torch.ones(2, LENGTH, dtype=torch.bool)
    mask[1, 29:] = False
    mask[0, 3] = False
    torch.manual_seed(seed)
    signs = reference.random_signs(2, DIM, HASHES, TAU)
    codes = reference.hash_codes(queries, signs, HASHES, TAU), reference.hash_codes(keys, signs, HASHES, TAU)
    return queries, keys, values, grad, mask, codes


def dense_definition(queries, keys, values, grad, mask, codes, backward):
    """``(out, grad Q, grad K, grad V)`` of the estimator, in float64 over dense collision matrices."""
    q, k, v, g = (t.double() for t in (queries, keys, values, grad))
    query_codes, key_codes = codes
    pairs = mask[:, :, None, None] & mask[:, None, :, None]  # (B, n, n, 1)
    collide = (query_codes[:, :, None, :] == key_codes[:, None, :, :]) & pairs  # (B, n, n, m)
    mean_collisions = collide.double().mean(-1)  # Bbar
    gv = g @ v.transpose(-1, -2)  # (g_i . v_j)
    if backward == "lower_bound":
        pair_weight = gv * (TAU / 2) * mean_collisions
    else:
        x = 0.99 * (q @ k.transpose(-1, -2))
        p = 1 - torch.arccos(x) / math.pi
        derivative = TAU * p ** (TAU - 1) / (math.pi * torch.sqrt(1 - x * x))
        pair_weight = gv * derivative * collide.any(-1).double()
    return mean_collisions @ v, pair_weight @ k, pair_weight.transpose(-1, -2) @ q, mean_collisions.transpose(-1, -2) @ g


def require(backend):
    if backend == "compiled" and not ops.has_kernel(torch.device("cpu")):
        pytest.skip(f"cpu kernels not built: {ops.kernels().cpu.reason}")


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("backward", yoso_cuda.BACKWARD_ESTIMATORS)
def test_the_backward_is_its_estimator_computed_densely_from_the_same_codes(backward, backend, seed):
    require(backend)
    queries, keys, values, grad, mask, codes = inputs(seed)
    expected = dense_definition(queries, keys, values, grad, mask, codes, backward)
    leaves = [t.clone().requires_grad_() for t in (queries, keys, values)]
    out = yoso_cuda.lsh_attention(*leaves, mask, *codes, TAU, backward, backend)
    out.backward(grad)
    actual = (out, *(t.grad for t in leaves))
    for name, value, target in zip(("out", "grad q", "grad k", "grad v"), actual, expected):
        assert target.abs().amax() > 0.5, f"{name}: a case where the gradient is large, not a vanishing one"
        torch.testing.assert_close(value.double(), target, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
    collided = (codes[0][:, :, None, :] == codes[1][:, None, :, :]).any(-1)
    assert 0.1 < collided.double().mean() < 0.9, "some pairs collide and some do not, so the collision sets matter"


def test_an_unknown_estimator_is_an_error_not_the_exact_one():
    """The backward picks lower_bound or else exact: a misspelt name must be refused, not run as exact."""
    queries, keys, values, _, mask, codes = inputs(0)
    with pytest.raises(ValueError, match="backward must be one of 'lower_bound', 'exact', got 'lower-bound'"):
        yoso_cuda.lsh_attention(queries, keys, values, mask, *codes, TAU, "lower-bound", "reference")
