"""Local attention against a dense float64 reference built from the block definition, and its locality."""

import math

import pytest
import torch

import attention_zoo

HEADS, HEAD_DIM = 2, 8


def build(seq_len, **hparams):
    return attention_zoo.build("local", seq_len=seq_len, num_heads=HEADS, head_dim=HEAD_DIM, **hparams).eval()


def inputs(batch, n, seed=0, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, HEADS, n, HEAD_DIM, generator=generator, dtype=dtype) for _ in range(3))


def ragged_mask(n):
    """Row 0 unpadded, row 1 random padding, row 2 fully padded, row 3 only its last token real."""
    mask = torch.rand(4, n, generator=torch.Generator().manual_seed(1)) < 0.7
    mask[0] = True
    mask[2] = False
    mask[3] = False
    mask[3, -1] = True
    return mask


def same_block(n, block_size):
    """(n, n) bool: query i may see key j when both lie in the same block of consecutive tokens."""
    block = torch.arange(n) // block_size
    return block[:, None] == block[None, :]


def dense_reference(q, k, v, mask, allowed):
    """softmax(q k^T / sqrt(d)) v in float64 over the (n, n) pattern ``allowed`` and the real keys; padded rows zero."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (b, h, n, n)
    keep = allowed[None, None] if mask is None else allowed[None, None] & mask[:, None, None, :]
    out = torch.nan_to_num(scores.masked_fill(~keep, float("-inf")).softmax(-1)) @ v  # empty rows: padded queries
    return out if mask is None else out * mask[:, None, :, None]


@pytest.mark.parametrize("n", [1, 5, 12, 13, 31])  # blocks of 4 or 6: multiples, not, and shorter than a block
@pytest.mark.parametrize("block_size", [1, 4, 6, 50])
def test_equals_dense_block_diagonal_reference_in_float64(n, block_size):
    """The algorithm on float64 inputs (``attend``, which the dtype check of ``forward`` would refuse) to 1e-6,
    and the float32 forward to float32 accuracy."""
    attn = build(n, block_size=block_size)
    q, k, v = inputs(4, n, dtype=torch.float64)
    allowed = same_block(n, block_size)
    for mask in (ragged_mask(n), None):
        expected = dense_reference(q, k, v, mask, allowed)
        out = attn.attend(q, k, v, mask)
        if mask is not None:
            out = out * mask[:, None, :, None]  # forward's zeroing of padded rows
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
        torch.testing.assert_close(attn(q.float(), k.float(), v.float(), mask).double(), expected, rtol=1e-5, atol=1e-6)


def test_value_dim_may_differ_from_the_query_dim():
    n, value_dim = 23, 2 * HEAD_DIM
    attn = build(n, block_size=5)
    q, k, _ = inputs(4, n)
    v = torch.randn(4, HEADS, n, value_dim, generator=torch.Generator().manual_seed(2))
    mask = ragged_mask(n)
    expected = dense_reference(q, k, v, mask, same_block(n, 5))
    torch.testing.assert_close(attn(q, k, v, mask).double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [12, 14])  # a multiple of the block and a padded tail
def test_a_query_depends_only_on_the_keys_of_its_own_block(n):
    """Perturbing key/value j changes output row i exactly when i and j share a block of 4."""
    attn = build(n, block_size=4)
    q, k, v = inputs(1, n)
    reference = attn(q, k, v)
    influence = torch.zeros(n, n, dtype=torch.bool)
    for j in range(n):
        k2, v2 = k.clone(), v.clone()
        k2[:, :, j] += 10.0
        v2[:, :, j] += 10.0
        influence[:, j] = (attn(q, k2, v2) != reference).any(dim=-1).any(dim=1)[0]  # over heads and features
    assert torch.equal(influence, same_block(n, 4))


def test_keys_outside_the_block_may_change_arbitrarily():
    """Every key and value outside block 1 (positions 8..15) replaced by large noise: rows 8..15 are bit-identical."""
    n, block_size = 30, 8
    attn = build(n, block_size=block_size)
    q, k, v = inputs(2, n)
    noise_k, noise_v, _ = inputs(2, n, seed=3)
    outside = torch.ones(n, dtype=torch.bool)
    outside[8:16] = False
    outside = outside[None, None, :, None]  # (1, 1, n, 1)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, 11] = False
    out = attn(q, k, v, mask)
    changed = attn(q, torch.where(outside, 100 * noise_k, k), torch.where(outside, 100 * noise_v, v), mask)
    assert torch.equal(changed[:, :, 8:16], out[:, :, 8:16])
    assert not torch.allclose(changed[:, :, :8], out[:, :, :8])


def test_a_sequence_shorter_than_the_block_is_softmax_attention():
    q, k, v = inputs(4, 40)
    mask = ragged_mask(40)
    softmax = attention_zoo.build("softmax", seq_len=40, num_heads=HEADS, head_dim=HEAD_DIM).eval()
    torch.testing.assert_close(build(40)(q, k, v, mask), softmax(q, k, v, mask), rtol=1e-5, atol=1e-6)


def test_the_default_is_the_lra_text_tasks_block_of_50():
    assert attention_zoo.make_config("local").block_size == 50
    n = 120  # blocks 0..49, 50..99 and a padded 100..119
    q, k, v = inputs(1, n)
    expected = dense_reference(q, k, v, None, same_block(n, 50))
    torch.testing.assert_close(build(n)(q, k, v).double(), expected, rtol=1e-5, atol=1e-6)


def test_dropout_only_in_training():
    q, k, v = inputs(1, 20)
    attn = build(20, block_size=4, dropout=0.5)
    expected = dense_reference(q, k, v, None, same_block(20, 4))
    torch.testing.assert_close(attn.eval()(q, k, v).double(), expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(attn.train()(q, k, v).double(), expected, atol=1e-3)


@pytest.mark.parametrize(
    "hparams, message",
    [({"block_size": 0}, "block_size"), ({"block_size": -3}, "block_size"), ({"dropout": 1.0}, "dropout")],
)
def test_bad_hyperparameters_name_the_problem(hparams, message):
    with pytest.raises(ValueError, match=message):
        build(8, **hparams)
