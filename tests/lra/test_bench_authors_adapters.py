"""``lra.bench authors``' rows their code lacks (:mod:`lra.bench.authors_adapters`) and the old-name alias of their
Reformer import, on stand-ins of transformers and sinkhorn-transformer written here; with the real transformers where
it is importable (never a dependency of this project)."""

import csv
import importlib
import importlib.util
import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from lra.bench import authors
from lra.bench import authors_adapters as adapters

BIG_BIRD = '''
import torch


class BigBirdConfig:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


class BigBirdBlockSparseAttention(torch.nn.Module):
    """HF's interface; dense masked softmax attention, every call's arguments kept in ``calls``."""

    calls = []

    def __init__(self, config, seed=None):
        super().__init__()
        self.config, self.seed = config, seed
        width = config.hidden_size
        self.query, self.key, self.value = (torch.nn.Linear(width, width) for _ in range(3))

    def bigbird_block_sparse_attention(self, q, k, v, band_mask, from_mask, to_mask, from_blocked_mask, to_blocked_mask,
                                       n_heads, n_rand_blocks, attention_head_size, from_block_size, to_block_size,
                                       batch_size, from_seq_len, to_seq_len, seed, plan_from_length, plan_num_rand_blocks):
        type(self).calls.append(dict(shape=tuple(q.shape), heads=n_heads, rand=n_rand_blocks, head_dim=attention_head_size,
                                     blocks=(from_block_size, to_block_size), lengths=(from_seq_len, to_seq_len), seed=seed,
                                     blocked=from_blocked_mask is to_blocked_mask, plan=(plan_from_length, plan_num_rand_blocks)))
        scores = (q @ k.transpose(-1, -2)) / attention_head_size**0.5 - 1e9 * (1 - to_mask)
        context = scores.softmax(-1) @ v * from_mask  # (b, h, n, d), padded rows zero as HF's
        return context.transpose(1, 2), None  # HF's (b, n, h, d)


class BigBirdModel:
    @staticmethod
    def create_masks_for_block_sparse_attn(attention_mask, block_size):
        b, n = attention_mask.shape
        assert n % block_size == 0
        blocked = attention_mask.view(b, n // block_size, block_size)
        return blocked, "band", attention_mask.view(b, 1, n, 1), attention_mask.view(b, 1, 1, n)
'''

LONGFORMER = '''
import torch


class LongformerConfig:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


class LongformerSelfAttention(torch.nn.Module):
    """HF's interface: six projections; dense attention over the allowed pairs, the last call's masks kept."""

    def __init__(self, config, layer_id):
        super().__init__()
        self.config, self.layer_id = config, layer_id
        self.heads, width = config.num_attention_heads, config.hidden_size
        for name in ("query", "key", "value", "query_global", "key_global", "value_global"):
            setattr(self, name, torch.nn.Linear(width, width))

    def forward(self, hidden_states, attention_mask=None, is_index_masked=None, is_index_global_attn=None,
                is_global_attn=None, output_attentions=False):
        type(self).last = dict(shape=tuple(hidden_states.shape), mask=attention_mask, masked=is_index_masked,
                               global_=is_index_global_attn, any_global=is_global_attn)
        b, n, width = hidden_states.shape
        split = lambda t: t.view(b, n, self.heads, -1).transpose(1, 2)
        q, k, v = split(self.query(hidden_states)), split(self.key(hidden_states)), split(self.value(hidden_states))
        scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5 - 1e9 * is_index_masked[:, None, None, :].float()
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, width)
        return (out,)
'''

SINKHORN = '''
import torch


class SinkhornAttention(torch.nn.Module):
    """lucidrains' interface; returns v where both masks are set, its arguments kept."""

    def __init__(self, **kwargs):
        super().__init__()
        self.kwargs = kwargs

    def forward(self, q, k, v, q_mask=None, kv_mask=None):
        type(self).last = dict(shape=tuple(q.shape), q_mask=q_mask, kv_mask=kv_mask)
        return v * (q_mask & kv_mask)[:, None, :, None]
'''

