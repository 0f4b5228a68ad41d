"""Sparse Transformer (fixed pattern) against a dense float64 attention over the pattern's (i, j) pairs."""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import attention_zoo

HEADS, HEAD_DIM = 2, 8


def build(seq_len, **hparams):
    return attention_zoo.build("sparse_transformer", seq_len=seq_len, num_heads=HEADS, head_dim=HEAD_DIM, **hparams).eval()


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


def allowed_pairs(n, block, c, causal=False):
    """(n, n) bool from the paper's definition: A1 (same block) or A2 (j mod l in {l - c, ..., l} with l read as 0)."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    same_block = i // block == j // block
    summary = (j % block == 0) | (j % block >= block - c)
    allowed = same_block | summary
    return allowed & (j <= i) if causal else allowed


def dense_reference(q, k, v, mask, allowed):
    """Masked softmax attention in float64 over an explicit (n, n) pattern; padded query rows are zero."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (b, h, n, n)
    keep = allowed[None, None] if mask is None else allowed[None, None] & mask[:, None, None, :]
    out = torch.nan_to_num(scores.masked_fill(~keep, float("-inf")).softmax(-1)) @ v
    return out if mask is None else out * mask[:, None, :, None]


@pytest.mark.parametrize("n", [1, 9, 24, 37])  # a part block, whole blocks and not
@pytest.mark.parametrize("block, c", [(4, 1), (8, 3), (5, 0), (6, 6)])
@pytest.mark.parametrize("causal", [False, True])
def test_float64_equals_dense_attention_over_the_pattern(n, block, c, causal):
    """The algorithm run in float64 (``attend`` directly: ``forward`` takes the harness's dtypes only)."""
    attn = build(n, block_size=block, num_summary=c, causal=causal)
    q, k, v = inputs(4, n, dtype=torch.float64)
    mask = ragged_mask(n)
    allowed = allowed_pairs(n, block, c, causal)
    for m in (mask, None):
        out = attn.attend(q, k, v, m)
        out = out if m is None else out * m[:, None, :, None]
        torch.testing.assert_close(out, dense_reference(q, k, v, m, allowed), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
def test_float32_forward_equals_the_reference_with_a_wider_value_dim(causal):
    n, block, c, value_dim = 53, 8, 2, 2 * HEAD_DIM
    attn = build(n, block_size=block, num_summary=c, causal=causal)
    q, k, _ = inputs(4, n)
    v = torch.randn(4, HEADS, n, value_dim, generator=torch.Generator().manual_seed(2))
    mask = ragged_mask(n)
    expected = dense_reference(q, k, v, mask, allowed_pairs(n, block, c, causal))
    torch.testing.assert_close(attn(q, k, v, mask).double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
def test_a_query_depends_on_exactly_the_keys_of_its_pattern(causal):
    """Perturbing key/value j changes output row i exactly when (i, j) is in A1 u A2."""
    n, block, c = 23, 5, 2
    attn = build(n, block_size=block, num_summary=c, causal=causal)
    q, k, v = inputs(1, n)
    reference = attn(q, k, v)
    influence = torch.zeros(n, n, dtype=torch.bool)
    for j in range(n):
        k2, v2 = k.clone(), v.clone()
        k2[:, :, j] += 10.0
        v2[:, :, j] += 10.0
        influence[:, j] = (attn(q, k2, v2) != reference).any(dim=-1).any(dim=1)[0]  # over heads and features
    assert torch.equal(influence, allowed_pairs(n, block, c, causal))


def test_a_block_covering_the_sequence_is_softmax():
    q, k, v = inputs(4, 30)
    mask = ragged_mask(30)
    softmax = attention_zoo.build("softmax", seq_len=30, num_heads=HEADS, head_dim=HEAD_DIM).eval()
    out = build(30, block_size=32, num_summary=0)(q, k, v, mask)
    torch.testing.assert_close(out, softmax(q, k, v, mask), rtol=1e-5, atol=1e-6)


def test_the_lra_presets():
    assert attention_zoo.make_config("sparse_transformer_lra") == attention_zoo.make_config(
        "sparse_transformer", block_size=50, num_summary=10, causal=False, dropout=0.1
    )
    assert attention_zoo.make_config("sparse_transformer_lra_causal").causal
    attn = attention_zoo.build("sparse_transformer_lra", seq_len=120, num_heads=HEADS, head_dim=HEAD_DIM).eval()
    assert attn.summary_offsets() == [0, *range(40, 50)]
    q, k, v = inputs(4, 120)
    mask = ragged_mask(120)
    expected = dense_reference(q, k, v, mask, allowed_pairs(120, 50, 10))
    torch.testing.assert_close(attn(q, k, v, mask).double(), expected, rtol=1e-5, atol=1e-6)


class LargestAllocation(TorchDispatchMode):
    """Records the largest storage (in elements) returned by any operator, forward and backward."""

    largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                self.largest = max(self.largest, tensor.untyped_storage().nbytes() // tensor.element_size())
        return out


def test_largest_tensor_is_the_block_and_summary_scores():
    """Forward and backward, nothing is bigger than the n * (l + m * r) scores per head, far below n x n."""
    n, block, c = 1000, 50, 10
    attn = build(n, block_size=block, num_summary=c).train()
    q, k, v = (t.requires_grad_() for t in inputs(1, n))
    with LargestAllocation() as record:
        attn(q, k, v).square().sum().backward()
    assert record.largest == HEADS * n * (block + (n // block) * (c + 1)) < n * n * HEADS / 3


def test_dropout_only_in_training():
    q, k, v = inputs(1, 20)
    attn = build(20, block_size=4, num_summary=1, dropout=0.5)
    expected = dense_reference(q, k, v, None, allowed_pairs(20, 4, 1))
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
