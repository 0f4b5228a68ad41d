"""SequenceConv, the depthwise convolution of V that YOSO-C and Nystromformer add: on a CPU in float32 it runs on the
compiled op, elsewhere on F.conv2d; both ways give the same values and gradients."""

import pytest
import torch

from attention_zoo import _conv
from attention_zoo._conv import SequenceConv
from yoso_cuda import ops

KERNELS = ops.kernels()


def run(conv, x, grad):
    x = x.clone().requires_grad_()
    conv.zero_grad()
    out = conv(x)
    out.backward(grad)
    return out.detach(), x.grad, conv.weight.grad.clone()


@pytest.mark.skipif(not KERNELS.cpu.loaded, reason=f"CPU kernels not built: {KERNELS.cpu.reason}")
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("heads, width", [(2, 33), (3, 35), (1, 3)])
def test_the_compiled_op_and_conv2d_agree_on_values_and_gradients(monkeypatch, heads, width, seed):
    torch.manual_seed(seed)
    conv = SequenceConv(heads, width)
    x = torch.randn(3, heads, 200, 32)
    x[0, :, 150:] = 0  # padded positions, as the attention zeroes them
    grad = torch.randn_like(x)
    calls, compiled_op = [], _conv.sequence_conv
    monkeypatch.setattr(_conv, "sequence_conv", lambda *args: calls.append(1) or compiled_op(*args))
    compiled = run(conv, x, grad)
    assert calls, "a float32 CPU input takes the compiled op"
    monkeypatch.setattr(_conv, "has_kernel", lambda device: False)
    reference = run(conv, x, grad)
    for ours, theirs in zip(compiled, reference):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5 * theirs.abs().max().item())


def test_other_dtypes_take_conv2d():
    conv = SequenceConv(2, 5).double()
    x = torch.randn(1, 2, 20, 4, dtype=torch.float64)
    expected = torch.nn.functional.conv2d(x, conv.weight, padding=(2, 0), groups=2)
    torch.testing.assert_close(conv(x), expected)
