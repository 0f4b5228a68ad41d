"""The registry contract of DESIGN.md: register, build, available, and validated hyperparameters."""

from __future__ import annotations  # config annotations are strings, as in every attention module

from dataclasses import dataclass
from typing import Literal

import pytest
import torch

import attention_zoo
from attention_zoo import Attention, register


@dataclass
class MeanConfig:
    scale: float = 1.0
    mode: Literal["mean", "sum"] = "mean"
    window: int | None = None


class MeanAttention(Attention):
    """Throwaway attention for the tests: every real query gets the scaled mean of the real values."""

    Config = MeanConfig

    def attend(self, q, k, v, mask):
        weights = torch.ones(v.shape[:3], dtype=v.dtype) if mask is None else mask[:, None, :].to(v.dtype)
        weights = weights.expand(v.shape[:3])  # (b, h, n)
        pooled = (weights[..., None] * v).sum(2, keepdim=True)  # (b, h, 1, d)
        if self.config.mode == "mean":
            pooled = pooled / weights.sum(-1)[..., None, None].clamp(min=1)
        return self.config.scale * pooled.expand_as(v)


@pytest.fixture
def mean_attention():
    register("test_mean")(MeanAttention)
    yield "test_mean"
    attention_zoo.unregister("test_mean")


def test_available_is_sorted_and_holds_the_builtins():
    names = attention_zoo.available()
    assert names == sorted(names)
    assert {"softmax", "none"} <= set(names)


def test_unknown_attention_lists_the_available_ones():
    with pytest.raises(KeyError) as error:
        attention_zoo.build("sofmax", seq_len=8, num_heads=1, head_dim=4)
    message = str(error.value)
    assert "'sofmax'" in message and "Did you mean 'softmax'" in message
    for name in attention_zoo.available():
        assert name in message


def test_unknown_hyperparameter_lists_valid_keys_and_defaults(mean_attention):
    with pytest.raises(ValueError) as error:
        attention_zoo.build(mean_attention, seq_len=8, num_heads=1, head_dim=4, scal=2.0)
    message = str(error.value)
    assert "['scal']" in message
    assert "scale: float = 1.0" in message
    assert "mode: 'mean' | 'sum' = 'mean'" in message and "window: int | None = None" in message


def test_hyperparameter_of_the_wrong_type_is_rejected(mean_attention):
    for bad in ({"scale": "2"}, {"mode": "max"}, {"window": 2.5}, {"window": True}):
        with pytest.raises(TypeError, match="scale: float = 1.0"):
            attention_zoo.build(mean_attention, seq_len=8, num_heads=1, head_dim=4, **bad)


def test_hyperparameters_reach_the_config_and_ints_become_floats(mean_attention):
    attn = attention_zoo.build(mean_attention, seq_len=8, num_heads=1, head_dim=4, scale=2, window=3)
    assert attn.config == MeanConfig(scale=2.0, mode="mean", window=3)
    assert isinstance(attn.config.scale, float)
    assert (attn.seq_len, attn.num_heads, attn.head_dim) == (8, 1, 4)


def test_config_post_init_validates_ranges():
    with pytest.raises(ValueError, match="dropout"):
        attention_zoo.build("softmax", seq_len=8, num_heads=1, head_dim=4, dropout=1.5)


def test_context_must_be_positive_ints():
    with pytest.raises(ValueError, match="seq_len"):
        attention_zoo.build("softmax", seq_len=0, num_heads=1, head_dim=4)


def test_register_rejects_a_name_taken_by_another_class(mean_attention):
    class Other(MeanAttention):
        pass

    with pytest.raises(ValueError, match="already registered"):
        register(mean_attention)(Other)


def test_register_rejects_non_attention_classes():
    with pytest.raises(TypeError, match="subclass of attention_zoo.Attention"):
        register("not_an_attention")(torch.nn.Linear)


def test_the_old_name_of_the_float32_choice_is_an_error_naming_the_new_one():
    """An attention written for the older API (``float32 = True``) would silently lose its float32 policy."""

    class OldStyle(Attention):
        float32 = True

    with pytest.raises(TypeError, match="OldStyle.float32 is now called in_float32"):
        register("old_style")(OldStyle)
    assert "old_style" not in attention_zoo.available()


def test_a_new_attention_appears_and_trains_a_step(mean_attention):
    from lra.model import AttentionConfig, LRAClassifier, LRAEncoder, ModelConfig

    assert mean_attention in attention_zoo.available()
    torch.manual_seed(0)
    encoder = LRAEncoder(8, 16, ModelConfig(dropout=0.0), AttentionConfig(mean_attention, {"scale": 0.5}))
    model = LRAClassifier(3, encoder)
    input_ids = torch.randint(1, 8, (4, 16))
    labels = torch.tensor([0, 1, 2, 1])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(20):
        loss = torch.nn.functional.cross_entropy(model(input_ids), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]


