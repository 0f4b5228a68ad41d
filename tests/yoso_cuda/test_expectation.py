"""YOSO-E's fused CPU attention (``yoso::expectation_attention``) against a float64 oracle: values, the (tau/2) W
surrogate gradients, padding, thread count, opcheck, bad inputs; and attention_zoo's yoso_e on it."""

import math

import pytest
import torch
import torch.nn.functional as F

import attention_zoo
from attention_zoo import yoso as zoo_yoso
from yoso_cuda import ops

KERNELS = ops.kernels()
pytestmark = pytest.mark.skipif(not KERNELS.cpu.loaded, reason=f"CPU kernels not built: {KERNELS.cpu.reason}")
fused = torch.ops.yoso.expectation_attention


def inputs(batch, length, dim, value_dim, padding, seed):
    """Unit queries and keys, values and the real tokens' mask (batch, n): ``padding`` is None (every token real),
    "right" (lengths 1 to n, one row with no real token) or "random" (tokens real with probability 0.6)."""
    generator = torch.Generator().manual_seed(seed)
    q, k = (F.normalize(torch.randn(batch, length, dim, generator=generator, dtype=torch.float64), dim=-1) for _ in range(2))
    v = torch.randn(batch, length, value_dim, generator=generator, dtype=torch.float64)
    real = torch.ones(batch, length, dtype=torch.bool)
    if padding == "right":
        lengths = torch.randint(1, length + 1, (batch,), generator=generator)
        lengths[0] = 1 + length // 3  # a last real key that does not end a vector of 8 keys
        lengths[-1] = 0
        real = torch.arange(length) < lengths[:, None]
    elif padding == "random":
        real = torch.rand(batch, length, generator=generator) < 0.6
    return q, k, v, real


def oracle(q, k, v, real, tau, grad):
    """float64: W V with W = real_i real_j (1 - arccos(q . k)/pi)^tau, and the surrogate gradients written out."""
    weights = (1 - torch.arccos((q @ k.transpose(-1, -2)).clamp(-1, 1)) / math.pi) ** tau
    weights = weights * real[:, :, None] * real[:, None, :]  # (B, n, n)
    surrogate = (grad @ v.transpose(-1, -2)) * weights * (tau / 2)  # (B, n, n)
    return weights @ v, surrogate @ k, surrogate.transpose(-1, -2) @ q, weights.transpose(-1, -2) @ grad


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "batch, length, dim, value_dim, padding, tau",
    [
        (2, 37, 16, 16, None, 11),
        (3, 203, 32, 20, "right", 11),  # several query blocks, rows of every length, one with no real token
        (2, 257, 33, 64, "random", 7),  # a ragged block; d and c not multiples of 8
        (3, 8, 5, 3, "random", 1),
        (1, 1, 4, 4, None, 30),
    ],
)
def test_values_and_gradients_equal_the_float64_oracle(batch, length, dim, value_dim, padding, tau, seed):
    q, k, v, real = inputs(batch, length, dim, value_dim, padding, seed)
    grad = torch.randn(batch, length, value_dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    q32, k32, v32 = (x.float().requires_grad_() for x in (q, k, v))
    out = fused(q32, k32, v32, real, tau)
    out.backward(grad.float())
    # The oracle takes the float32 inputs exactly, so the comparison measures the kernel's arithmetic.
    expected = oracle(q.float().double(), k.float().double(), v.float().double(), real, tau, grad.float().double())
    for name, ours, theirs in zip(["out", "grad q", "grad k", "grad v"], (out, q32.grad, k32.grad, v32.grad), expected):
        torch.testing.assert_close(
            ours.double(), theirs, rtol=1e-5, atol=1e-6 + 2e-5 * theirs.abs().max().item(), msg=lambda m, n=name: f"{n}: {m}"
        )
    assert (out[~real] == 0).all(), "a padded query's row is zero"


def test_identical_and_opposite_vectors_give_weights_one_and_zero():
    """Cosines at +-1, rounded to either side in float32, are clamped: q = k weighs 1, q = -k weighs 0. A cosine
    1 - 6e-8 (one float32 step) is an angle of 3.5e-4: (1 - 3.5e-4 / pi)^11 = 1 - 1.2e-3, whatever computes it."""
    q = F.normalize(torch.randn(1, 24, 8, generator=torch.Generator().manual_seed(0)), dim=-1)
    values = torch.eye(24)[None]  # (1, n, n): the output is W itself
    real = torch.ones(1, 24, dtype=torch.bool)
    weights = fused(q, q, values, real, 11)
    torch.testing.assert_close(weights.diagonal(dim1=1, dim2=2), torch.ones(1, 24), rtol=0, atol=3e-3)
    opposite = fused(q, -q, values, real, 11)
    assert opposite.diagonal(dim1=1, dim2=2).abs().max() < 1e-6
    for w in (weights, opposite):
        assert ((w >= 0) & (w <= 1)).all(), "probabilities"


def test_the_thread_count_changes_no_bit(assert_thread_count_changes_no_bit):
    q, k, v, real = (x.float() if x.is_floating_point() else x for x in inputs(6, 150, 16, 16, "right", seed=4))
    grad = torch.randn(6, 150, 16, generator=torch.Generator().manual_seed(1))

    def compute():
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out = fused(*leaves, real, 11)
        return [out, *torch.autograd.grad(out, leaves, grad)]

    assert_thread_count_changes_no_bit(compute)


def test_opcheck():
    q, k, v, real = (x.float().requires_grad_() if x.is_floating_point() else x for x in inputs(2, 40, 8, 12, "right", 5))
    torch.library.opcheck(fused, (q, k, v, real, 11))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: {**a, "queries": a["queries"][..., :3]}, "unit queries and keys of one shape"),
        (lambda a: {**a, "values": a["values"][:, :5]}, "unit queries and keys of one shape"),
        (lambda a: {**a, "queries": a["queries"].double()}, "computes in float32"),
        (lambda a: {**a, "real": a["real"][:, :5]}, "real must be bool"),
        (lambda a: {**a, "real": a["real"].float()}, "real must be bool"),
        (lambda a: {**a, "hash_bits": 0}, "hash_bits must be in"),
        (lambda a: {**a, "hash_bits": 31}, "hash_bits must be in"),
    ],
)
def test_bad_inputs_are_clear_errors(change, message):
    q, k, v, real = (x.float() if x.is_floating_point() else x for x in inputs(1, 10, 4, 4, None, seed=6))
    arguments = dict(queries=q, keys=k, values=v, real=real, hash_bits=11)
    with pytest.raises(ValueError, match=message):
        fused(**change(arguments))


def test_yoso_e_runs_on_the_fused_op_with_the_dense_paths_values_and_gradients(monkeypatch):
    """attention_zoo's yoso_e in float32 on a CPU takes the op, and agrees with its dense path (backend: reference)."""
    calls = []
    monkeypatch.setattr(zoo_yoso.yoso_cuda, "expectation_attention", lambda *a: calls.append(1) or fused(*a))
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(3, 2, 100, 16, generator=generator) for _ in range(3))
    mask = torch.arange(100) < torch.tensor([100, 61, 7])[:, None]
    grad = torch.randn(3, 2, 100, 16, generator=generator)
    results = []
    for backend in ("auto", "reference"):
        attention = attention_zoo.build("yoso_e", seq_len=128, num_heads=2, head_dim=16, backend=backend).train()
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out = attention(*leaves, mask)
        results.append([out, *torch.autograd.grad(out, leaves, grad)])
    assert calls == [1], "the auto backend takes the fused op, the reference backend the dense path"
    for got, expected in zip(*results):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
