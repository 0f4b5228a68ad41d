"""The float32 policy of ``Attention.forward``, for every registered attention and preset, checked on results.

Where the policy says float32 (the class needs it, or ``MultiHeadAttention(attention_in_float32=True)`` asks
for it), an attention's output under bfloat16 autocast, or with its weights cast to bfloat16, is the
float32 computation's output, cast to the input dtype. Nothing here depends on how an attention
computes (products, convolutions, kernels or none at all), so a new attention is held to the same rule.
"""

import copy

import pytest
import torch

import attention_zoo

NAMES = attention_zoo.available() + list(attention_zoo.presets())
HEADS, HEAD_DIM, SEQ_LEN = 2, 16, 40


def core(name, in_float32):
    """The attention as MultiHeadAttention holds it, ``in_float32`` as ``attention_in_float32`` would set it."""
    torch.manual_seed(0)
    mha = attention_zoo.MultiHeadAttention(HEADS * HEAD_DIM, HEADS, name, seq_len=SEQ_LEN, attention_in_float32=in_float32)
    return mha.attention.eval()  # with dropout, SDPA's CPU fallback upcasts bfloat16 itself


def inputs(dtype):
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, HEADS, SEQ_LEN, HEAD_DIM, generator=generator).to(dtype) for _ in range(3))
    mask = torch.ones(3, SEQ_LEN, dtype=torch.bool)
    mask[1, SEQ_LEN // 2 :] = False
    return q, k, v, mask


def run(attention, q, k, v, mask, autocast=False):
    torch.manual_seed(1)  # random attentions draw the same features, rotations or hashes in every run
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        return attention(q, k, v, mask)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("attention_in_float32", [True, False], ids=["policy-on", "policy-off"])
def test_under_bf16_autocast_the_policy_gives_the_float32_result(name, attention_in_float32):
    attention = core(name, attention_in_float32)
    assert attention.in_float32 == (attention_in_float32 or type(attention).in_float32)
    q, k, v, mask = inputs(torch.float32)
    out = run(attention, q, k, v, mask, autocast=True)
    assert torch.isfinite(out).all() and (out[1, :, SEQ_LEN // 2 :] == 0).all()
    if attention.in_float32:  # otherwise autocast decides, as for any other layer
        assert out.dtype == torch.float32, "the core returns the dtype of its values"
        torch.testing.assert_close(out, run(attention, q, k, v, mask), rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_a_model_cast_to_bfloat16_still_computes_in_float32_where_the_policy_says(name):
    """No autocast, every weight in bfloat16 (YOSO-C's and Nystromformer's convolutions included): the output
    is the float32 computation on the same bfloat16 numbers, rounded once at the end."""
    attention = core(name, True).to(torch.bfloat16)
    q, k, v, mask = inputs(torch.bfloat16)
    out = run(attention, q, k, v, mask)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    in_float32 = copy.deepcopy(attention).float()  # the same bfloat16-rounded weights, exactly, in float32
    reference = run(in_float32, q.float(), k.float(), v.float(), mask).to(torch.bfloat16)
    torch.testing.assert_close(out, reference, rtol=0, atol=0)


# Why each built-in family needs float32 is in its docstring; an attention added later declares its own.
BUILT_IN_NEEDS_FLOAT32 = {
    "linformer": True,
    "longformer": True,
    "none": False,
    "nystromformer": True,
    "performer": True,
    "reformer": True,
    "softmax": False,
    "yoso": True,
}


def test_the_built_in_attentions_keep_their_declared_policy():
    declared = {name: attention_zoo.get_class(name).in_float32 for name in BUILT_IN_NEEDS_FLOAT32}
    assert declared == BUILT_IN_NEEDS_FLOAT32
