"""The fused CPU dropout with its residual sum against its reference mask: values, gradients, the mask's
distribution, the thread count, opcheck, bad inputs."""

import math

import pytest
import torch

from yoso_cuda import ops, reference

KERNELS = ops.kernels()
pytestmark = pytest.mark.skipif(not KERNELS.cpu.loaded, reason=f"CPU kernels not built: {KERNELS.cpu.reason}")
fused = torch.ops.yoso.dropout_add


@pytest.mark.parametrize("seed", [0, 1, 2**61 + 12345])
@pytest.mark.parametrize("shape, p", [((3, 50, 8), 0.1), ((2, 7, 13), 0.5), ((1,), 0.3), ((4, 33), 0.0), ((5, 100), 0.9)])
@pytest.mark.parametrize("with_residual", [True, False])
def test_values_and_gradients_follow_the_reference_mask(shape, p, with_residual, seed):
    generator = torch.Generator().manual_seed(seed % 1000)
    y = torch.randn(shape, generator=generator).requires_grad_()
    residual = torch.randn(shape, generator=generator).requires_grad_() if with_residual else None
    grad = torch.randn(shape, generator=generator)
    out = fused(y, residual, p, torch.tensor([seed]))
    out.backward(grad)
    factor = reference.element_keep(seed, y.numel(), p).view(shape) * torch.tensor(1 / (1 - p), dtype=torch.float32)
    expected = y.detach() * factor + (0 if residual is None else residual.detach())
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    assert torch.equal(y.grad, grad * factor)
    if residual is not None:
        assert torch.equal(residual.grad, grad)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_each_element_is_kept_with_probability_one_minus_p_independently(p):
    numel = 1 << 20
    keep = fused(torch.ones(numel), None, p, torch.tensor([7])) != 0
    sigma = math.sqrt(p * (1 - p) / numel)
    assert abs(keep.float().mean().item() - (1 - p)) < 5 * sigma
    both = (keep[1:] & keep[:-1]).float().mean().item()  # neighbours: kept together with probability (1 - p)^2
    assert abs(both - (1 - p) ** 2) < 5 * math.sqrt((1 - p) ** 2 * (1 - (1 - p) ** 2) / numel)
    other = fused(torch.ones(numel), None, p, torch.tensor([8])) != 0  # another seed, another mask
    assert abs((keep & other).float().mean().item() - (1 - p) ** 2) < 5 * sigma


def test_a_dropped_nan_stays_nan_as_in_dropout():
    y = torch.full((1000,), float("nan"))
    out = fused(y, None, 0.5, torch.tensor([3]))
    assert out.isnan().all()


def test_the_thread_count_changes_no_bit(assert_thread_count_changes_no_bit):
    y, residual = torch.randn(4, 300, 77), torch.randn(4, 300, 77)
    assert_thread_count_changes_no_bit(lambda: fused(y, residual, 0.2, torch.tensor([11])))


def test_opcheck():
    y, residual = torch.randn(3, 40, 6, requires_grad=True), torch.randn(3, 40, 6, requires_grad=True)
    torch.library.opcheck(fused, (y, residual, 0.1, torch.tensor([3])))
    torch.library.opcheck(fused, (y, None, 0.4, torch.tensor([3])))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: {**a, "y": a["y"].double(), "residual": None}, "computes in float32"),
        (lambda a: {**a, "residual": a["residual"][:, :5]}, "residual of y's shape"),
        (lambda a: {**a, "p": 1.0}, r"dropout must be in \[0, 1\)"),
        (lambda a: {**a, "p": -0.1}, r"dropout must be in \[0, 1\)"),
        (lambda a: {**a, "seed": torch.tensor([1.0])}, "seed must be one int64"),
    ],
)
def test_bad_inputs_are_clear_errors(change, message):
    arguments = dict(y=torch.randn(2, 10), residual=torch.randn(2, 10), p=0.1, seed=torch.tensor([1]))
    with pytest.raises(ValueError, match=message):
        fused(**change(arguments))
