"""Linformer against exact softmax (its k = n, identity-projection limit) and a dense float64 reference."""

import math

import pytest
import torch
from zoo_inputs import random_qkv, softmax_reference

import attention_zoo


def build(seq_len, heads=2, head_dim=8, **hparams):
    return attention_zoo.build("linformer", seq_len=seq_len, num_heads=heads, head_dim=head_dim, **hparams).eval()


def dense_linformer(q, k, v, E, F, mask):
    """softmax(Q (E K)^T / sqrt(d)) (F V) in float64, padded keys/values zeroed first, padded rows zeroed."""
    n = q.shape[2]
    real = mask[:, None, :, None].double()  # (b, 1, n, 1)
    projected_k = E[..., :n].double() @ (k.double() * real)  # (b, h, k, d)
    projected_v = F[..., :n].double() @ (v.double() * real)  # (b, h, k, dv)
    return softmax_reference(q, projected_k, projected_v) * real


def test_identity_projections_with_k_equal_n_are_exact_softmax():
    n = 12
    for share_heads, share_kv in ((True, False), (False, True)):
        attn = build(n, heads=3, k=n, share_heads=share_heads, share_kv=share_kv)
        with torch.no_grad():
            for projection in (attn.E, attn.F):
                if projection is not None:
                    projection.copy_(torch.eye(n).expand_as(projection))
        q, k, v = random_qkv(2, n, heads=3)
        expected = softmax_reference(q, k, v)
        torch.testing.assert_close(attn(q, k, v).double(), expected, rtol=1e-5, atol=1e-6)
        full = torch.ones(2, n, dtype=torch.bool)
        torch.testing.assert_close(attn(q, k, v, full).double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("share_heads, share_kv", [(True, False), (False, False), (False, True), (True, True)])
@pytest.mark.parametrize("value_dim", [8, 12], ids=["value-dim-equal", "value-dim-differs"])
def test_equals_dense_reference_with_random_projections_and_mask(share_heads, share_kv, value_dim):
    torch.manual_seed(0)
    attn = build(40, heads=2, k=6, share_heads=share_heads, share_kv=share_kv)
    with torch.no_grad():  # larger than the init so the softmax is far from uniform
        attn.E.normal_()
        if attn.F is not None:
            attn.F.normal_()
    q, k, _ = random_qkv(4, 29)  # shorter than seq_len: the first 29 columns are used
    v = random_qkv(4, 29, head_dim=value_dim, seed=1)[2]  # the third of three draws of that width
    mask = torch.rand(4, 29) < 0.6
    mask[0] = True
    mask[1] = False
    out = attn(q, k, v, mask)
    F = attn.E if share_kv else attn.F
    expected = dense_linformer(q, k, v, attn.E.detach(), F.detach(), mask)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    assert (out[1] == 0).all()


def test_right_padding_equals_the_unpadded_sequence():
    attn = build(32, k=8)
    q, k, v = random_qkv(1, 32)
    mask = torch.zeros(1, 32, dtype=torch.bool)
    mask[0, :20] = True
    padded = attn(q, k, v, mask)[:, :, :20]
    unpadded = attn(q[:, :, :20], k[:, :, :20], v[:, :, :20])
    torch.testing.assert_close(padded, unpadded, rtol=1e-5, atol=1e-6)


def test_k_is_clamped_to_seq_len_and_longer_inputs_are_an_error():
    assert build(17).E.shape == (1, 17, 17)  # the paper's k = 256 on a short sequence
    assert build(300, heads=3, share_heads=False).E.shape == (3, 256, 300)
    attn = build(16, k=4)
    q, k, v = random_qkv(1, 17)
    with pytest.raises(ValueError, match="exceeds seq_len=16"):
        attn(q, k, v)


def test_sharing_and_initialisation():
    separate, shared = build(512, k=64), build(512, k=64, share_kv=True)
    assert separate.F is not None and separate.F.shape == separate.E.shape
    assert shared.F is None and sum(p.numel() for p in shared.parameters()) == 64 * 512
    bound = math.sqrt(6 / (64 + 512)) / math.sqrt(2)  # fairseq: Xavier-uniform, gain 1/sqrt(2)
    assert separate.E.abs().max() <= bound
    assert abs(separate.E.std().item() - bound / math.sqrt(3)) < 0.05 * bound
    normal = build(512, k=64, init="normal")
    assert abs(normal.E.std().item() - 0.02) < 0.001


def test_projections_are_learned():
    attn = build(16, k=4).train()
    q, k, v = random_qkv(2, 16)
    attn(q, k, v).square().sum().backward()
    assert attn.E.grad.abs().sum() > 0 and attn.F.grad.abs().sum() > 0


def test_dropout_only_in_training():
    torch.manual_seed(0)
    attn = build(16, k=8, dropout=0.5)
    q, k, v = random_qkv(1, 16)
    expected = attn(q, k, v)
    assert not torch.allclose(attn.train()(q, k, v), expected, atol=1e-3)
    torch.testing.assert_close(attn.eval()(q, k, v), expected)


def test_invalid_hyperparameters_name_the_problem():
    with pytest.raises(ValueError, match="k"):
        build(8, k=0)
    with pytest.raises(ValueError, match="dropout"):
        build(8, dropout=1.0)
    with pytest.raises(TypeError, match="init"):
        build(8, init="orthogonal")
