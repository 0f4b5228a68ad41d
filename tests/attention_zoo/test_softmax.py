"""Softmax attention, masked and unpadded, against a naive float64 reference."""

import pytest
import torch
from zoo_inputs import ragged_mask, random_qkv, softmax_reference

import attention_zoo
from attention_zoo.softmax import PADDING_PIECE, sequence_offsets

SOFTMAX = ["softmax", "softmax_unpadded"]
# The unpadded path's tests on the CPU (SDPA's nested math) and on a GPU (its fused nested kernels, where one is present:
# lra.bench gpu's tests step runs them).
DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU on this machine")]
    ),
]


@pytest.mark.parametrize("name", SOFTMAX)
@pytest.mark.parametrize("seq_len", [1, 5, 130])
@pytest.mark.parametrize("value_dim", [8, 12], ids=["value-dim-equal", "value-dim-differs"])
def test_equals_naive_reference_with_masks(name, seq_len, value_dim):
    torch.manual_seed(0)
    attn = attention_zoo.build(name, seq_len=seq_len, num_heads=3, head_dim=8).eval()
    q, k = (torch.randn(4, 3, seq_len, 8) for _ in range(2))
    v = torch.randn(4, 3, seq_len, value_dim)
    mask = torch.rand(4, seq_len) < 0.6
    mask[0] = True
    mask[1] = False
    mask[2, 0] = True
    out = attn(q, k, v, mask)
    torch.testing.assert_close(out.double(), softmax_reference(q, k, v, mask), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(attn(q, k, v).double(), softmax_reference(q, k, v, None), rtol=1e-5, atol=1e-6)
    assert (out[1] == 0).all()


def test_a_fully_padded_sequence_gives_the_fused_dropout_kernel_a_real_key(monkeypatch):
    """The fused CPU kernel (softmax with dropout, in training) needs a real key in every sequence, as some GPU SDPA
    backends do: a sequence with none gets every key unmasked, and its rows (zeroed after) stay finite, with finite
    gradients. The kernel's dense reference stands in for it, so this holds where the kernels are not built; PyTorch's
    CPU SDPA gives zeros for such a row by itself, so without the fused path the guard would go untested."""
    import attention_zoo.softmax as softmax
    from yoso_cuda import reference

    seen = []

    def dense_kernel(q, k, v, key_mask, dropout):
        seen.append(key_mask.clone())
        return reference.softmax_dropout_attention(q, k, v, key_mask, dropout, seed=0)

    monkeypatch.setattr(softmax, "has_kernel", lambda device: True)
    monkeypatch.setattr(softmax, "softmax_dropout_attention", dense_kernel)
    attn = attention_zoo.build("softmax", seq_len=6, num_heads=2, head_dim=4, dropout=0.1).train()
    q, k, v = (torch.randn(2, 2, 6, 4, generator=torch.Generator().manual_seed(i), requires_grad=True) for i in range(3))
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1] = False
    out = attn(q, k, v, mask)
    assert len(seen) == 1 and seen[0].any(dim=1).all(), "every sequence the kernel sees has a real key"
    assert torch.isfinite(out).all() and (out[1] == 0).all()
    (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(5))).sum().backward()
    for tensor in (q, k, v):
        assert torch.isfinite(tensor.grad).all()
        assert (tensor.grad[1] == 0).all(), "a sequence with no real token gets no gradient"


