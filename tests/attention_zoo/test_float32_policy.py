"""The float32 policy of ``Attention.forward``, for every registered attention and preset: the dtype each
product (matrix product, convolution, SDPA, YOSO's ops) of the core attention actually ran in, recorded
below autocast by a dispatch mode."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import attention_zoo

NAMES = attention_zoo.available() + list(attention_zoo.presets())
PRODUCTS = {"mm", "bmm", "addmm", "baddbmm", "addbmm", "convolution", "_convolution"}
DIM, HEADS, SEQ_LEN = 16, 2, 40


class ProductDtypes(TorchDispatchMode):
    """The floating dtypes of every product's inputs while ``recording`` is set."""

    def __init__(self):
        super().__init__()
        self.recording = False
        self.seen: list[tuple[str, torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        product = name in PRODUCTS or name.startswith("_scaled_dot_product") or func.namespace == "yoso"
        if self.recording and product:
            leaves = tree_leaves((args, kwargs))
            self.seen += [(name, t.dtype) for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point()]
        return func(*args, **kwargs)


def run_recorded(name, attention_in_fp32, dtype, autocast, padded):
    """One forward of MultiHeadAttention around ``name``, one row half padded if ``padded``; the core's product dtypes."""
    torch.manual_seed(0)
    mha = attention_zoo.MultiHeadAttention(DIM, HEADS, name, seq_len=SEQ_LEN, attention_in_fp32=attention_in_fp32)
    mha = mha.to(dtype).eval()  # with dropout, SDPA's CPU fallback upcasts bfloat16 itself
    x = torch.randn(3, SEQ_LEN, DIM, dtype=dtype)
    mask = torch.ones(3, SEQ_LEN, dtype=torch.bool)
    mask[1, SEQ_LEN // 2 :] = not padded
    recorder = ProductDtypes()
    core = mha.attention
    core.register_forward_pre_hook(lambda *_: setattr(recorder, "recording", True))
    core.register_forward_hook(lambda *_: setattr(recorder, "recording", False))
    outputs = []
    core.register_forward_hook(lambda module, args, out: outputs.append((args[2].dtype, out)))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), recorder:
        mha(x, mask)
    ((value_dtype, out),) = outputs
    assert out.dtype == value_dtype, "the core returns the dtype of its values"
    assert not padded or (out[1, :, SEQ_LEN // 2 :] == 0).all(), "masked query rows are zeros"
    assert torch.isfinite(out).all()
    return core, {dtype for _, dtype in recorder.seen}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("attention_in_fp32", [True, False], ids=["policy-on", "policy-off"])
def test_products_run_in_float32_exactly_where_the_policy_says_under_bf16_autocast(name, attention_in_fp32):
    # No padding: with a mask too, SDPA's CPU fallback would upcast bfloat16 itself and hide the policy.
    core, dtypes = run_recorded(name, attention_in_fp32, torch.float32, autocast=True, padded=False)
    if attention_zoo.get_class(name).Config is attention_zoo.registry.NoHyperparameters and not dtypes:
        return  # no token mixing ("none"): no product to check
    assert dtypes, f"{name}: no product recorded"
    expected = torch.float32 if attention_in_fp32 or core.float32 else torch.bfloat16
    assert core.in_float32 == (expected == torch.float32)
    assert dtypes == {expected}, f"{name} (attention_in_fp32={attention_in_fp32}): products ran in {dtypes}"


@pytest.mark.parametrize("name", NAMES)
def test_a_model_cast_to_bfloat16_still_runs_its_float32_attentions_in_float32(name):
    """No autocast, every weight in bfloat16 (YOSO-C's and Nystromformer's convolutions included)."""
    core, dtypes = run_recorded(name, True, torch.bfloat16, autocast=False, padded=True)
    assert dtypes <= {torch.float32}, f"{name}: products ran in {dtypes}"


def test_the_attentions_that_need_float32_say_so():
    needs = {name for name in attention_zoo.available() if attention_zoo.get_class(name).float32}
    assert needs == {"linformer", "longformer", "nystromformer", "performer", "reformer", "yoso"}
