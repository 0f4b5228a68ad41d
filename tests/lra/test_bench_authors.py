"""``python -m lra.bench authors`` on a stand-in of the authors' code written here: the CLI, the CSV and the ratio."""

import csv
import statistics
import sys
import textwrap
import types

import pytest

from lra.bench import authors

MODEL_WRAPPER = '''
import torch
from torch import nn


class ModelForSC(nn.Module):
    """The interface of mlpen/Nystromformer's LRA/code model_wrapper.ModelForSC, on a tiny model."""

    def __init__(self, config):
        super().__init__()
        if config["attn_type"] == "performer-256":
            import performer_pytorch  # noqa: F401  (absent here: the row fails and is recorded)
        assert config["mixed_precision"] is False and config["max_seq_len"] == 2048 and config["seq_len"] == 64
        self.embeddings = nn.Embedding(config["vocab_size"], config["transformer_dim"])
        self.head = nn.Linear(config["transformer_dim"], config["num_classes"])

    def forward(self, input_ids_0, mask_0, label):
        pooled = (self.embeddings(input_ids_0) * mask_0[:, :, None]).mean(dim=1)
        scores = self.head(pooled)
        return {"loss": nn.functional.cross_entropy(scores, label, reduction="none"), "accu": scores.argmax(-1) == label}
'''

LRA_CONFIG = """
config = {
    "listops": {
        "model": {"vocab_size": 32, "transformer_dim": 16, "num_classes": 10, "max_seq_len": 2000},
        "training": {"learning_rate": 1e-4, "warmup": 10, "lr_decay": "linear", "weight_decay": 0, "num_train_steps": 100},
        "extra_attn_config": {"softmax": {"attention_grad_checkpointing": True}, "performer-256": {"rp_dim": 256}},
    }
}
"""


@pytest.fixture
def stand_in(tmp_path):
    code = tmp_path / "LRA" / "code"
    code.mkdir(parents=True)
    (code / "model_wrapper.py").write_text(textwrap.dedent(MODEL_WRAPPER))
    (code / "lra_config.py").write_text(textwrap.dedent(LRA_CONFIG))
    return code


def test_rows_times_ratio_and_failures_go_to_the_csv(stand_in, tmp_path, capsys):
    out = tmp_path / "results"
    argv = ["--authors-code", str(stand_in), "--rows", "none,softmax", "performer", "--rounds", "3"]
    argv += ["--batch", "2", "--seq-len", "64", "--device", "cpu", "--authors-commit", "abc123", "--out", str(out)]
    assert authors.main(argv) == 0
    with open(out / "authors_cpu.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert list(rows[0]) == authors.FIELDS
    assert [row["row"] for row in rows] == ["none", "softmax", "performer"]
    for row in rows[:2]:
        assert row["status"] == "ok", row["error"]
        theirs, ours = ([float(t) for t in row[side].split()] for side in ("their_rounds_s", "our_rounds_s"))
        assert len(theirs) == len(ours) == 3
        expected = statistics.median(t / o for t, o in zip(theirs, ours, strict=True))
        assert float(row["ratio"]) == pytest.approx(expected, rel=2e-3, abs=1e-3)  # 3 decimals, from rounds of 4 digits
        assert float(row["their_s"]) == pytest.approx(statistics.median(theirs), rel=1e-3)
        assert row["authors_commit"] == "abc123" and row["seq_len"] == "64" and row["batch"] == "2" and row["rounds"] == "3"
        assert row["date"] and row["device"] and float(row["padding"]) > 0
    assert rows[0]["their_attention"] == "none" and rows[1]["their_attention"] == "softmax"
    assert rows[2]["status"] == "failed" and "performer_pytorch" in rows[2]["error"]
    assert "model_wrapper" not in sys.modules and str(stand_in) not in sys.path  # their imports undone
    # A later run of one row replaces that row and keeps the others.
    argv[argv.index("--rows") + 1 : argv.index("--rounds")] = ["none"]
    assert authors.main(argv) == 0
    with open(out / "authors_cpu.csv", newline="") as file:
        assert sorted(row["row"] for row in csv.DictReader(file)) == ["none", "performer", "softmax"]
    assert "theirs/ours" in capsys.readouterr().out


def test_their_config_is_their_run_tasks_in_float32():
    lra_config = types.SimpleNamespace(config={})
    exec(textwrap.dedent(LRA_CONFIG), vars(lra_config))
    model, training = authors.their_config(lra_config, "softmax", 2048)
    assert model["attention_grad_checkpointing"] is True and model["attn_type"] == "softmax" and model["seq_len"] == 2048
    assert model["mixed_precision"] is False and model["max_seq_len"] == 2048 and training["num_train_steps"] == 100
    model, _ = authors.their_config(lra_config, "none", 64)  # no entry of theirs: no checkpointing
    assert model["attention_grad_checkpointing"] is False and model["seq_len"] == 64
    with pytest.raises(ValueError, match="positions reach 2048"):
        authors.their_config(lra_config, "none", 4096)


def test_einops_stand_in_repeats_as_fast_attention_does():
    import torch

    repeat = authors.einops_stand_in().repeat
    projection = torch.randn(5, 3)
    assert torch.equal(repeat(projection, "j d -> b h j d", b=2, h=4), projection.expand(2, 4, 5, 3))
    with pytest.raises(NotImplementedError, match="j d -> b h j d"):
        repeat(projection, "j d -> d j")


def test_unknown_rows_and_a_folder_without_their_code_are_refused(stand_in, tmp_path):
    with pytest.raises(SystemExit):
        authors.main(["--authors-code", str(stand_in), "--rows", "yoso"])
    with pytest.raises(SystemExit):
        authors.main(["--authors-code", str(tmp_path)])
