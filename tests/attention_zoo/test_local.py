"""Local attention against a dense float64 reference built from the block definition, and its locality."""

import pytest
import torch
from zoo_inputs import (
    HEAD_DIM,
    attend64,
    build_attention,
    builder,
    influence,
    ragged_mask,
    random_qkv,
    random_values,
    same_block,
    softmax_reference,
)

import attention_zoo

build = builder("local")


@pytest.mark.parametrize("n", [1, 5, 12, 13, 31])  # blocks of 4 or 6: multiples, not, and shorter than a block
@pytest.mark.parametrize("block_size", [1, 4, 6, 50])
def test_equals_dense_block_diagonal_reference_in_float64(n, block_size):
    """The algorithm on float64 inputs (``attend``, which the dtype check of ``forward`` would refuse) to 1e-6,
    and the float32 forward to float32 accuracy."""
    attn = build(n, block_size=block_size)
    q, k, v = random_qkv(4, n, dtype=torch.float64)
    allowed = same_block(n, block_size)
    for mask in (ragged_mask(n, row3="last"), None):
        expected = softmax_reference(q, k, v, mask, allowed)
        torch.testing.assert_close(attend64(attn, q, k, v, mask), expected, rtol=0, atol=1e-6)
        torch.testing.assert_close(attn(q.float(), k.float(), v.float(), mask).double(), expected, rtol=1e-5, atol=1e-6)


def test_value_dim_may_differ_from_the_query_dim():
    n, value_dim = 23, 2 * HEAD_DIM
    attn = build(n, block_size=5)
    q, k, _ = random_qkv(4, n)
    v = random_values(4, n, value_dim, seed=2)
    mask = ragged_mask(n, row3="last")
    expected = softmax_reference(q, k, v, mask, same_block(n, 5))
    torch.testing.assert_close(attn(q, k, v, mask).double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [12, 14])  # a multiple of the block and a padded tail
def test_a_query_depends_only_on_the_keys_of_its_own_block(n):
    """Perturbing key/value j changes output row i exactly when i and j share a block of 4."""
    attn = build(n, block_size=4)
    q, k, v = random_qkv(1, n)
    assert torch.equal(influence(attn, q, k, v), same_block(n, 4))


def test_keys_outside_the_block_may_change_arbitrarily():
    """Every key and value outside block 1 (positions 8..15) replaced by large noise: rows 8..15 are bit-identical."""
    n, block_size = 30, 8
    attn = build(n, block_size=block_size)
    q, k, v = random_qkv(2, n)
    noise_k, noise_v, _ = random_qkv(2, n, seed=3)
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
    q, k, v = random_qkv(4, 40)
    mask = ragged_mask(40, row3="last")
    softmax = build_attention("softmax", 40)
    torch.testing.assert_close(build(40)(q, k, v, mask), softmax(q, k, v, mask), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("softmax_backend", ["math", "nan-for-an-empty-row"])
def test_no_row_of_the_block_mask_is_empty_so_no_backend_gives_nan(monkeypatch, softmax_backend):
    """A block whose keys are all padded (or past the end) still lets each position see its own key: some SDPA
    backends (a GPU's, the dense reference below) give NaN for a row with no key, and NaN in a padded row's forward
    poisons every gradient of the batch even after the row is zeroed. PyTorch's CPU SDPA gives zeros for such a row,
    so the test also runs on a dense softmax that, like those backends, does not."""
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def dense(q, k, v, attn_mask=None, dropout_p=0.0):
        scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        return scores.softmax(-1) @ v

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa if softmax_backend == "math" else dense)
    attn = build_attention("local", 20, block_size=4)
    q, k, v = (t.requires_grad_() for t in random_qkv(2, 18))
    mask = torch.ones(2, 18, dtype=torch.bool)
    mask[1, 6:] = False  # blocks 2-4 of the second sequence hold no real key
    out = attn(q, k, v, mask)
    assert torch.isfinite(out).all() and (out[1, :, 6:] == 0).all()
    (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(2))).sum().backward()
    for tensor in (q, k, v):
        assert torch.isfinite(tensor.grad).all(), "no NaN from an empty row reaches a gradient"
        assert (tensor.grad[1, :, 6:] == 0).all()


def test_the_default_is_the_lra_text_tasks_block_of_50():
    assert attention_zoo.make_config("local").block_size == 50
    n = 120  # blocks 0..49, 50..99 and a padded 100..119
    q, k, v = random_qkv(1, n)
    expected = softmax_reference(q, k, v, None, same_block(n, 50))
    torch.testing.assert_close(build(n)(q, k, v).double(), expected, rtol=1e-5, atol=1e-6)


def test_dropout_only_in_training():
    q, k, v = random_qkv(1, 20)
    attn = build(20, block_size=4, dropout=0.5)
    expected = softmax_reference(q, k, v, None, same_block(20, 4))
    torch.testing.assert_close(attn.eval()(q, k, v).double(), expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(attn.train()(q, k, v).double(), expected, atol=1e-3)


@pytest.mark.parametrize(
    "hparams, message",
    [({"block_size": 0}, "block_size"), ({"block_size": -3}, "block_size"), ({"dropout": 1.0}, "dropout")],
)
def test_bad_hyperparameters_name_the_problem(hparams, message):
    with pytest.raises(ValueError, match=message):
        build(8, **hparams)
