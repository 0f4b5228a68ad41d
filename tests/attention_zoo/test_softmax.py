"""Softmax attention against a naive float64 reference."""

import pytest
import torch
from zoo_inputs import softmax_reference

import attention_zoo


@pytest.mark.parametrize("seq_len", [1, 5, 130])
@pytest.mark.parametrize("value_dim", [8, 12], ids=["value-dim-equal", "value-dim-differs"])
def test_equals_naive_reference_with_masks(seq_len, value_dim):
    torch.manual_seed(0)
    attn = attention_zoo.build("softmax", seq_len=seq_len, num_heads=3, head_dim=8).eval()
    q, k = (torch.randn(4, 3, seq_len, 8) for _ in range(2))
    v = torch.randn(4, 3, seq_len, value_dim)
    mask = torch.rand(4, seq_len) < 0.6
    mask[0] = True
    mask[1] = False
    mask[2, 0] = True
    out = attn(q, k, v, mask)
    torch.testing.assert_close(out.double(), softmax_reference(q, k, v, mask), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(attn(q, k, v).double(), softmax_reference(q, k, v, None), rtol=1e-5, atol=1e-6)
    assert (out[1] == 0).all()


def test_a_fully_padded_sequence_gives_the_fused_dropout_kernel_a_real_key(monkeypatch):
    """The fused CPU kernel (softmax with dropout, in training) needs a real key in every sequence, as some GPU SDPA
    backends do: a sequence with none gets every key unmasked, and its rows (zeroed after) stay finite, with finite
    gradients. The kernel's dense reference stands in for it, so this holds where the kernels are not built; PyTorch's
    CPU SDPA gives zeros for such a row by itself, so without the fused path the guard would go untested."""
    import attention_zoo.softmax as softmax
    from yoso_cuda import reference

    seen = []

    def dense_kernel(q, k, v, key_mask, dropout):
        seen.append(key_mask.clone())
        return reference.softmax_dropout_attention(q, k, v, key_mask, dropout, seed=0)

    monkeypatch.setattr(softmax, "has_kernel", lambda device: True)
    monkeypatch.setattr(softmax, "softmax_dropout_attention", dense_kernel)
    attn = attention_zoo.build("softmax", seq_len=6, num_heads=2, head_dim=4, dropout=0.1).train()
    q, k, v = (torch.randn(2, 2, 6, 4, generator=torch.Generator().manual_seed(i), requires_grad=True) for i in range(3))
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1] = False
    out = attn(q, k, v, mask)
    assert len(seen) == 1 and seen[0].any(dim=1).all(), "every sequence the kernel sees has a real key"
    assert torch.isfinite(out).all() and (out[1] == 0).all()
    (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(5))).sum().backward()
    for tensor in (q, k, v):
        assert torch.isfinite(tensor.grad).all()
        assert (tensor.grad[1] == 0).all(), "a sequence with no real token gets no gradient"


def test_dropout_only_in_training():
    torch.manual_seed(0)
    attn = attention_zoo.build("softmax", seq_len=16, num_heads=1, head_dim=4, dropout=0.5)
    q, k, v = (torch.randn(1, 1, 16, 4) for _ in range(3))
    expected = softmax_reference(q, k, v, None)
    torch.testing.assert_close(attn.eval()(q, k, v).double(), expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(attn.train()(q, k, v).double(), expected, atol=1e-3)


def test_none_returns_the_values_with_padded_rows_zeroed():
    attn = attention_zoo.build("none", seq_len=6, num_heads=2, head_dim=3)
    q, k, v = (torch.randn(2, 2, 6, 3) for _ in range(3))
    mask = torch.tensor([[True] * 6, [True, True, False, False, False, False]])
    torch.testing.assert_close(attn(q, k, v, mask), v * mask[:, None, :, None])
    torch.testing.assert_close(attn(q, k, v), v)