# Their attention.py's Attention, as far as the adapters see it: W_q/W_k/W_v, an ``attn``, the longformer branch.
ATTENTION = """
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attn_type, self.num_head, self.head_dim = config["attn_type"], config["num_head"], config["head_dim"]
        width = self.num_head * self.head_dim
        self.W_q, self.W_k, self.W_v = (nn.Linear(config["transformer_dim"], width) for _ in range(3))
        self.ff = nn.Linear(width, config["transformer_dim"])
        if self.attn_type.startswith("reformer"):
            from attention_reformer import LSHAttention
            self.attn = LSHAttention(config, self.W_q, self.W_k, self.W_v)

    def forward(self, X, mask):
        if self.attn_type.startswith("longformer") or self.attn_type.startswith("reformer"):
            out = self.attn(X, mask)
        else:
            split = lambda t: t.view(t.shape[0], t.shape[1], self.num_head, self.head_dim).transpose(1, 2)
            out = self.attn(split(self.W_q(X)), split(self.W_k(X)), split(self.W_v(X)), mask)
            out = out.transpose(1, 2).reshape(X.shape[0], X.shape[1], -1)
        return self.ff(out)
"""

MODEL_WRAPPER = """
import torch
from torch import nn
from attention import Attention


class ModelForSC(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embeddings = nn.Embedding(config["vocab_size"], config["transformer_dim"])
        self.layers = nn.ModuleList(Attention(config) for _ in range(config["num_layers"]))
        self.head = nn.Linear(config["transformer_dim"], config["num_classes"])

    def forward(self, input_ids_0, mask_0, label):
        X = self.embeddings(input_ids_0)
        for layer in self.layers:
            X = X + layer(X, mask_0)
        scores = self.head((X * mask_0[:, :, None]).mean(dim=1))
        return {"loss": nn.functional.cross_entropy(scores, label, reduction="none")}
"""

LRA_CONFIG = """
config = {
    "listops": {
        "model": {"vocab_size": 32, "transformer_dim": 16, "num_head": 2, "head_dim": 8, "num_layers": 2,
                  "num_classes": 10, "max_seq_len": 2000},
        "training": {"learning_rate": 1e-4, "warmup": 10, "lr_decay": "linear", "weight_decay": 0, "num_train_steps": 100},
        "extra_attn_config": {},
    }
}
"""

# Their attention_reformer.py's import, as published (transformers 3.x's module layout).
ATTENTION_REFORMER = """
from transformers.modeling_reformer import LSHSelfAttention, ReformerConfig


class LSHAttention(LSHSelfAttention):
    def __init__(self, config, query, key, value):
        super().__init__(ReformerConfig())

    def forward(self, X, mask):
        return X
"""

MODELING_REFORMER = """
import torch


class ReformerConfig:
    pass


class LSHSelfAttention(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
"""

CONFIG = {"num_head": 2, "head_dim": 8, "transformer_dim": 16, "num_layers": 2, "max_seq_len": 2048}


