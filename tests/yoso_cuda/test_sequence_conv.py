"""The compiled depthwise convolution along the sequence (YOSO-C's and Nystromformer's) against F.conv2d in float64:
values, both gradients, the thread count, opcheck, bad inputs."""

import pytest
import torch
import torch.nn.functional as F

from yoso_cuda import ops

KERNELS = ops.kernels()
pytestmark = pytest.mark.skipif(not KERNELS.cpu.loaded, reason=f"CPU kernels not built: {KERNELS.cpu.reason}")
compiled = torch.ops.yoso.sequence_conv


def inputs(batch, heads, length, channels, width, seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, heads, length, channels, generator=generator, dtype=torch.float64)
    weight = torch.randn(heads, width, generator=generator, dtype=torch.float64)
    grad = torch.randn(batch, heads, length, channels, generator=generator, dtype=torch.float64)
    return x, weight, grad


def conv2d(x, weight):
    """The oracle: a per-head (width, 1) kernel, groups = heads, zero padded to keep the length."""
    return F.conv2d(x, weight[:, None, :, None], padding=(weight.shape[1] // 2, 0), groups=weight.shape[0])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "batch, heads, length, channels, width",
    [
        (2, 2, 300, 32, 33),  # YOSO-C's taps; several blocks of 128 rows, a ragged last one
        (1, 3, 100, 20, 35),  # Nystromformer's width; channels not a multiple of 8
        (2, 1, 7, 5, 33),  # a kernel wider than the sequence: every tap partly or wholly outside it
        (1, 2, 50, 3, 9),
        (3, 2, 40, 8, 1),  # one tap: a per-head scale
        (1, 1, 1, 4, 5),
        (2, 2, 600, 9, 7),  # rows that are not a whole number of 8 floats: blocks of 455 rows
    ],
)
def test_values_and_gradients_equal_conv2d(batch, heads, length, channels, width, seed):
    x, weight, grad = inputs(batch, heads, length, channels, width, seed)
    x32, weight32 = x.float().requires_grad_(), weight.float().requires_grad_()
    out = compiled(x32, weight32)
    out.backward(grad.float())
    x64, weight64 = x.clone().requires_grad_(), weight.clone().requires_grad_()
    expected = conv2d(x64, weight64)
    expected.backward(grad)
    for ours, theirs in ((out, expected), (x32.grad, x64.grad), (weight32.grad, weight64.grad)):
        torch.testing.assert_close(ours.double(), theirs.detach(), rtol=1e-5, atol=1e-5 * theirs.abs().max().item())


def test_a_non_contiguous_input_is_read_as_its_values():
    """The attention's values come from splitting heads, a transposed view."""
    x, weight, _ = inputs(2, 2, 64, 16, 5, seed=3)
    view = x.float().transpose(1, 2).contiguous().transpose(1, 2)  # (b, h, n, c) with heads outside the rows
    assert not view.is_contiguous()
    torch.testing.assert_close(compiled(view, weight.float()).double(), conv2d(x, weight), rtol=1e-5, atol=1e-5)


def test_the_thread_count_changes_no_bit(assert_thread_count_changes_no_bit):
    x, weight, grad = (t.float() for t in inputs(4, 2, 300, 20, 33, seed=4))
    x.requires_grad_(), weight.requires_grad_()

    def compute():
        out = compiled(x, weight)
        return (out, *torch.autograd.grad(out, (x, weight), grad))

    assert_thread_count_changes_no_bit(compute)


def test_opcheck():
    x, weight, _ = (t.float().requires_grad_() for t in inputs(2, 2, 40, 12, 7, seed=5))
    torch.library.opcheck(compiled, (x, weight))


@pytest.mark.parametrize(
    "x_shape, weight_shape, dtype, message",
    [
        ((2, 10, 4), (2, 3), torch.float32, r"x of shape \(batch, heads, n, c\)"),
        ((1, 2, 10, 4), (3, 3), torch.float32, r"weight of shape \(heads, width\)"),
        ((1, 2, 10, 4), (2, 4), torch.float32, "width must be odd"),
        ((1, 2, 10, 4), (2, 3), torch.float64, "computes in float32"),
    ],
)
def test_bad_inputs_are_clear_errors(x_shape, weight_shape, dtype, message):
    with pytest.raises(ValueError, match=message):
        compiled(torch.zeros(x_shape, dtype=dtype), torch.zeros(weight_shape, dtype=dtype))
