"""Sinkhorn attention against dense float64 references: the balancing itself, and the attention given its matrix."""

import pytest
import torch
from zoo_inputs import HEAD_DIM, HEADS, attend64, builder, ragged_mask, random_qkv, same_block, softmax_reference

build = builder("sinkhorn")


def padded_blocks(x, mask, block):
    """(b, h, n, e) -> (b, h, N, e) zero-padded to whole blocks with masked rows zeroed, and the (b, N) mask."""
    n = x.shape[2]
    total = -(-n // block) * block
    real = torch.zeros(x.shape[0], total, dtype=torch.bool)
    real[:, :n] = True if mask is None else mask
    out = torch.zeros(*x.shape[:2], total, x.shape[3], dtype=x.dtype)
    out[:, :, :n] = x
    return out * real[:, None, :, None], real


def plain_sinkhorn(attn, k, mask):
    """Steps 2-4 written out: block sums of real keys, the linear sort net, exp, then alternate row/column division."""
    block = attn.config.block_size
    k, real = padded_blocks(k, mask, block)
    num_blocks = k.shape[2] // block
    embedding = torch.stack([k[:, :, i * block : (i + 1) * block].sum(2) for i in range(num_blocks)], dim=2)  # (b, h, c, d)
    weight = attn.sort_net.weight[:num_blocks].detach().double()  # (c, d)
    alpha = torch.exp(embedding @ weight.T / attn.config.temperature)  # (b, h, c, c)
    block_real = real.view(real.shape[0], num_blocks, block).any(-1)  # (b, c)
    alpha = alpha * (block_real[:, None, :, None] == block_real[:, None, None, :])
    for _ in range(attn.config.sinkhorn_iterations):
        alpha = alpha / alpha.sum(-1, keepdim=True)
        alpha = alpha / alpha.sum(-2, keepdim=True)
    return alpha


def dense_reference(p, q, k, v, mask, block):
    """The attention from the paper's equations on dense (N, N) matrices, for a given sorting matrix p.

    The sorting operator is P (x) I_B; a query sees its own block's real keys in one softmax and the
    sorted keys of its block that some real key reaches in another, and the two outputs are added.
    """
    n = q.shape[2]
    q, _ = padded_blocks(q, None, block)
    k, real = padded_blocks(k, mask, block)
    v, _ = padded_blocks(v, mask, block)
    sort = torch.kron(p, torch.eye(block, dtype=p.dtype))  # (b, h, N, N)
    sorted_k, sorted_v = sort @ k, sort @ v
    sorted_real = (sort @ real[:, None, :, None].double()).squeeze(-1) > 0  # (b, h, N)
    local = same_block(k.shape[2], block)  # (N, N)
    out = softmax_reference(q, k, v, allowed=local & real[:, None, None, :])
    out = out + softmax_reference(q, sorted_k, sorted_v, allowed=local & sorted_real[:, :, None, :])
    out = out[:, :, :n]
    return out if mask is None else out * mask[:, None, :, None]


CASES = [(1, 4, 1), (7, 4, 1), (16, 4, 3), (37, 4, 1), (37, 4, 5), (50, 16, 2), (23, 100, 1)]  # (n, block, iterations)


@pytest.mark.parametrize(("n", "block", "iterations"), CASES)
def test_the_sorting_matrix_is_plain_sinkhorn_over_the_sort_net_scores(n, block, iterations):
    attn = build(n, block_size=block, sinkhorn_iterations=iterations, temperature=0.75)
    _, k, _ = random_qkv(4, n, dtype=torch.float64, qk_scale=0.3)
    for mask in (ragged_mask(n, row3=max(2 * n // 5, 1)), None):
        torch.testing.assert_close(
            attn.sorting_matrix(*attn.key_blocks(k, mask)), plain_sinkhorn(attn, k, mask), rtol=1e-10, atol=1e-12
        )


@pytest.mark.parametrize(("n", "block", "iterations"), CASES)
def test_equals_the_dense_equations_for_its_sorting_matrix_in_float64(n, block, iterations):
    attn = build(n, block_size=block, sinkhorn_iterations=iterations)
    q, k, v = random_qkv(4, n, dtype=torch.float64, value_dim=2 * HEAD_DIM)
    for mask in (ragged_mask(n, row3=max(2 * n // 5, 1)), None):
        p = attn.sorting_matrix(*attn.key_blocks(k, mask))
        expected = dense_reference(p, q, k, v, mask, block)
        torch.testing.assert_close(attend64(attn, q, k, v, mask), expected, rtol=1e-6, atol=1e-6)
        # forward() in float32 balances its own float32 matrix: close, not identical.
        torch.testing.assert_close(attn(q.float(), k.float(), v.float(), mask).double(), expected, rtol=1e-4, atol=1e-4)


def test_the_sorting_matrix_is_doubly_stochastic_over_the_real_blocks():
    n, block = 90, 6
    _, k, _ = random_qkv(4, n, dtype=torch.float64, qk_scale=0.2)
    mask = ragged_mask(n, row3=max(2 * n // 5, 1))
    blocks = n // block
    block_real = mask.view(4, blocks, block).any(-1)  # (b, c)
    torch.manual_seed(0)
    attn = build(n, block_size=block, sinkhorn_iterations=1)
    one = attn.sorting_matrix(*attn.key_blocks(k, mask))
    torch.manual_seed(0)  # the same sort net
    attn = build(n, block_size=block, sinkhorn_iterations=200)
    many = attn.sorting_matrix(*attn.key_blocks(k, mask))
    for p in (one, many):
        assert (p >= 0).all()
        cross = block_real[:, None, :, None] != block_real[:, None, None, :]
        assert (p[cross.expand_as(p)] == 0).all(), "real and padded blocks never mix"
        # Columns are normalised last, so they sum to one after every iteration.
        torch.testing.assert_close(p.sum(-2), torch.ones_like(p.sum(-2)), rtol=0, atol=1e-12)
    assert (one.sum(-1) - 1).abs().max() > 1e-3, "one iteration leaves the rows unbalanced"
    torch.testing.assert_close(many.sum(-1), torch.ones_like(many.sum(-1)), rtol=0, atol=1e-6)


def test_an_identity_sorting_matrix_gives_twice_the_local_block_attention(monkeypatch):
    """With P = I every block is sorted onto itself: both halves are the block-local softmax attention."""
    n, block = 30, 5
    attn = build(n, block_size=block)
    q, k, v = random_qkv(4, n, dtype=torch.float64)
    mask = ragged_mask(n, row3=max(2 * n // 5, 1))
    monkeypatch.setattr(
        attn, "sorting_matrix", lambda k, mask: torch.eye(n // block, dtype=torch.float64).expand(4, HEADS, -1, -1)
    )
    local = softmax_reference(q, k, v, mask, same_block(n, block))
    torch.testing.assert_close(attend64(attn, q, k, v, mask), 2 * local, rtol=1e-10, atol=1e-10)


def test_an_input_longer_than_seq_len_is_rejected():
    attn = build(64, block_size=4)
    q = torch.randn(1, HEADS, 65, HEAD_DIM)
    with pytest.raises(ValueError, match="seq_len=64"):
        attn(q, q, q)
