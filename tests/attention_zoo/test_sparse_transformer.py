"""Sparse Transformer (fixed pattern) against a dense float64 attention over the pattern's (i, j) pairs."""

import pytest
import torch
from zoo_inputs import (
    HEAD_DIM,
    HEADS,
    attend64,
    build_attention,
    builder,
    forward_backward_allocation,
    influence,
    ragged_mask,
    random_qkv,
    random_values,
    softmax_reference,
)

import attention_zoo

build = builder("sparse_transformer")


def allowed_pairs(n, block, c, causal=False):
    """(n, n) bool from the paper's definition: A1 (same block) or A2 (j mod l in {l - c, ..., l} with l read as 0)."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    same_block = i // block == j // block
    summary = (j % block == 0) | (j % block >= block - c)
    allowed = same_block | summary
    return allowed & (j <= i) if causal else allowed


@pytest.mark.parametrize("n", [1, 9, 24, 37])  # a part block, whole blocks and not
@pytest.mark.parametrize("block, c", [(4, 1), (8, 3), (5, 0), (6, 6)])
@pytest.mark.parametrize("causal", [False, True])
def test_float64_equals_dense_attention_over_the_pattern(n, block, c, causal):
    """The algorithm run in float64 (``attend`` directly: ``forward`` takes the harness's dtypes only)."""
    attn = build(n, block_size=block, num_summary=c, causal=causal)
    q, k, v = random_qkv(4, n, dtype=torch.float64)
    mask = ragged_mask(n, row3="last")
    allowed = allowed_pairs(n, block, c, causal)
    for m in (mask, None):
        torch.testing.assert_close(attend64(attn, q, k, v, m), softmax_reference(q, k, v, m, allowed), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
def test_float32_forward_equals_the_reference_with_a_wider_value_dim(causal):
    n, block, c, value_dim = 53, 8, 2, 2 * HEAD_DIM
    attn = build(n, block_size=block, num_summary=c, causal=causal)
    q, k, _ = random_qkv(4, n)
    v = random_values(4, n, value_dim, seed=2)
    mask = ragged_mask(n, row3="last")
    expected = softmax_reference(q, k, v, mask, allowed_pairs(n, block, c, causal))
    torch.testing.assert_close(attn(q, k, v, mask).double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
def test_a_query_depends_on_exactly_the_keys_of_its_pattern(causal):
    """Perturbing key/value j changes output row i exactly when (i, j) is in A1 u A2."""
    n, block, c = 23, 5, 2
    attn = build(n, block_size=block, num_summary=c, causal=causal)
    q, k, v = random_qkv(1, n)
    assert torch.equal(influence(attn, q, k, v), allowed_pairs(n, block, c, causal))


def test_a_block_covering_the_sequence_is_softmax():
    q, k, v = random_qkv(4, 30)
    mask = ragged_mask(30, row3="last")
    softmax = build_attention("softmax", 30)
    out = build(30, block_size=32, num_summary=0)(q, k, v, mask)
    torch.testing.assert_close(out, softmax(q, k, v, mask), rtol=1e-5, atol=1e-6)


def test_the_lra_presets():
    assert attention_zoo.make_config("sparse_transformer_lra") == attention_zoo.make_config(
        "sparse_transformer", block_size=50, num_summary=10, causal=False, dropout=0.1
    )
    assert attention_zoo.make_config("sparse_transformer_lra_causal").causal
    attn = build_attention("sparse_transformer_lra", 120)
    assert attn.summary_offsets() == [0, *range(40, 50)]
    q, k, v = random_qkv(4, 120)
    mask = ragged_mask(120, row3="last")
    expected = softmax_reference(q, k, v, mask, allowed_pairs(120, 50, 10))
    torch.testing.assert_close(attn(q, k, v, mask).double(), expected, rtol=1e-5, atol=1e-6)


def test_largest_tensor_is_the_block_and_summary_scores():
    """Forward and backward, nothing is bigger than the n * (l + m * r) scores per head, far below n x n."""
    n, block, c = 1000, 50, 10
    attn = build(n, block_size=block, num_summary=c).train()
    q, k, v = (t.requires_grad_() for t in random_qkv(1, n))
    largest, _ = forward_backward_allocation(attn, q, k, v)
    assert largest == HEADS * n * (block + (n // block) * (c + 1)) < n * n * HEADS / 3


def test_dropout_only_in_training():
    q, k, v = random_qkv(1, 20)
    attn = build(20, block_size=4, num_summary=1, dropout=0.5)
    expected = softmax_reference(q, k, v, None, allowed_pairs(20, 4, 1))
    torch.testing.assert_close(attn.eval()(q, k, v).double(), expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(attn.train()(q, k, v).double(), expected, atol=1e-3)


@pytest.mark.parametrize(
    "hparams, message",
    [
        ({"block_size": 0}, "block_size"),
        ({"block_size": 4, "num_summary": 5}, "num_summary"),
        ({"num_summary": -1}, "num_summary"),
        ({"dropout": 1.0}, "dropout"),
    ],
)
def test_bad_hyperparameters_name_the_problem(hparams, message):
    with pytest.raises(ValueError, match=message):
        build(8, **hparams)