@pytest.mark.parametrize("name", SOFTMAX)
def test_dropout_only_in_training(name):
    torch.manual_seed(0)
    attn = attention_zoo.build(name, seq_len=16, num_heads=1, head_dim=4, dropout=0.5)
    q, k, v = (torch.randn(1, 1, 16, 4) for _ in range(3))
    expected = softmax_reference(q, k, v, None)
    torch.testing.assert_close(attn.eval()(q, k, v).double(), expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(attn.train()(q, k, v).double(), expected, atol=1e-3)


@pytest.mark.parametrize("name", SOFTMAX)
def test_evaluation_leaves_the_global_random_stream_alone(name):
    """On a CPU in float32 evaluation runs on the fused kernel too, with no dropout: it must draw no seed, or every
    evaluation would shift the dropout of the training steps after it."""
    attn = attention_zoo.build(name, seq_len=16, num_heads=2, head_dim=4, dropout=0.1).eval()
    q, k, v = random_qkv(4, 16, heads=2, head_dim=4)
    state = torch.get_rng_state()
    attn(q, k, v, ragged_mask(16))
    assert torch.equal(torch.get_rng_state(), state)


def test_none_returns_the_values_with_padded_rows_zeroed():
    attn = attention_zoo.build("none", seq_len=6, num_heads=2, head_dim=3)
    q, k, v = (torch.randn(2, 2, 6, 3) for _ in range(3))
    mask = torch.tensor([[True] * 6, [True, True, False, False, False, False]])
    torch.testing.assert_close(attn(q, k, v, mask), v * mask[:, None, :, None])
    torch.testing.assert_close(attn(q, k, v), v)


def test_each_rows_padding_is_cut_into_the_same_number_of_nonempty_pieces():
    """softmax_unpadded's sequences: a row's tokens, then m = ceil(n / 63) pieces of its padding, each one appended
    position and up to 63 of the row's, so that every batch has b * (1 + m) sequences, none empty (SDPA's fused
    nested kernels refuse an empty one), that together cover the b rows of n + m positions."""
    n = 130
    offsets = sequence_offsets(torch.tensor([130, 5, 1]), n)
    m = 3  # ceil(130 / 63)
    assert PADDING_PIECE == 64
    sizes = offsets.diff().view(3, 1 + m).tolist()
    assert sizes == [[130, 1, 1, 1], [5, 64, 63, 1], [1, 64, 64, 4]]
    assert offsets[0] == 0 and offsets[-1] == 3 * (n + m)


def test_the_unpadded_path_gives_the_fused_nested_kernels_static_nonempty_sequences(monkeypatch):
    """What makes the path capturable and fused on a GPU, checked where it is built: three nested tensors (q, k, v)
    on one set of offsets whose count depends on the batch's shape only, every sequence non-empty, max_seqlen given,
    and no copy to the host (the batch's lengths stay on its device)."""
    seen = []
    original = torch.nested.nested_tensor_from_jagged

    def recording(values, offsets, **kwargs):
        seen.append((values.shape, offsets, kwargs))
        return original(values, offsets, **kwargs)

    monkeypatch.setattr(torch.nested, "nested_tensor_from_jagged", recording)
    attn = attention_zoo.build("softmax_unpadded", seq_len=100, num_heads=2, head_dim=8).eval()
    q, k, v = random_qkv(4, 100)
    for mask in (ragged_mask(100), ragged_mask(100, row3=40)):
        seen.clear()
        attn(q, k, v, mask)
        assert len(seen) == 3 and all(offsets is seen[0][1] for _, offsets, _ in seen)
        shape, offsets, kwargs = seen[0]
        assert shape == (4 * (100 + 2), 2, 8) and offsets.shape == (4 * 3 + 1,)
        assert offsets.diff().min() >= 1 and kwargs == {"min_seqlen": 1, "max_seqlen": 100}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows", [5, 1], ids=["batch", "one-row"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_unpadded_softmax_has_the_masked_paths_values_and_gradients(seed, rows, device):
    """Without dropout the two paths are one function: same outputs and the same gradients of q, k and v, on rows
    unpadded, randomly padded (tokens after padding), fully padded and right padded; and on a batch of one row (the
    efficiency benchmark's on a CPU), whose packed tokens were a view SDPA's nested math path refuses (torch 2.14)."""
    generator = torch.Generator().manual_seed(seed)
    n = 150
    mask = torch.rand(5, n, generator=generator) < 0.6
    mask[0], mask[1], mask[2] = True, False, torch.arange(n) < 70
    q, k, v = (torch.randn(5, 2, n, 8, generator=generator).to(device) for _ in range(3))
    weights = torch.randn(5, 2, n, 8, generator=generator).to(device)
    kept = slice(0, 5) if rows == 5 else slice(3, 4)  # a randomly padded row alone
    q, k, v, weights, mask = (x[kept] for x in (q, k, v, weights, mask.to(device)))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    results = []
    for name in SOFTMAX:
        attn = attention_zoo.build(name, seq_len=n, num_heads=2, head_dim=8, dropout=0.0).train()
        out = attn(q, k, v, mask)
        results.append((out, *torch.autograd.grad((out * weights).sum(), (q, k, v))))
    for masked, unpadded in zip(*results):
        torch.testing.assert_close(unpadded, masked, rtol=1e-5, atol=1e-6)
    if rows == 5:
        assert (results[1][0][1] == 0).all() and (results[1][1][1] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_unpadded_dropout_drops_probabilities_without_bias(device):
    """In training with dropout 0.5, the unpadded path's outputs vary from draw to draw, padded rows stay zero, and
    their mean over 2000 draws is the evaluation output (dropout divides what it keeps by 1 - p): within 5 standard
    errors of the mean at each of the 100 real outputs (a bias of a tenth of the outputs' spread would be 4.5)."""
    torch.manual_seed(0)
    attn = attention_zoo.build("softmax_unpadded", seq_len=16, num_heads=1, head_dim=4, dropout=0.5)
    q, k, v = (t.to(device) for t in random_qkv(2, 16, heads=1, head_dim=4))
    mask = (torch.arange(16) < torch.tensor([[16], [9]])).to(device)
    expected = attn.eval()(q, k, v, mask)
    attn.train()
    with torch.no_grad():
        draws = torch.stack([attn(q, k, v, mask) for _ in range(2000)])  # (2000, 2, 1, 16, 4)
    assert (draws[:, 1, :, 9:] == 0).all()
    real = torch.cat([draws[:, 0].flatten(1), draws[:, 1, :, :9].flatten(1)], dim=1)  # (2000, 100)
    wanted = torch.cat([expected[0].flatten(), expected[1, :, :9].flatten()])
    spread = real.std(dim=0)
    assert spread.min() > 0.01, "every real output varies with the dropped probabilities"
    assert ((real.mean(dim=0) - wanted).abs() <= 5 * spread / 2000**0.5).all()
