"""The fused CPU softmax-dropout attention against its dense reference: values, gradients, mask, opcheck; with every
key and with a band (Longformer's window and global tokens)."""

import math

import pytest
import torch
import torch.nn.functional as F

import attention_zoo
from yoso_cuda import ops, reference
from yoso_cuda.softmax import SEED_RANGE

KERNELS = ops.kernels()
pytestmark = pytest.mark.skipif(not KERNELS.cpu.loaded, reason=f"CPU kernels not built: {KERNELS.cpu.reason}")
fused = torch.ops.yoso.softmax_dropout_attention


def inputs(batch, heads, length, dim, value_dim, masked, seed):
    generator = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(batch, heads, length, dim, generator=generator, dtype=torch.float64) for _ in range(2))
    v = torch.randn(batch, heads, length, value_dim, generator=generator, dtype=torch.float64)
    mask = None
    if masked in ("right", "right, loss everywhere"):  # sequences of lengths 1 to n padded at the end, as LRA pads them
        lengths = torch.randint(1, length + 1, (batch,), generator=generator)
        lengths[0] = 1 + length // 3  # a row whose last real key is not at the end of a vector of 8 keys
        mask = torch.arange(length) < lengths[:, None]
    elif masked:
        mask = torch.rand(batch, length, generator=generator) < 0.6
        mask[:, -1] = True  # every sequence has a real key (the attention's caller guarantees it)
        mask[0, : length // 2] = False  # a long run of padding at the start
    return q, k, v, mask


def band(length, radius, num_global):
    """(n, n) bool: query i sees key j (every key for a radius of -1), written here apart from the reference's."""
    i, j = torch.arange(length)[:, None], torch.arange(length)
    if radius < 0:
        return torch.ones(length, length, dtype=torch.bool)
    return ((i - j).abs() <= radius) | (i < num_global) | (j < num_global)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "batch, heads, length, dim, value_dim, masked, dropout, radius, num_global",
    [
        (2, 2, 37, 16, 16, False, 0.0, -1, 0),
        (2, 3, 100, 32, 20, True, 0.1, -1, 0),
        (1, 2, 257, 33, 64, True, 0.3, -1, 0),  # several query blocks, a ragged one, d and c not multiples of 8
        (3, 1, 8, 5, 3, False, 0.5, -1, 0),
        (1, 1, 1, 4, 4, False, 0.2, -1, 0),
        # A band: blocks of 64 queries that see the global keys and their band apart (two spans of keys) or together,
        # queries in the padding at the start that see no real key (zero rows), global rows across a block's edge.
        (2, 2, 257, 33, 20, True, 0.3, 40, 1),
        (1, 3, 200, 16, 16, True, 0.1, 1, 0),
        (2, 2, 300, 8, 12, False, 0.2, 100, 70),
        (1, 2, 150, 16, 16, True, 0.0, 149, 2),
        # Right padding: neither the keys nor the queries after the last real key are scored (those queries' rows are
        # zero), nor in the backward the queries whose output gradient is zero as in a model; with a band, blocks whose
        # band lies wholly in the padding. With a loss on every row, the zero rows still pass no gradient back.
        (3, 2, 203, 16, 12, "right", 0.1, -1, 0),
        (3, 2, 203, 16, 12, "right", 0.2, 30, 2),
        (3, 2, 203, 16, 12, "right, loss everywhere", 0.1, -1, 0),
    ],
)
def test_values_and_gradients_equal_the_dense_reference(
    batch, heads, length, dim, value_dim, masked, dropout, radius, num_global, seed
):
    q, k, v, mask = inputs(batch, heads, length, dim, value_dim, masked, seed)
    mask_seed = 12345678901234567 + seed
    q32, k32, v32 = (x.float().requires_grad_() for x in (q, k, v))
    out, lse = fused(q32, k32, v32, mask, dropout, torch.tensor([mask_seed]), radius, num_global)
    q64, k64, v64 = (x.clone().requires_grad_() for x in (q, k, v))
    expected = reference.softmax_dropout_attention(q64, k64, v64, mask, dropout, mask_seed, radius, num_global)
    grad = torch.randn(expected.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    if masked == "right":
        grad = grad * mask[:, None, :, None]  # the padded positions reach no loss
    out.backward(grad.float())
    expected.backward(grad)
    scale = 1 / math.sqrt(dim)
    seen = band(length, radius, num_global) & (torch.ones((), dtype=torch.bool) if mask is None else mask[:, None, None, :])
    if mask is not None:  # the queries after the last real key see nothing: their rows are zero
        last_real = torch.tensor([row.nonzero().max().item() if row.any() else -1 for row in mask])  # (b,)
        seen = seen & (torch.arange(length)[:, None] <= last_real[:, None, None, None])
    scores = (q @ k.transpose(-1, -2) * scale).masked_fill(~seen, float("-inf"))
    torch.testing.assert_close(lse.double(), scores.logsumexp(dim=-1), rtol=1e-5, atol=1e-5)
    if masked in ("right", "right, loss everywhere"):
        assert (out[~seen.any(dim=-1).expand(-1, heads, -1)] == 0).all()
    if 0 <= radius < length // 4 and masked is True:
        assert (~seen.any(dim=-1)).any(), "some queries in the padding at the start see no real key: zero rows"
    for ours, theirs in ((out, expected), (q32.grad, q64.grad), (k32.grad, k64.grad), (v32.grad, v64.grad)):
        torch.testing.assert_close(ours.double(), theirs.detach(), rtol=1e-5, atol=1e-6 + 2e-5 * theirs.abs().max().item())


@pytest.mark.parametrize("radius, num_global", [(-1, 0), (50, 2)])
def test_the_kernel_drops_exactly_the_pairs_of_the_reference_mask(radius, num_global):
    """With one-hot values the output is the dropped-out probability matrix itself: zero exactly where dropped, and
    with a band, outside it."""
    length, dropout = 300, 0.25
    q, k = (torch.randn(2, 2, length, 8) for _ in range(2))
    eye = torch.eye(length).expand(2, 2, length, length).contiguous()  # (b, h, n, c = n)
    out, _ = fused(q, k, eye, None, dropout, torch.tensor([987654321]), radius, num_global)
    seen = band(length, radius, num_global)
    keep = reference.dropout_keep(987654321, 2, 2, length, dropout)
    assert torch.equal(out != 0, keep & seen)
    probabilities = torch.softmax((q @ k.transpose(-1, -2) / math.sqrt(8)).masked_fill(~seen, float("-inf")), dim=-1)
    torch.testing.assert_close(out, probabilities * keep / (1 - dropout), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dropout", [0.1, 0.5])
def test_the_mask_keeps_each_pair_with_probability_one_minus_p_independently(dropout):
    keep = reference.dropout_keep(2024, 4, 2, 512, dropout).double()  # (4, 2, 512, 512): 2M pairs
    count = keep.numel()
    sigma = math.sqrt(dropout * (1 - dropout) / count)
    assert abs(keep.mean().item() - (1 - dropout)) < 5 * sigma
    # Neighbouring queries, keys and head rows are uncorrelated (correlation within 5 sigma of 0).
    centred = keep - keep.mean()
    for a, b in ((centred[..., 1:, :], centred[..., :-1, :]), (centred[..., 1:], centred[..., :-1]), (centred[1:], centred[:-1])):
        correlation = (a * b).mean() / centred.var()
        assert abs(correlation.item()) < 5 / math.sqrt(a.numel())
    other_seed = reference.dropout_keep(2025, 4, 2, 512, dropout).double()
    assert abs(((other_seed - other_seed.mean()) * centred).mean() / centred.var()) < 5 / math.sqrt(count)


@pytest.mark.parametrize("radius, num_global", [(-1, 0), (10, 1)])
def test_huge_scores_keep_every_gradient_finite(radius, num_global):
    """Scores of 1e12 and more (weights after a diverging step): the backward's exponent, s / sqrt(d) - lse, rounds
    above 0 there, and exp of it overflowed into inf and NaN gradients where SDPA's stay finite."""
    for magnitude in (1e6, 1e10, 1e18):
        q, k, v, mask = (
            x if x.dtype == torch.bool else (x.float() * magnitude).requires_grad_()
            for x in inputs(2, 2, 64, 32, 32, True, seed=8)
        )
        out, _ = fused(q, k, v, mask, 0.1, torch.tensor([9]), radius, num_global)
        out.sum().backward()
        assert out.isfinite().all() and all(x.grad.isfinite().all() for x in (q, k, v)), magnitude


def test_without_dropout_it_equals_sdpa():
    q, k, v, mask = inputs(2, 2, 200, 32, 32, True, seed=3)
    q, k, v = q.float(), k.float(), v.float()
    out, _ = fused(q, k, v, mask, 0.0, torch.tensor([1]))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :]))


