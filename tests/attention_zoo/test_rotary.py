"""Rotary positions (attention_zoo.rotary) and MultiHeadAttention(rotary=True)."""

import math

import pytest
import torch

import attention_zoo
from attention_zoo import MultiHeadAttention
from attention_zoo.rotary import apply_rotary, rotary_angles


def reference_rotary(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """RoPE written out: pair (i, i + d/2) at position m rotated by the 2x2 matrix of angle m * base^(-2i/d)."""
    *_, seq, dim = x.shape
    out = torch.empty_like(x, dtype=torch.float64)
    for m in range(seq):
        for i in range(dim // 2):
            angle = m * base ** (-2 * i / dim)
            a, b = x[..., m, i].double(), x[..., m, i + dim // 2].double()
            out[..., m, i] = math.cos(angle) * a - math.sin(angle) * b
            out[..., m, i + dim // 2] = math.sin(angle) * a + math.cos(angle) * b
    return out


def test_rotary_matches_the_written_out_rotation():
    x = torch.randn(2, 3, 7, 8, generator=torch.Generator().manual_seed(0))
    rotated = apply_rotary(x, rotary_angles(7, 8))
    torch.testing.assert_close(rotated.double(), reference_rotary(x), atol=1e-5, rtol=1e-5)
    assert torch.equal(rotated[..., 0, :], x[..., 0, :])  # position 0 is not rotated


def test_rotated_scores_depend_on_the_offset_only():
    generator = torch.Generator().manual_seed(1)
    q, k = torch.randn(16, generator=generator), torch.randn(16, generator=generator)
    seq = 40
    angles = rotary_angles(seq, 16)
    queries = apply_rotary(q.expand(seq, 16), angles)  # the same query at every position
    keys = apply_rotary(k.expand(seq, 16), angles)
    scores = queries @ keys.T  # (m, n): <R_m q, R_n k>
    for offset in (-7, 0, 3, 25):
        diagonal = torch.diagonal(scores, offset=offset)
        torch.testing.assert_close(diagonal, diagonal[0].expand_as(diagonal), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(torch.diagonal(scores, 0)[0], torch.diagonal(scores, 5)[0])


def test_an_odd_head_width_is_a_clear_error():
    with pytest.raises(ValueError, match="head_dim must be even"):
        MultiHeadAttention(12, 4, "softmax", seq_len=8, head_dim=3, rotary=True)


def test_multihead_rotates_queries_and_keys_before_the_core_attention():
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 2, "softmax", seq_len=10, head_dim=8, rotary=True, dropout=0.0).eval()
    x = torch.randn(3, 10, 16)
    mask = torch.ones(3, 10, dtype=torch.bool)
    mask[1, 6:] = False

    def heads(t):
        return t.view(3, 10, 2, 8).transpose(1, 2)  # (b, h, n, d)

    q, k, v = heads(layer.query(x)), heads(layer.key(x)), heads(layer.value(x))
    q, k = reference_rotary(q).float(), reference_rotary(k).float()
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(8) - 1e9 * (~mask)[:, None, None, :]
    expected = (scores.softmax(-1) @ v).transpose(1, 2).reshape(3, 10, 16)
    with torch.no_grad():  # compared at real positions (what a padded query gets is the core attention's business)
        torch.testing.assert_close(layer(x, mask)[mask], layer.output(expected)[mask], atol=1e-5, rtol=1e-4)


def test_an_attention_with_tied_queries_and_keys_gets_them_rotated_alike():
    """The core attention of a tied layer (Reformer's) receives the rotated queries as its keys, not the unrotated
    projection (issue 41: leaving the tied keys unrotated passed every test that only checked shapes)."""
    seen = {}

    @attention_zoo.register("tied_spy_for_the_test")
    class TiedSpy(attention_zoo.Attention):
        tie_query_key = True

        def attend(self, q, k, v, mask):
            seen.update(q=q.clone(), k=k.clone())
            return v

    try:
        torch.manual_seed(0)
        layer = MultiHeadAttention(16, 2, "tied_spy_for_the_test", seq_len=16, head_dim=8, rotary=True).eval()
        x = torch.randn(2, 16, 16)
        layer(x, torch.ones(2, 16, dtype=torch.bool))
    finally:
        attention_zoo.unregister("tied_spy_for_the_test")
    expected = apply_rotary(layer.split_heads(layer.query(x)), rotary_angles(16, 8))  # (b, h, n, d)
    torch.testing.assert_close(seen["q"], expected)
    torch.testing.assert_close(seen["k"], expected, msg="tied keys are the rotated queries")
    assert not torch.allclose(seen["k"], layer.split_heads(layer.query(x))), "the rotation changes them"


@pytest.mark.parametrize("name", attention_zoo.available())
def test_every_registered_attention_takes_rotary_positions(name):
    """Every core attention receives the queries and keys rotated by their positions (not only an output of the
    right shape), and the layer trains."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 2, name, seq_len=64, head_dim=8, rotary=True).eval()
    x = torch.randn(2, 64, 16, requires_grad=True)
    mask = torch.ones(2, 64, dtype=torch.bool)
    mask[1, 40:] = False
    seen = {}
    layer.attention.register_forward_pre_hook(lambda module, args: seen.update(q=args[0].detach(), k=args[1].detach()))
    out = layer(x, mask)
    assert out.shape == x.shape and torch.isfinite(out).all()
    with torch.no_grad():
        angles = rotary_angles(64, 8)
        query = apply_rotary(layer.split_heads(layer.query(x)), angles)
        key = query if layer.key is None else apply_rotary(layer.split_heads(layer.key(x)), angles)
    torch.testing.assert_close(seen["q"], query.to(seen["q"].dtype), msg="rotated queries")
    torch.testing.assert_close(seen["k"], key.to(seen["k"].dtype), msg="rotated keys")
    out[mask].sum().backward()
    assert torch.isfinite(x.grad).all()
