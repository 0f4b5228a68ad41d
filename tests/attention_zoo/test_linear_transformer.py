"""Linear Transformer against the paper's sum formula written out pairwise in float64, and its invariants."""

import pytest
import torch
from zoo_inputs import HEAD_DIM, HEADS, attend64, builder, forward_backward_allocation, ragged_mask, random_qkv

EPS = 1e-6

build = builder("linear_transformer")


def phi(x):
    """elu(x) + 1, written out: x + 1 for x > 0, exp(x) otherwise."""
    return torch.where(x > 0, x + 1, torch.exp(x))


def pairwise_reference(q, k, v, mask, eps=EPS):
    """out_i = sum_j phi(q_i).phi(k_j) v_j / (sum_j phi(q_i).phi(k_j) + eps) over the real keys j, in float64.

    The quadratic form of equation 5 of the paper: every (i, j) similarity explicitly, summed in a loop
    over keys; padded query rows are zero.
    """
    q, k, v = q.double(), k.double(), v.double()
    real = torch.ones(q.shape[0], q.shape[2], dtype=torch.bool) if mask is None else mask  # (b, n)
    numerator = torch.zeros(*q.shape[:3], v.shape[-1], dtype=torch.float64)  # (b, h, n, dv)
    normaliser = torch.zeros(*q.shape[:3], 1, dtype=torch.float64)  # (b, h, n, 1)
    for j in range(k.shape[2]):
        similarity = (phi(q) * phi(k[:, :, j : j + 1])).sum(-1, keepdim=True)  # (b, h, n, 1): phi(q_i).phi(k_j)
        similarity = similarity * real[:, None, None, j : j + 1]  # a padded key contributes nothing
        numerator += similarity * v[:, :, j : j + 1]
        normaliser += similarity
    return numerator / (normaliser + eps) * real[:, None, :, None]


@pytest.mark.parametrize("n", [1, 6, 33])
def test_equals_the_pairwise_sum_formula_in_float64(n):
    """The algorithm on float64 inputs (``attend``, which the dtype check of ``forward`` would refuse) to 1e-6,
    and the float32 forward to float32 accuracy."""
    attn = build(n)
    q, k, v = random_qkv(4, n, dtype=torch.float64)
    for mask in (ragged_mask(n), None):
        expected = pairwise_reference(q, k, v, mask)
        torch.testing.assert_close(attend64(attn, q, k, v, mask), expected, rtol=0, atol=1e-6)
        torch.testing.assert_close(attn(q.float(), k.float(), v.float(), mask).double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("masked", [True, False])
def test_the_written_out_backward_equals_autograd_through_the_pairwise_formula(masked):
    """The attention's own backward: the gradients of q, k and v equal autograd's through the pairwise sum formula
    in float64 (padded keys and values get none), and finite differences confirm them (gradcheck)."""
    n = 9
    attn = build(n)
    q, k, v = (t.requires_grad_() for t in random_qkv(4, n, dtype=torch.float64, value_dim=5))
    mask = ragged_mask(n, row3=4) if masked else None
    grad = torch.randn(4, 2, n, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    ours = torch.autograd.grad(attend64(attn, q, k, v, mask), (q, k, v), grad)
    expected = torch.autograd.grad(pairwise_reference(q, k, v, mask), (q, k, v), grad)
    for got, want in zip(ours, expected):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    if masked:
        padded = ~mask[:, None, :, None]
        assert (ours[1] * padded == 0).all() and (ours[2] * padded == 0).all(), "padded keys and values get no gradient"
    small = tuple(t.detach()[:, :1, :5, :3].clone().requires_grad_() for t in (q, k, v))
    small_mask = None if mask is None else mask[:, :5]
    assert torch.autograd.gradcheck(lambda *qkv: attend64(attn, *qkv, small_mask), small)


def test_value_dim_may_differ_and_eps_is_the_configured_one():
    n = 21
    q, k, v = random_qkv(4, n, value_dim=3 * HEAD_DIM)
    mask = ragged_mask(n)
    for eps in (1e-6, 0.5):
        expected = pairwise_reference(q, k, v, mask, eps=eps)
        torch.testing.assert_close(build(n, eps=eps)(q, k, v, mask).double(), expected, rtol=1e-5, atol=1e-6)


def test_output_is_invariant_to_the_order_of_the_keys_and_values():
    """Keys, values and their mask permuted together: the same output (a sum over keys has no order)."""
    n = 40
    attn = build(n)
    q, k, v = random_qkv(4, n)
    mask = ragged_mask(n)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(7))
    out = attn(q, k, v, mask)
    # The query rows stay in place; only keys move, so the mask is reapplied to the rows afterwards.
    permuted = attn.attend(q, k[:, :, order], v[:, :, order], mask[:, order]) * mask[:, None, :, None]
    torch.testing.assert_close(permuted, out, rtol=1e-5, atol=1e-6)


def test_rows_of_the_implied_attention_matrix_sum_to_one():
    """With the identity as values (value_dim = n), the output is the attention matrix A itself: every entry is
    non-negative, padded keys get zero weight, and each real row sums to S / (S + eps), 1 to within 1e-6."""
    n = 24
    attn = build(n)
    q, k, _ = random_qkv(4, n, dtype=torch.float64)
    identity = torch.eye(n, dtype=torch.float64).expand(4, HEADS, n, n)  # v_j = e_j
    mask = ragged_mask(n)
    matrix = attn.attend(q, k, identity, mask)  # (b, h, n, n): row i is A_i., for padded queries too
    assert (matrix >= 0).all()
    assert (matrix * ~mask[:, None, None, :] == 0).all(), "padded keys must get zero weight"
    row_sums = matrix.sum(-1)  # (b, h, n)
    has_keys = mask.any(dim=1)  # (b,)
    torch.testing.assert_close(row_sums[has_keys], torch.ones_like(row_sums[has_keys]), rtol=0, atol=1e-6)
    assert (row_sums[~has_keys] == 0).all(), "a sequence without a real key gets zero weights, not NaN"
    # The same sums through forward: values all 1 come out as 1 on every real query.
    ones = torch.ones(4, HEADS, n, 3)
    out = attn(q.float(), k.float(), ones, mask)
    expected = mask[:, None, :, None].expand_as(out).float()
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)


def test_memory_is_linear_no_n_by_n_tensor():
    """At n = 4096 the largest tensor, forward and backward, is an (n, d) one per head, far from n x n."""
    n = 4096
    attn = build(n).train()
    q, k, v = (t.requires_grad_() for t in random_qkv(1, n))
    largest, _ = forward_backward_allocation(attn, q, k, v, torch.ones(1, n, dtype=torch.bool))
    assert largest == HEADS * n * HEAD_DIM


@pytest.mark.parametrize("eps", [0.0, -1e-6])
def test_a_non_positive_eps_is_refused(eps):
    with pytest.raises(ValueError, match="eps"):
        build(8, eps=eps)