def test_multihead_attention_runs_the_core_in_float32_under_autocast(mean_attention):
    seen = []

    class Recording(MeanAttention):
        def attend(self, q, k, v, mask):
            seen.append(q.dtype)
            return super().attend(q, k, v, mask)

    attention_zoo.unregister(mean_attention)
    register(mean_attention)(Recording)
    x = torch.randn(2, 5, 8)
    for in_fp32, expected in ((True, torch.float32), (False, torch.bfloat16)):
        mha = attention_zoo.MultiHeadAttention(8, 2, mean_attention, seq_len=5, attention_in_float32=in_fp32)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = mha(x)
        assert seen[-1] == expected
        assert out.shape == x.shape


def test_multihead_attention_matches_manual_projections():
    torch.manual_seed(0)
    mha = attention_zoo.MultiHeadAttention(8, 2, "softmax", seq_len=6, dropout=0.0).eval()
    x = torch.randn(3, 6, 8)
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2, [True] + [False] * 5])

    def heads(t):
        return t.view(3, 6, 2, 4).transpose(1, 2)

    q, k, v = heads(mha.query(x)), heads(mha.key(x)), heads(mha.value(x))
    scores = q @ k.transpose(-1, -2) / 2.0
    scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    attended = (scores.softmax(-1) @ v) * mask[:, None, :, None]
    expected = mha.output(attended.transpose(1, 2).reshape(3, 6, 8))
    torch.testing.assert_close(mha(x, mask), expected, rtol=1e-5, atol=1e-6)


def test_multihead_attention_needs_divisible_dim_or_head_dim():
    with pytest.raises(ValueError, match="head_dim"):
        attention_zoo.MultiHeadAttention(10, 3, "softmax", seq_len=4)
    assert attention_zoo.MultiHeadAttention(10, 3, "softmax", seq_len=4, head_dim=4).query.out_features == 12


def test_a_preset_builds_from_plain_python_with_its_values_and_takes_overrides():
    attn = attention_zoo.build("yoso_32", seq_len=2048, num_heads=2, head_dim=32)
    assert type(attn).name == "yoso" and attn.config.num_hashes == 32 and attn.hash_bits == 11
    assert attention_zoo.build("yoso_32", seq_len=64, num_heads=2, head_dim=8, num_hashes=8).config.num_hashes == 8
    table = attention_zoo.build("linformer_lra", seq_len=64, num_heads=2, head_dim=8).config
    faithful = attention_zoo.build("linformer", seq_len=64, num_heads=2, head_dim=8).config
    assert (table.share_heads, table.share_kv, table.init, faithful.share_heads) == (False, True, "normal", True)
    description = attention_zoo.describe("yoso_c_16")
    assert "preset of 'yoso'" in description and "conv_window: int | None = 33" in description


def test_a_preset_holds_every_hyperparameter_and_is_validated_when_registered(mean_attention):
    preset = attention_zoo.register_preset("test_mean_sum", mean_attention, "sums", mode="sum")
    try:
        assert preset.hparams == {"scale": 1.0, "mode": "sum", "window": None}
        assert attention_zoo.make_config("test_mean_sum", scale=2).mode == "sum"
    finally:
        attention_zoo.unregister("test_mean_sum")
    with pytest.raises(ValueError, match="unknown hyperparameter"):
        attention_zoo.register_preset("test_mean_bad", mean_attention, "typo", mod="sum")
    with pytest.raises(ValueError, match="name of a registered attention"):
        attention_zoo.register_preset("softmax", mean_attention, "clash")


def test_an_unknown_name_lists_the_attentions_and_the_presets():
    with pytest.raises(KeyError, match="Did you mean 'yoso_32'.*presets: .*yoso_star_c_16"):
        attention_zoo.build("yoso_23", seq_len=8, num_heads=1, head_dim=4)


def test_the_presets_print_as_a_list_one_line_each():
    """Issue 40: ``print(attention_zoo.presets())`` was a raw dict of dataclasses; it is a dict that prints a line per
    preset: its name, the attention it builds, what it is."""
    presets = attention_zoo.presets()
    lines = repr(presets).splitlines()
    assert len(lines) == len(presets) and isinstance(presets, dict)
    (yoso_32,) = [line for line in lines if line.startswith("yoso_32 ")]
    assert yoso_32.split()[1] == "yoso:" and presets["yoso_32"].description in yoso_32
