"""Longformer sliding-window attention against dense float64 references (softmax and the exact band), each test
both ways it is computed on a CPU: the fused kernel (where YOSO's CPU kernels are built) and the blocks."""

import pytest
import torch
from zoo_inputs import (
    HEAD_DIM,
    HEADS,
    build_attention,
    builder,
    forward_backward_allocation,
    influence,
    ragged_mask,
    random_qkv,
    random_values,
    softmax_reference,
)

from attention_zoo import longformer
from yoso_cuda import has_kernel

build = builder("longformer")
longformer_dense_band = longformer.dense_band


@pytest.fixture(autouse=True, params=["fused", "blocks"])
def way(request, monkeypatch):
    """Which way the CPU computes it: the fused kernel, or the blocks (as without the kernels, and on a GPU)."""
    if request.param == "blocks":
        monkeypatch.setattr(longformer, "has_kernel", lambda device: False)
    elif not has_kernel(torch.device("cpu")):
        pytest.skip("YOSO's CPU kernels are not built (python -m yoso_cuda)")
    return request.param


def allowed_pairs(n, window, num_global):
    """(n, n) bool: query i sees key j within the band or when either is one of the global tokens."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return ((i - j).abs() <= window // 2) | (i < num_global) | (j < num_global)


@pytest.mark.parametrize("n", [1, 7, 33])
@pytest.mark.parametrize("num_global", [0, 2])
def test_window_covering_the_sequence_equals_softmax(n, num_global):
    attn = build(n, window=2 * n, num_global_tokens=num_global)
    q, k, v = random_qkv(4, n)
    mask = ragged_mask(n)
    everything = torch.ones(n, n, dtype=torch.bool)
    for m in (mask, None):
        expected = softmax_reference(q, k, v, m, everything)
        torch.testing.assert_close(attn(q, k, v, m).double(), expected, rtol=1e-5, atol=1e-5)


def test_default_window_is_full_attention_on_short_sequences():
    q, k, v = random_qkv(4, 100)
    mask = ragged_mask(100)
    expected = build_attention("softmax", 100)(q, k, v, mask)
    torch.testing.assert_close(build(100)(q, k, v, mask), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("num_global", [0, 2])
def test_value_dim_may_differ_from_the_query_dim(num_global):
    n, window, value_dim = 23, 8, 2 * HEAD_DIM
    attn = build(n, window=window, num_global_tokens=num_global)
    q, k, _ = random_qkv(4, n)
    v = random_values(4, n, value_dim, seed=2)
    mask = ragged_mask(n)
    expected = softmax_reference(q, k, v, mask, allowed_pairs(n, window, num_global))
    torch.testing.assert_close(attn(q, k, v, mask).double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [5, 12, 16, 23, 37])  # blocks of window / 2 = 4: multiples and not
@pytest.mark.parametrize("num_global", [0, 1, 6])
@pytest.mark.parametrize("window", [2, 8])
def test_equals_dense_banded_reference(n, num_global, window):
    """Through both ways of computing it: one (n, n) score matrix for n <= 12 at window 8, blocks otherwise."""
    attn = build(n, window=window, num_global_tokens=num_global)
    q, k, v = random_qkv(4, n)
    mask = ragged_mask(n)
    allowed = allowed_pairs(n, window, num_global)
    for m in (mask, None):
        expected = softmax_reference(q, k, v, m, allowed)
        torch.testing.assert_close(attn(q, k, v, m).double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "n, window, num_global, dense",
    [(12, 8, 0, True), (16, 8, 0, False), (12, 2, 6, False), (512, 512, 1, True), (1100, 512, 1, False)],
)
def test_a_short_sequence_is_one_score_matrix_and_a_long_one_blocks(monkeypatch, way, n, window, num_global, dense):
    """The (n, n) scores only where they are no more than the blocks' (n^2 <= padded n * (g + 1.5 window)), so memory
    stays linear in n beyond; ListOps at 512 with the LRA window of 512 takes the dense way. The fused kernel takes
    neither."""
    calls = []
    monkeypatch.setattr(longformer, "dense_band", lambda *args: calls.append(n) or longformer_dense_band(*args))
    q, k, v = random_qkv(1, n)
    build(n, window=window, num_global_tokens=num_global)(q, k, v, ragged_mask(n)[:1])
    assert calls == ([n] if dense and way == "blocks" else [])


@pytest.mark.parametrize("num_global", [0, 1])
def test_band_is_exact(num_global):
    """Perturbing key/value j changes output row i exactly when |i - j| <= window / 2 or i or j is global."""
    n, window = 13, 4
    attn = build(n, window=window, num_global_tokens=num_global)
    q, k, v = random_qkv(1, n)
    assert torch.equal(influence(attn, q, k, v), allowed_pairs(n, window, num_global))


def test_global_token_that_is_padding_has_no_influence():
    attn = build(10, window=2, num_global_tokens=1)
    q, k, v = random_qkv(1, 10)
    mask = torch.ones(1, 10, dtype=torch.bool)
    mask[0, 0] = False
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 0], v2[:, :, 0] = 100.0, 100.0
    out = attn(q, k, v, mask)
    assert torch.equal(attn(q, k2, v2, mask), out) and (out[:, :, 0] == 0).all()
    allowed = allowed_pairs(10, 2, 0)  # with the global token padded, only the band remains
    torch.testing.assert_close(out.double(), softmax_reference(q, k, v, mask, allowed), rtol=1e-5, atol=1e-6)


def test_largest_tensor_is_the_band_of_scores(way):
    """The biggest allocation, forward and backward, is the (n, g + 1.5 window) score block per head; fused, no score
    tensor at all: the inputs' size (a gradient of q, k or v)."""
    n, window, num_global = 4000, 64, 1
    attn = build(n, window=window, num_global_tokens=num_global).train()
    q, k, v = (t.requires_grad_() for t in random_qkv(1, n))
    largest, _ = forward_backward_allocation(attn, q, k, v)
    padded = -(-n // (window // 2)) * (window // 2)
    if way == "fused":
        assert largest == q.numel()
    else:
        assert largest == HEADS * padded * (num_global + 3 * window // 2) < n * n / 8


def test_dropout_only_in_training():
    q, k, v = random_qkv(1, 20)
    attn = build(20, window=4, dropout=0.5)
    expected = softmax_reference(q, k, v, None, allowed_pairs(20, 4, 0))
    torch.testing.assert_close(attn.eval()(q, k, v).double(), expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(attn.train()(q, k, v).double(), expected, atol=1e-3)


def test_half_precision_runs_the_math_in_float32():
    q, k, v = random_qkv(2, 50)
    attn = build(50, window=8, num_global_tokens=1)
    expected = attn(q, k, v)
    for dtype in (torch.float16, torch.bfloat16):
        out = attn(q.to(dtype), k.to(dtype), v.to(dtype))
        assert out.dtype == dtype
        torch.testing.assert_close(out.float(), expected, rtol=0.02, atol=0.02)


@pytest.mark.parametrize(
    "hparams, message",
    [
        ({"window": 5}, "positive even"),
        ({"window": 0}, "positive even"),
        ({"window": -4}, "positive even"),
        ({"num_global_tokens": -1}, "num_global_tokens"),
        ({"dropout": 1.0}, "dropout"),
    ],
)
def test_bad_hyperparameters_name_the_problem(hparams, message):
    with pytest.raises(ValueError, match=message):
        build(8, **hparams)