def write(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


@pytest.fixture
def packages(tmp_path):
    """A folder holding stand-ins of transformers (BigBird, Longformer, Reformer modules) and sinkhorn-transformer, as
    ``--extra-path`` names one."""
    if "transformers" in sys.modules or "sinkhorn_transformer" in sys.modules:
        pytest.skip("the real transformers or sinkhorn_transformer is imported in this process: the stand-ins would not load")
    site = tmp_path / "site"
    write(
        site,
        {
            "transformers/__init__.py": "",
            "transformers/models/__init__.py": "",
            "transformers/models/big_bird/__init__.py": "",
            "transformers/models/big_bird/modeling_big_bird.py": BIG_BIRD,
            "transformers/models/longformer/__init__.py": "",
            "transformers/models/longformer/modeling_longformer.py": LONGFORMER,
            "transformers/models/reformer/__init__.py": "",
            "transformers/models/reformer/modeling_reformer.py": MODELING_REFORMER,
            "sinkhorn_transformer/__init__.py": "",
            "sinkhorn_transformer/sinkhorn_transformer.py": SINKHORN,
        },
    )
    return site


@pytest.fixture
def their_code(tmp_path):
    code = tmp_path / "LRA" / "code"
    write(
        code,
        {
            "attention.py": ATTENTION,
            "model_wrapper.py": MODEL_WRAPPER,
            "lra_config.py": LRA_CONFIG,
            "attention_reformer.py": ATTENTION_REFORMER,
        },
    )
    return code


@pytest.fixture
def imported(their_code, packages):
    with authors.their_imports(their_code, None, [packages]) as modules:
        yield modules


def test_their_reformer_import_resolves_to_the_module_transformers_has_now(imported):
    their = importlib.import_module("attention_reformer")
    now = sys.modules["transformers.models.reformer.modeling_reformer"]
    assert sys.modules["transformers.modeling_reformer"] is now and their.LSHSelfAttention is now.LSHSelfAttention
    assert isinstance(their.LSHAttention({}, None, None, None), now.LSHSelfAttention)


def test_the_alias_and_the_extra_path_are_undone_and_a_missing_transformers_names_itself(their_code, packages):
    with authors.their_imports(their_code, None, [packages]):
        importlib.import_module("attention_reformer")
    assert "transformers" not in sys.modules and "transformers.modeling_reformer" not in sys.modules
    assert str(packages) not in sys.path and not any(isinstance(f, authors.AliasFinder) for f in sys.meta_path)
    if importlib.util.find_spec("transformers") is None:
        with authors.their_imports(their_code, None), pytest.raises(ModuleNotFoundError, match="'transformers'"):
            importlib.import_module("attention_reformer")


def test_bigbird_adapter_pads_to_blocks_and_calls_hf_with_their_qkv(imported):
    module = importlib.import_module("transformers.models.big_bird.modeling_big_bird")
    module.BigBirdBlockSparseAttention.calls.clear()
    adapter = adapters.BigBirdAdapter(CONFIG, {"block_size": 64, "num_random_blocks": 3, "random_within": 1024}, layer=1)
    assert adapter.sparse.seed == 1 and adapter.sparse.query is None and not list(adapter.parameters())
    config = adapter.sparse.config
    assert (config.block_size, config.num_random_blocks, config.hidden_size, config.num_attention_heads) == (64, 3, 16, 2)
    assert config.attention_type == "block_sparse" and config.max_position_embeddings == 2048
    n = 1000  # not a multiple of 64: padded to 1024
    q, k, v = (torch.randn(2, 2, n, 8) for _ in range(3))
    mask = torch.ones(2, n)
    mask[1, 600:] = 0
    out = adapter(q, k, v, mask)
    call = module.BigBirdBlockSparseAttention.calls[-1]
    assert call == dict(shape=(2, 2, 1024, 8), heads=2, rand=3, head_dim=8, blocks=(64, 64), lengths=(1024, 1024), seed=1,
                        blocked=True, plan=(None, None))  # fmt: skip
    scores = (q @ k.transpose(-1, -2)) / 8**0.5 - 1e9 * (1 - mask[:, None, None, :])
    assert out.shape == (2, 2, n, 8)
    torch.testing.assert_close(out, scores.softmax(-1) @ v * mask[:, None, :, None])
    with pytest.raises(ValueError, match="more than 11 blocks"):
        adapter(q[:, :, :640], k[:, :, :640], v[:, :, :640], mask[:, :640])


def test_longformer_adapter_ties_all_six_projections_and_passes_hf_its_masks(imported):
    attention = importlib.import_module("attention").Attention(dict(CONFIG, attn_type="longformer-512"))
    adapter = adapters.LongformerAdapter(attention, CONFIG, {"window": 512, "num_global_tokens": 1, "dropout": 0.1}, layer=1)
    hf = adapter.hf
    assert hf.layer_id == 1 and hf.config.attention_window == [512, 512] and hf.config.attention_probs_dropout_prob == 0.1
    for ours, theirs in (("query", attention.W_q), ("key", attention.W_k), ("value", attention.W_v)):
        for name in (ours, f"{ours}_global"):
            assert getattr(hf, name).weight is theirs.weight and getattr(hf, name).bias is theirs.bias
    n = 700  # padded to 1024, a multiple of the window
    X = torch.randn(2, n, 16)
    mask = torch.ones(2, n)
    mask[1, :3] = 0  # a padded first token is no global token
    mask[0, 650:] = 0
    out = adapter(X, mask)
    last = type(hf).last
    assert out.shape == (2, n, 16) and last["shape"] == (2, 1024, 16)
    expected = torch.zeros(2, 1024)
    expected[0, 0], expected[0, 650:], expected[1, :3], expected[1, 700:] = 10000, -10000, -10000, -10000
    assert torch.equal(last["mask"], expected)
    assert torch.equal(last["masked"], expected < 0) and torch.equal(last["global_"], expected > 0)
    assert last["any_global"] is True
    # The same linear maps as their W_q/W_k/W_v: dense attention over the real keys, as the stand-in computes it.
    split = lambda t: t.view(2, n, 2, 8).transpose(1, 2)  # noqa: E731
    q, k, v = split(attention.W_q(X)), split(attention.W_k(X)), split(attention.W_v(X))
    scores = (q @ k.transpose(-1, -2)) / 8**0.5 - 1e9 * (1 - mask[:, None, None, :])
    torch.testing.assert_close(out, (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, n, 16))
    with pytest.raises(ValueError, match="heads \\* head_dim"):
        adapters.LongformerAdapter(
            attention, dict(CONFIG, transformer_dim=32), {"window": 512, "num_global_tokens": 1, "dropout": 0}, 0
        )


def test_sinkhorn_adapter_builds_lucidrains_attention_with_our_rows_settings(imported):
    hparams = {"block_size": 50, "sinkhorn_iterations": 1, "temperature": 1.0, "dropout": 0.1}
    adapter = adapters.SinkhornAdapter(CONFIG, hparams, layer=0)
    assert adapter.sinkhorn.kwargs == dict(
        bucket_size=50, dim=16, dim_heads=8, heads=2, max_seq_len=2050, temperature=1.0, non_permutative=False,
        sinkhorn_iter=1, n_sortcut=0, dropout=0.1, use_simple_sort_net=True,
    )  # fmt: skip
    n = 120  # padded to 150
    q, k, v = (torch.randn(3, 2, n, 8) for _ in range(3))
    mask = torch.ones(3, n)
    mask[2, 90:] = 0
    out = adapter(q, k, v, mask)
    last = type(adapter.sinkhorn).last
    assert last["shape"] == (3, 2, 150, 8) and last["q_mask"].dtype == torch.bool and last["q_mask"] is last["kv_mask"]
    assert last["q_mask"][:, n:].sum() == 0 and last["q_mask"][:, :n].sum() == 3 * n - 30
    assert torch.equal(out, v * mask[:, None, :, None].bool())


def test_install_puts_one_adapter_per_layer_in_layer_order(imported):
    attention = importlib.import_module("attention").Attention
    model = importlib.import_module("model_wrapper").ModelForSC(
        dict(CONFIG, attn_type="bigbird-64", vocab_size=32, num_classes=10)
    )
    assert adapters.install("bigbird", model, attention, CONFIG, {"block_size": 64, "num_random_blocks": 3}) == 2
    assert [layer.attn.sparse.seed for layer in model.layers] == [0, 1]
    with pytest.raises(KeyError, match="no adapter for row 'yoso'"):
        adapters.install("yoso", model, attention, CONFIG, {})


def test_pad_to_pads_the_named_dimension_and_the_mask():
    x, mask = torch.ones(2, 3, 5, 4), torch.ones(2, 5)
    pad, (padded,), padded_mask = adapters.pad_to(4, x, dim=2, mask=mask)
    assert pad == 3 and padded.shape == (2, 3, 8, 4) and padded[:, :, 5:].abs().sum() == 0
    assert padded_mask.shape == (2, 8) and padded_mask[:, 5:].sum() == 0
    assert adapters.pad_to(5, x, dim=2, mask=mask)[0] == 0


def test_new_rows_run_in_their_model_and_record_the_implementation(their_code, packages, tmp_path):
    out = tmp_path / "results"
    argv = ["--authors-code", str(their_code), "--extra-path", str(packages), "--rows", "longformer,sinkhorn,bigbird"]
    argv += ["--rounds", "1", "--batch", "2", "--seq-len", "64", "--device", "cpu", "--authors-commit", "abc", "--out", str(out)]
    assert authors.main(argv) == 0
    with open(out / "authors_cpu.csv", newline="") as file:
        rows = {row["row"]: row for row in csv.DictReader(file)}
    for name in ("longformer", "sinkhorn"):
        assert rows[name]["status"] == "ok", rows[name]["error"]
        assert float(rows[name]["ratio"]) > 0 and rows[name]["differences"] == adapters.DIFFERENCES[name]
    assert rows["longformer"]["their_attention"] == "longformer-512"
    assert rows["longformer"]["implementation"].endswith("LongformerSelfAttention in their model (lra.bench adapter)")
    assert rows["sinkhorn"]["implementation"].startswith("sinkhorn-transformer ")  # the stand-in has no metadata: "?"
    assert rows["bigbird"]["status"] == "failed" and "more than 11 blocks" in rows["bigbird"]["error"]  # 64 tokens: 1 block
    assert "transformers" not in sys.modules and "attention" not in sys.modules


@pytest.fixture
def real_transformers():
    """The ``--extra-path`` folders where the real transformers is: none where it is installed, else
    ``$LRA_BENCH_EXTRA_PATH`` (e.g. a ``pip install --target DIR transformers``, never this project's dependency)."""
    if importlib.util.find_spec("transformers") is not None:
        return []
    folders = [Path(folder) for folder in os.environ.get("LRA_BENCH_EXTRA_PATH", "").split(os.pathsep) if folder]
    if not any((folder / "transformers" / "models" / "longformer").is_dir() for folder in folders):
        pytest.skip("transformers is not importable here (set LRA_BENCH_EXTRA_PATH to a folder holding it)")
    return folders


def test_with_the_real_transformers_the_longformer_adapter_is_our_longformer(their_code, real_transformers):
    from attention_zoo.longformer import LongformerAttention, LongformerConfig

    with authors.their_imports(their_code, None, real_transformers):
        attention = importlib.import_module("attention").Attention(dict(CONFIG, attn_type="longformer-512"))
        adapter = adapters.LongformerAdapter(attention, CONFIG, {"window": 512, "num_global_tokens": 1, "dropout": 0.1}, 0)
        adapter.eval()
        torch.manual_seed(0)
        n = 1100
        X, mask = torch.randn(2, n, 16), torch.ones(2, n)
        mask[0, 900:] = 0
        theirs = adapter(X, mask)
        split = lambda t: t.view(2, n, 2, 8).transpose(1, 2)  # noqa: E731
        q, k, v = split(attention.W_q(X)), split(attention.W_k(X)), split(attention.W_v(X))
        ours = LongformerAttention(seq_len=n, num_heads=2, head_dim=8, config=LongformerConfig(512, 1, 0.1)).eval()
        ours = ours.attend(q, k, v, mask.bool()).transpose(1, 2).reshape(2, n, 16)
        real = mask.bool()
        torch.testing.assert_close(theirs[real], ours[real], rtol=1e-5, atol=1e-5)


def test_with_the_real_transformers_the_bigbird_adapter_keeps_its_random_blocks_per_layer(their_code, real_transformers):
    from attention_zoo.bigbird import BigBirdAttention, BigBirdConfig

    with authors.their_imports(their_code, None, real_transformers):
        adapter = adapters.BigBirdAdapter(CONFIG, {"block_size": 64, "num_random_blocks": 3}, layer=1).train()
        torch.manual_seed(0)
        q, k, v = (torch.randn(2, 2, 2048, 8) for _ in range(3))
        mask = torch.ones(2, 2048)
        mask[1, 1000:] = 0
        first = adapter(q, k, v, mask)
        assert torch.equal(first, adapter(q, k, v, mask))  # HF reseeds numpy with the layer in training
        ours = BigBirdAttention(seq_len=2048, num_heads=2, head_dim=8, config=BigBirdConfig(64, 3, None)).attend(
            q, k, v, mask.bool()
        )
        torch.testing.assert_close(first[:, :, :64], ours[:, :, :64])  # the first block is global: full attention in both


def test_with_the_real_transformers_their_reformer_builds(their_code, real_transformers):
    with authors.their_imports(their_code, None, real_transformers):
        module = importlib.import_module("transformers.modeling_reformer")
        assert module is sys.modules["transformers.models.reformer.modeling_reformer"]
        config = module.ReformerConfig()
        assert (config.lsh_attn_chunk_length, config.lsh_num_chunks_before, config.lsh_num_chunks_after) == (64, 1, 0)
        assert config.lsh_attention_probs_dropout_prob == 0.0 and config.num_buckets is None
        assert issubclass(module.LSHSelfAttention, nn.Module)
