"""The attention contract, checked for every registered attention (a new one is covered on registration); that nothing
at a padded position reaches a real one, also for every row of ``conf/attention`` (the settings a run trains).

Random attentions are compared under the same torch seed, so their randomness cannot hide a leak.
"""

import dataclasses
import re

import pytest
import torch
from omegaconf import OmegaConf
from zoo_inputs import ragged_mask

import attention_zoo
from lra import config

ATTENTIONS = attention_zoo.available()
HEADS, HEAD_DIM = 2, 16


def build(name, seq_len):
    return attention_zoo.build(name, seq_len=seq_len, num_heads=HEADS, head_dim=HEAD_DIM).eval()


def inputs(batch, seq_len, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, HEADS, seq_len, HEAD_DIM, generator=generator).to(dtype) for _ in range(3))
    return q, k, v


def padding_mask(batch, seq_len):
    """Row 0 unpadded, row 1 half padded, row 2 fully padded, the rest with one real token."""
    mask = torch.ones(batch, seq_len, dtype=torch.bool)
    mask[1, (seq_len + 1) // 2 :] = False
    mask[2] = False
    mask[3:, 1:] = False
    return mask


def run(attn, q, k, v, mask, seed=0):
    torch.manual_seed(seed)
    return attn(q, k, v, mask)


@pytest.mark.parametrize("name", ATTENTIONS)
@pytest.mark.parametrize("seq_len", [1, 17, 1023])
def test_shape_dtype_and_masked_rows(name, seq_len):
    attn = build(name, seq_len)
    q, k, v = inputs(4, seq_len)
    mask = padding_mask(4, seq_len)
    out = run(attn, q, k, v, mask)
    assert out.shape == v.shape and out.dtype == v.dtype
    assert torch.isfinite(out).all()
    assert (out[~mask[:, None, :, None].expand_as(out)] == 0).all(), "padded query rows must be exactly zero"


@pytest.mark.parametrize("name", ATTENTIONS)
@pytest.mark.parametrize("seq_len", [17, 256])
def test_padded_keys_do_not_leak(name, seq_len):
    attn = build(name, seq_len)
    q, k, v = inputs(4, seq_len)
    mask = padding_mask(4, seq_len)
    noise_q, noise_k, noise_v = inputs(4, seq_len, seed=1)
    pad = ~mask[:, None, :, None]
    reference = run(attn, q, k, v, mask)
    changed = run(
        attn, torch.where(pad, 100 * noise_q, q), torch.where(pad, 100 * noise_k, k), torch.where(pad, 100 * noise_v, v), mask
    )
    torch.testing.assert_close(changed, reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ATTENTIONS)
def test_a_value_dim_that_differs_from_the_query_dim_is_kept(name):
    """v of head dim 2 * d: the output has v's dim (each attention's own tests compare it with their dense
    references), padded rows stay zero and every input gets a finite gradient."""
    attn = build(name, 37).train()
    q, k, _ = inputs(4, 37)
    v = torch.randn(4, HEADS, 37, 2 * HEAD_DIM, generator=torch.Generator().manual_seed(5), requires_grad=True)
    mask = padding_mask(4, 37)
    out = run(attn, q, k, v, mask)
    assert out.shape == v.shape
    assert (out[~mask[:, None, :, None].expand_as(out)] == 0).all()
    (out * torch.randn_like(out)).sum().backward()
    assert v.grad is not None and torch.isfinite(v.grad).all() and v.grad.abs().sum() > 0


@pytest.mark.parametrize("name", ATTENTIONS)
def test_mask_none_equals_all_true_mask(name):
    attn = build(name, 33)
    q, k, v = inputs(2, 33)
    full = torch.ones(2, 33, dtype=torch.bool)
    torch.testing.assert_close(run(attn, q, k, v, None), run(attn, q, k, v, full), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ATTENTIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gradients_are_finite(name, dtype):
    attn = build(name, 64).train()
    q, k, v = (t.requires_grad_() for t in inputs(4, 64, dtype))
    mask = padding_mask(4, 64)
    out = run(attn, q, k, v, mask)
    assert out.dtype == dtype
    # A fixed random weighting, not out.pow(2).sum(): YOSO normalises its output rows, which makes that loss constant
    # and its gradients rounding noise that "> 0" would accept (issue 41).
    (out.float() * torch.randn(out.shape, generator=torch.Generator().manual_seed(1))).sum().backward()
    for tensor in (q, k):  # None where the attention does not use them ("none")
        assert tensor.grad is None or torch.isfinite(tensor.grad).all()
    assert v.grad is not None and torch.isfinite(v.grad).all()
    assert v.grad.float().abs().amax() > 1e-2, "the values must receive a real gradient"


@pytest.mark.parametrize("name", ATTENTIONS)
def test_bfloat16_is_close_to_float32(name):
    """bfloat16 arithmetic stays close to float32 on the same (rounded) inputs.

    The reference takes the bf16-rounded values in float32, so an attention whose output is
    discontinuous in its inputs (hash codes) is compared on identical codes.
    """
    attn = build(name, 40)
    q, k, v = (t.bfloat16() for t in inputs(4, 40))
    mask = padding_mask(4, 40)
    reference = run(attn, q.float(), k.float(), v.float(), mask)
    low = run(attn, q, k, v, mask)
    torch.testing.assert_close(low.float(), reference, rtol=0.05, atol=0.05)


@pytest.mark.parametrize("name", ATTENTIONS)
def test_bad_inputs_name_the_problem(name):
    attn = build(name, 8)
    q, k, v = inputs(2, 8)
    with pytest.raises(ValueError, match=r"\(batch, heads, seq, head_dim\)"):
        attn(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="same shape"):
        attn(q, k[:, :, :4], v)
    with pytest.raises(TypeError, match="dtype"):
        attn(q.double(), k.double(), v.double())
    with pytest.raises(TypeError, match="bool"):
        attn(q, k, v, torch.ones(2, 8))
    with pytest.raises(ValueError, match=r"\(batch, seq\)"):
        attn(q, k, v, torch.ones(2, 7, dtype=torch.bool))


def has_dropout(name):
    return "dropout" in {field.name for field in dataclasses.fields(attention_zoo.get_class(name).Config)}


@pytest.mark.parametrize("name", [name for name in ATTENTIONS if has_dropout(name)])
@pytest.mark.parametrize("dropout", [-0.1, 1.0])
def test_a_dropout_outside_0_1_is_refused_with_one_message(name, dropout):
    with pytest.raises(ValueError, match=re.escape(f"dropout must be in [0, 1), got {dropout}")):
        attention_zoo.build(name, seq_len=8, num_heads=HEADS, head_dim=HEAD_DIM, dropout=dropout)


def attentions_and_rows():
    """Every registered attention with its defaults, and every row of conf/attention whose settings differ from them."""
    cases = {name: (name, {}) for name in ATTENTIONS}
    for row in config.attention_rows():
        attention = OmegaConf.to_container(config.compose([f"attention={row}"]).attention, resolve=True)
        if attention_zoo.make_config(attention["name"], **attention["hparams"]) != attention_zoo.make_config(attention["name"]):
            cases[f"attention={row}"] = (attention["name"], attention["hparams"])
    return [pytest.param(name, hparams, id=case) for case, (name, hparams) in cases.items()]


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize(("name", "hparams"), attentions_and_rows())
def test_a_non_finite_padded_input_reaches_no_real_row_nor_its_gradient(name, hparams, bad, training):
    """NaN or inf in q, k and v at every padded position: the output and the gradients of q, k and v are, to the bit,
    those of finite padding (padding selected out, not multiplied by zero: 0 * NaN is NaN), in evaluation and with
    dropout, and a padded position gets no gradient."""
    n = 45
    attn = attention_zoo.build(name, seq_len=n, num_heads=HEADS, head_dim=HEAD_DIM, **hparams).train(training)
    mask = ragged_mask(n)  # right padding, padding inside a sequence, a fully padded one
    pad = ~mask[:, None, :, None]  # (b, 1, n, 1)
    finite = inputs(4, n)
    non_finite = tuple(torch.where(pad, bad, t) for t in finite)
    outputs, grads = [], []
    for q, k, v in (finite, non_finite):
        q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
        out = run(attn, q, k, v, mask)
        (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(1))).sum().backward()
        outputs.append(out)
        grads.append([torch.zeros_like(t) if t.grad is None else t.grad for t in (q, k, v)])  # None: "none" ignores q, k
    torch.testing.assert_close(outputs[1], outputs[0], rtol=0, atol=0)
    for which, finite_grad, non_finite_grad in zip("qkv", *grads):
        torch.testing.assert_close(non_finite_grad, finite_grad, rtol=0, atol=0, msg=f"the gradient of {which} differs")
        assert (non_finite_grad.masked_select(pad.expand_as(non_finite_grad)) == 0).all(), f"a padded {which} has a gradient"