@pytest.mark.parametrize("radius, num_global", [(-1, 0), (20, 1)])
def test_the_thread_count_changes_no_bit(radius, num_global, assert_thread_count_changes_no_bit):
    q, k, v, mask = (x if x is None or x.dtype == torch.bool else x.float() for x in inputs(2, 3, 150, 16, 16, True, seed=4))
    for x in (q, k, v):
        x.requires_grad_()
    seed = torch.tensor([77])

    def compute():
        out, _ = fused(q, k, v, mask, 0.2, seed, radius, num_global)
        return (out, *torch.autograd.grad(out.square().sum(), (q, k, v)))

    assert_thread_count_changes_no_bit(compute)


def test_opcheck():
    q, k, v, mask = (x if x.dtype == torch.bool else x.float().requires_grad_() for x in inputs(2, 2, 40, 8, 12, True, seed=5))
    torch.library.opcheck(fused, (q, k, v, mask, 0.1, torch.tensor([3])))
    torch.library.opcheck(fused, (q, k, v, None, 0.0, torch.tensor([3])))
    torch.library.opcheck(fused, (q, k, v, mask, 0.1, torch.tensor([3]), 5, 1))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: {**a, "q": a["q"].double()}, "computes in float32"),
        (lambda a: {**a, "k": a["k"][:, :, :5]}, "q and k of one shape"),
        (lambda a: {**a, "key_mask": a["key_mask"][:, :5]}, "key_mask must be bool"),
        (lambda a: {**a, "key_mask": a["key_mask"].float()}, "key_mask must be bool"),
        (lambda a: {**a, "dropout": 1.0}, "dropout must be in"),
        (lambda a: {**a, "seed": torch.tensor([1.0])}, "seed must be one int64"),
        (lambda a: {**a, "radius": -2}, "radius must be >= 0"),
        (lambda a: {**a, "num_global": -1}, "num_global must be >= 0"),
    ],
)
def test_bad_inputs_are_clear_errors(change, message):
    q, k, v, mask = (x if x.dtype == torch.bool else x.float() for x in inputs(1, 1, 10, 4, 4, True, seed=6))
    arguments = dict(q=q, k=k, v=v, key_mask=mask, dropout=0.1, seed=torch.tensor([1]))
    with pytest.raises(ValueError, match=message):
        fused(**change(arguments))


def test_the_softmax_attention_trains_on_the_fused_kernel_with_a_seeded_mask():
    """attention_zoo's softmax in training on a CPU: the fused op, its mask seeded from torch's generator."""
    attn = attention_zoo.build("softmax", seq_len=64, num_heads=2, head_dim=8, dropout=0.1).train()
    q, k, v, mask = (x if x.dtype == torch.bool else x.float() for x in inputs(3, 2, 64, 8, 8, True, seed=7))
    mask[1] = False  # a fully padded sequence: its keys are unmasked, its rows zeroed
    torch.manual_seed(11)
    out = attn(q, k, v, mask)
    torch.manual_seed(11)
    mask_seed = int(torch.randint(SEED_RANGE, (1,), dtype=torch.int64))
    key_mask = mask | ~mask.any(dim=1, keepdim=True)
    expected = reference.softmax_dropout_attention(q.double(), k.double(), v.double(), key_mask, 0.1, mask_seed)
    torch.testing.assert_close(out.double(), expected * mask[:, None, :, None], rtol=1e-5, atol=1e-5)
