"""Reformer LSH attention against dense shared-QK attention and a per-query reference of the algorithm, on both
paths of its chunks: yoso_cuda's fused CPU kernel and the dense one (GPUs)."""

import pytest
import torch
import torch.nn.functional as F

import attention_zoo
import yoso_cuda
from attention_zoo import reformer
from attention_zoo.reformer import angular_lsh, auto_num_buckets


@pytest.fixture(params=["kernel", "dense"])
def chunks_path(request, monkeypatch):
    """The test runs on the fused kernel (where the CPU kernels are built) and on the dense path."""
    if request.param == "dense":
        monkeypatch.setattr(reformer, "has_kernel", lambda device: False)
    elif not yoso_cuda.has_kernel(torch.device("cpu")):
        pytest.skip("YOSO's CPU kernels are not built")


def build(seq_len, heads=2, dim=8, **hparams):
    return attention_zoo.build("reformer", seq_len=seq_len, num_heads=heads, head_dim=dim, **hparams)


def dense_shared_qk_attention(q, k, v, mask):
    """Full attention with scores q_i . k_j / ||k_j||, self-score -1e5, padded keys excluded; float64."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ F.normalize(k, dim=-1).transpose(-1, -2)  # (b, h, n, n)
    n = scores.shape[-1]
    scores = scores.masked_fill(torch.eye(n, dtype=torch.bool), -1e5)
    if mask is not None:
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    out = torch.nan_to_num(scores.softmax(-1)) @ v  # a fully padded row has no softmax: NaN -> 0
    return out if mask is None else out * mask[:, None, :, None]


def naive_lsh_attention(q, k, v, mask, rotations, chunk_length):
    """The algorithm query by query: hash, sort by (bucket, position), chunk, attend to own + previous chunk."""
    batch, heads, n, _ = q.shape
    rounds, num_buckets = rotations.shape[2], 2 * rotations.shape[3]
    padded = -(-n // chunk_length) * chunk_length
    real = torch.zeros(batch, padded, dtype=torch.bool)
    real[:, :n] = True if mask is None else mask
    q, k, v = (F.pad(t.double(), (0, 0, 0, padded - n)) for t in (q, k, v))
    out = torch.zeros_like(v)
    for b in range(batch):
        for h in range(heads):
            slots = []  # (round, position): the rounds' sorted sequences, one after the other
            for r in range(rounds):
                rotated = k[b, h] @ rotations[h, :, r].double()  # (n_pad, num_buckets/2)
                bucket = torch.cat([rotated, -rotated], dim=-1).argmax(-1).masked_fill(~real[b], num_buckets)
                slots += [(r, i) for i in sorted(range(padded), key=lambda i: (bucket[i], i))]
            chunks = [slots[start : start + chunk_length] for start in range(0, len(slots), chunk_length)]
            round_out, round_lse = {}, {}  # (round, query) -> its output and log-sum-exp in that round
            for c, chunk in enumerate(chunks):
                window = chunks[c - 1] + chunk  # chunks[-1] before the first: the look-back is circular
                keys = [j for _, j in window if real[b, j]]
                for r, i in chunk:
                    if not real[b, i]:
                        continue  # a padded query: its row is zeroed
                    scores = torch.stack([q[b, h, i] @ F.normalize(k[b, h, j], dim=0) for j in keys])
                    scores[torch.tensor(keys) == i] = -1e5
                    round_out[r, i], round_lse[r, i] = scores.softmax(0) @ v[b, h, keys], scores.logsumexp(0)
            for i in range(n):
                if real[b, i]:
                    weights = torch.stack([round_lse[r, i] for r in range(rounds)]).softmax(0)
                    out[b, h, i] = sum(weights[r] * round_out[r, i] for r in range(rounds))
    return out[:, :, :n]


@pytest.mark.parametrize("seq_len", [1, 37, 64])
@pytest.mark.parametrize("num_hashes", [1, 2, 3])
def test_one_chunk_equals_dense_shared_qk_attention(seq_len, num_hashes, chunks_path):
    """The exact limit: a chunk covering the sequence puts every token in reach of every other, whatever the buckets."""
    torch.manual_seed(0)
    q, v = torch.randn(4, 2, seq_len, 8), torch.randn(4, 2, seq_len, 8)
    mask = torch.rand(4, seq_len) < 0.7
    mask[0], mask[1], mask[2, 0] = True, False, True
    attn = build(seq_len, num_hashes=num_hashes, chunk_length=64)
    k = torch.randn_like(q)  # untied: queries are q, keys are k / ||k||
    for keys, key_mask in ((q, mask), (q, None), (k, mask)):
        expected = dense_shared_qk_attention(q, keys, v, key_mask)
        torch.testing.assert_close(attn(q, keys, v, key_mask).double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("use_mask", [False, True])
@pytest.mark.parametrize("value_dim", [8, 12], ids=["value-dim-equal", "value-dim-differs"])
def test_equals_per_query_reference_of_the_algorithm(use_mask, value_dim, chunks_path):
    seq_len, chunk_length, num_hashes = 45, 8, 3
    attn = build(seq_len, chunk_length=chunk_length, num_hashes=num_hashes)
    assert attn.num_buckets == 8  # 6 chunks -> 12 -> rounded down to a power of two
    generator = torch.Generator().manual_seed(1)
    q, k = (torch.randn(2, 2, seq_len, 8, generator=generator) for _ in range(2))
    v = torch.randn(2, 2, seq_len, value_dim, generator=generator)
    mask = torch.arange(seq_len) < torch.tensor([[seq_len], [29]]) if use_mask else None
    torch.manual_seed(3)
    out = attn(q, k, v, mask)
    torch.manual_seed(3)  # the module's first draw: one rotation per head and round
    rotations = torch.randn(2, 8, num_hashes, attn.num_buckets // 2)
    expected = naive_lsh_attention(q, k, v, mask, rotations, chunk_length)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6)


def test_angular_lsh_is_a_reproducible_angular_hash():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 50, 8)
    rotations = torch.randn(3, 8, 4, 5)  # 4 rounds, 10 buckets
    buckets = angular_lsh(x, rotations)
    assert buckets.shape == (2, 3, 4, 50) and buckets.min() >= 0 and buckets.max() < 10
    torch.testing.assert_close(angular_lsh(3.5 * x, rotations), buckets, rtol=0, atol=0)  # only the direction counts
    torch.testing.assert_close(angular_lsh(-x, rotations), (buckets + 5) % 10, rtol=0, atol=0)  # -x: the opposite axis
    assert len(buckets.unique()) == 10


def test_hashing_is_reproducible_under_a_seed():
    attn = build(256, chunk_length=16)
    q, v = torch.randn(2, 2, 256, 8), torch.randn(2, 2, 256, 8)
    outputs = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        outputs.append(attn(q, q, v))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0)
    assert not torch.allclose(outputs[0], outputs[2]), "fresh rotations for a new seed must change the buckets"


def test_a_token_attends_to_itself_only_without_another_choice(chunks_path):
    seq_len = 8
    q = 3 * torch.randn(1, 1, seq_len, seq_len)
    v = torch.eye(seq_len).expand(1, 1, seq_len, seq_len)  # output row i = attention weights of query i
    weights = build(seq_len, heads=1, dim=seq_len)(q, q, v)[0, 0]
    torch.testing.assert_close(weights.sum(-1), torch.ones(seq_len))
    assert weights.diagonal().max() < 1e-30, "the self-score must lose to every other real key"
    # Alone among padding, over many chunks and rounds, a token has no other choice.
    q, v = torch.randn(3, 2, 200, 8), torch.randn(3, 2, 200, 8)
    mask = torch.zeros(3, 200, dtype=torch.bool)
    mask[0, 0], mask[1, 101], mask[2, 199] = True, True, True
    out = build(200, chunk_length=16, num_hashes=4)(q, q, v, mask)
    torch.testing.assert_close(out[mask[:, None, :].expand(-1, 2, -1)], v[mask[:, None, :].expand(-1, 2, -1)])


def test_more_rounds_reduce_the_error_against_full_attention():
    errors = []
    for num_hashes in (1, 2, 4, 8):
        attn = build(256, dim=16, chunk_length=32, num_hashes=num_hashes)
        error = 0.0
        for seed in range(3):
            generator = torch.Generator().manual_seed(seed)
            q, v = 2 * torch.randn(2, 2, 256, 16, generator=generator), torch.randn(2, 2, 256, 16, generator=generator)
            torch.manual_seed(seed)
            error += (attn(q, q, v).double() - dense_shared_qk_attention(q, q, v, None)).abs().mean().item()
        errors.append(error)
    assert errors == sorted(errors, reverse=True) and errors[-1] < 0.5 * errors[0], errors


@pytest.mark.parametrize(
    ("seq_len", "chunk_length", "expected"),
    [(1, 64, 2), (50, 64, 2), (128, 64, 4), (1000, 64, 32), (1024, 64, 32), (4000, 64, 64), (4096, 64, 128), (2000, 32, 64)],
)
def test_automatic_num_buckets_follows_hf(seq_len, chunk_length, expected):
    assert auto_num_buckets(seq_len, chunk_length) == expected
    assert build(seq_len, chunk_length=chunk_length).num_buckets == expected
    assert build(seq_len, chunk_length=chunk_length, num_buckets=6).num_buckets == 6


@pytest.mark.parametrize(
    ("hparams", "message"),
    [
        ({"num_buckets": 3}, "even"),
        ({"num_buckets": 0}, "even"),
        ({"num_hashes": 0}, "num_hashes"),
        ({"chunk_length": 0}, "chunk_length"),
    ],
)
def test_bad_hyperparameters_name_the_problem(hparams, message):
    with pytest.raises(ValueError, match=message):
        build(64, **hparams)


def test_multihead_ties_query_and_key_projections():
    mha = attention_zoo.MultiHeadAttention(16, 2, "reformer", seq_len=100)
    assert mha.key is None
    x = torch.randn(2, 100, 16)
    mask = torch.arange(100) < torch.tensor([[100], [60]])
    torch.manual_seed(0)
    out = mha(x, mask)
    assert out.shape == x.shape and torch.isfinite(out).all()
