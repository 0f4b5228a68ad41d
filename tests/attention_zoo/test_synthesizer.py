"""Synthesizer (dense, random, factorised random, each with or without dot products) against float64 references."""

import math

import pytest
import torch
from zoo_inputs import HEAD_DIM, HEADS, attend64, build_attention, ragged_mask, random_qkv

import attention_zoo

VARIANTS = ["dense", "random", "factorized_random"]


def build(seq_len, **hparams):
    hparams.setdefault("dropout", 0.0)
    return build_attention("synthesizer", seq_len, **hparams)


def randomise(attn):
    """Weights larger than the init, and non-zero biases, so every term shows in the softmax."""
    torch.manual_seed(3)
    with torch.no_grad():
        for parameter in attn.parameters():
            parameter.normal_()


def reference(attn, q, k, v, mask):
    """The paper's equations, written out per head in float64: logits, masked softmax over real keys, times V."""
    q, k, v = q.double(), k.double(), v.double()
    batch, heads, n, d = q.shape
    out = torch.zeros(batch, heads, n, v.shape[-1], dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            if attn.config.variant == "dense":
                w1, b1, w2, b2 = (p[h].double() for p in (attn.w1, attn.b1, attn.w2, attn.b2))
                logits = torch.stack([w2.T @ torch.relu(w1.T @ q[b, h, i] + b1[0]) + b2[0] for i in range(n)])  # (n, N)
            elif attn.config.variant == "random":
                logits = attn.random[h].double()  # (N, N)
            else:
                logits = attn.random1[h].double() @ attn.random2[h].double()  # (N, N)
            logits = logits[:n, :n]
            if attn.config.dot_product:
                logits = logits + q[b, h] @ k[b, h].T / math.sqrt(d)
            for i in range(n):
                if mask is not None and not mask[b, i]:
                    continue  # a padded query's row is zero
                real = torch.ones(n, dtype=torch.bool) if mask is None else mask[b]
                weights = torch.zeros(n, dtype=torch.float64)
                weights[real] = logits[i, real].softmax(-1)
                out[b, h, i] = weights @ v[b, h]
    return out


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dot_product", [False, True])
@pytest.mark.parametrize("n", [1, 13, 20])  # shorter than seq_len = 20, and equal
def test_float64_equals_the_papers_equations(variant, dot_product, n):
    """The algorithm run in float64 (``attend`` directly: ``forward`` takes the harness's dtypes only)."""
    attn = build(20, variant=variant, dot_product=dot_product, k=4).double()
    randomise(attn)
    q, k, v = random_qkv(4, n, dtype=torch.float64, value_dim=12)
    mask = ragged_mask(n)
    for m in (mask, None):
        torch.testing.assert_close(attend64(attn, q, k, v, m), reference(attn, q, k, v, m), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("variant", VARIANTS)
def test_float32_forward_equals_the_reference(variant):
    attn = build(30, variant=variant, dot_product=variant == "random")
    randomise(attn)
    q, k, v = random_qkv(4, 25)
    mask = ragged_mask(25)
    torch.testing.assert_close(attn(q, k, v, mask).double(), reference(attn, q, k, v, mask), rtol=1e-5, atol=1e-5)


def test_dense_output_does_not_depend_on_the_keys():
    attn = build(16, variant="dense")
    randomise(attn)
    q, k, v = random_qkv(4, 16)
    mask = ragged_mask(16)
    other_k = random_qkv(4, 16, seed=5)[1] * 100
    assert torch.equal(attn(q, k, v, mask), attn(q, other_k, v, mask))
    assert not torch.allclose(attn(q, k, v, mask), attn(q * 2, k, v, mask)), "the dense logits come from the queries"


@pytest.mark.parametrize("variant", ["random", "factorized_random"])
def test_random_output_depends_on_neither_queries_nor_keys(variant):
    attn = build(16, variant=variant)
    randomise(attn)
    q, k, v = random_qkv(4, 16)
    mask = ragged_mask(16)
    other_q, other_k, _ = random_qkv(4, 16, seed=5)
    assert torch.equal(attn(q, k, v, mask), attn(100 * other_q, 100 * other_k, v, mask))
    # and every sequence gets the same attention matrix: with identity values, the output is the matrix itself
    identity = torch.eye(16).expand(4, HEADS, 16, 16)
    matrices = attn(q, k, identity.contiguous())
    assert torch.equal(matrices[0], matrices[1]) and torch.equal(matrices[0], matrices[3])


@pytest.mark.parametrize("variant", VARIANTS)
def test_right_padding_equals_the_unpadded_sequence(variant):
    attn = build(32, variant=variant, dot_product=True)
    randomise(attn)
    q, k, v = random_qkv(1, 32)
    mask = torch.zeros(1, 32, dtype=torch.bool)
    mask[0, :20] = True
    padded = attn(q, k, v, mask)[:, :, :20]
    unpadded = attn(q[:, :, :20], k[:, :, :20], v[:, :, :20])
    torch.testing.assert_close(padded, unpadded, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", VARIANTS)
def test_longer_inputs_are_an_error(variant):
    attn = build(16, variant=variant)
    with pytest.raises(ValueError, match="exceeds seq_len=16"):
        attn(*random_qkv(1, 17))


def test_parameters_and_initialisation():
    n = 512
    dense = build(n, variant="dense")
    assert {name: tuple(p.shape) for name, p in dense.named_parameters()} == {
        "w1": (HEADS, HEAD_DIM, HEAD_DIM),
        "b1": (HEADS, 1, HEAD_DIM),
        "w2": (HEADS, HEAD_DIM, n),
        "b2": (HEADS, 1, n),
    }
    assert dense.w2.abs().max() <= math.sqrt(6 / (HEAD_DIM + n)) and (dense.b2 == 0).all()
    random = build(n, variant="random")
    bound = math.sqrt(6 / (HEADS * 2 * n))  # flax's xavier_uniform of the (h, N, N) tensor
    assert random.random.shape == (HEADS, n, n) and random.random.abs().max() <= bound
    assert abs(random.random.std().item() - bound / math.sqrt(3)) < 0.02 * bound
    factorized = build(n, variant="factorized_random", k=8)
    assert factorized.random1.shape == (HEADS, n, 8) and factorized.random2.shape == (HEADS, 8, n)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_synthetic_weights_are_learned(variant):
    attn = build(16, variant=variant).train()
    q, k, v = random_qkv(2, 16)
    (attn(q, k, v) * torch.randn(2, HEADS, 16, HEAD_DIM)).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in attn.parameters())


def test_the_presets():
    lra = attention_zoo.make_config("synthesizer_lra")
    assert (lra.variant, lra.dot_product, lra.dropout) == ("random", True, 0.1)
    for variant in VARIANTS:
        config = attention_zoo.make_config(f"synthesizer_{variant}")
        assert config.variant == variant and not config.dot_product


def test_dropout_only_in_training():
    attn = build(16, variant="random", dropout=0.5)
    q, k, v = random_qkv(2, 16)
    v = v[:1].expand_as(v)  # both sequences the same, so only dropout can tell them apart
    expected = attn(q, k, v)
    torch.manual_seed(0)
    training = attn.train()(q, k, v)
    assert not torch.allclose(training, expected, atol=1e-3)
    assert not torch.allclose(training[0], training[1], atol=1e-3), "each sequence draws its own dropout mask"
    torch.testing.assert_close(attn.eval()(q, k, v), expected)


@pytest.mark.parametrize(
    "hparams, error, message",
    [
        ({"variant": "factorized_dense"}, TypeError, "variant"),
        ({"k": 0}, ValueError, "k"),
        ({"dropout": 1.0}, ValueError, "dropout"),
    ],
)
def test_bad_hyperparameters_name_the_problem(hparams, error, message):
    with pytest.raises(error, match=message):
        build(8, **hparams)
