"""``python -m lra.bench train``: the full training step per task and attention, its rows, ratios and data-loading line."""

import csv

import pytest
import torch

from lra import config
from lra.bench import train
from lra.bench.efficiency import entries
from lra.data.tasks import get_spec


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def entry(row):
    return next(e for e in entries() if e.row == row)


def test_writes_a_row_per_task_and_attention_with_ratios_and_a_data_loading_line(tmp_path, monkeypatch):
    monkeypatch.setenv("LRA_DATA_DIR", str(tmp_path / "data"))  # no data here: ListOps is generated, Retrieval skipped
    out = tmp_path / "results"
    argv = ["--tasks", "listops", "retrieval", "--attentions", "yoso_32", "none", "--seq-len", "64", "--batch", "2"]
    assert train.main([*argv, "--steps", "1", "--warmup", "0", "--quiet", "--out", str(out)]) == 0

    with open(out / "train_cpu.csv", newline="") as f:
        assert next(csv.reader(f)) == train.FIELDS
    rows = read_rows(out / "train_cpu.csv")
    assert [(r["task"], r["attention"], r["data_loading"]) for r in rows] == [
        ("listops", "none", "False"),
        ("listops", "yoso_32", "False"),
        ("listops", "none", "True"),
        ("retrieval", "none", "False"),
        ("retrieval", "yoso_32", "False"),
        ("retrieval", "none", "True"),
    ]
    assert (out / "train_cpu.png").stat().st_size > 0
    assert {r["seq_len"] for r in rows} == {"64"} and {r["batch"] for r in rows} == {"2"}
    assert [r["inputs"] for r in rows] == ["1"] * 3 + ["2"] * 3  # Retrieval's dual encoder: two documents per sample
    assert {(r["compiled"], r["precision"], r["steps"], r["threads"]) for r in rows} == {
        ("False", "32", "1", str(torch.get_num_threads()))
    }

    measured = [r for r in rows if r["status"] == "ok"]
    assert len(measured) == 5
    for task in ("listops", "retrieval"):
        floor = next(r for r in measured if r["task"] == task and r["attention"] == "none" and r["data_loading"] == "False")
        assert float(floor["ratio_to_none"]) == 1.0
        for row in (r for r in measured if r["task"] == task):
            assert float(row["ratio_to_none"]) == pytest.approx(float(row["step_ms"]) / float(floor["step_ms"]), abs=1e-3)
    for row in measured:
        assert float(row["step_ms"]) > 0 and float(row["memory_mb"]) >= 0
        assert float(row["samples_per_s"]) == pytest.approx(2 / float(row["step_ms"]) * 1e3, rel=1e-3)
        assert 0 < float(row["padding"]) < 1  # ListOps and Retrieval inputs are zero-padded

    loading, skipped = rows[2], rows[5]
    assert loading["status"] == "ok" and loading["data_source"].startswith("generated here")
    assert skipped["status"] == "skipped" and skipped["ratio_to_none"] == "" and skipped["step_ms"] == ""

    # A part of the grid in another precision goes into the same file: the earlier rows stay, its ratios are its own.
    argv = ["--tasks", "listops", "--attentions", "none", "--seq-len", "64", "--batch", "2", "--precision", "bf16-mixed"]
    assert train.main([*argv, "--steps", "1", "--warmup", "0", "--quiet", "--out", str(out)]) == 0
    merged = read_rows(out / "train_cpu.csv")
    assert merged[:6] == rows
    assert [(r["task"], r["attention"], r["data_loading"], r["precision"]) for r in merged[6:]] == [
        ("listops", "none", "False", "bf16 autocast (attention in float32)"),
        ("listops", "none", "True", "bf16 autocast (attention in float32)"),
    ]
    assert float(merged[6]["ratio_to_none"]) == 1.0
    assert "retrieval data is 4096 tokens long, not 64" in skipped["error"] and "nothing is downloaded" in skipped["error"]


@pytest.mark.parametrize("precision", ["32", "bf16-mixed"])
def test_the_timed_step_updates_the_weights_and_advances_the_schedule(precision):
    cfg = train.task_config("listops", torch.device("cpu"))
    module = train.build_module(cfg, entry("softmax"), 32).train()
    assert (module.hparams.lr, module.hparams.max_steps) == (cfg.task.protocol.lr, cfg.task.protocol.max_steps)
    step = train.TrainingStep(module, precision)
    batch = train.random_batch(cfg, 32, 2, torch.Generator().manual_seed(0))
    before = {name: p.detach().clone() for name, p in module.named_parameters()}
    first_lr = step.scheduler.get_last_lr()[0]

    loss = step(batch)

    assert torch.isfinite(loss) and loss.dtype == torch.float32
    changed = [name for name, p in module.named_parameters() if not torch.equal(p, before[name])]
    assert "model.head.2.weight" in changed and "model.encoder.blocks.0.attention.query.weight" in changed
    assert step.scheduler.last_epoch == 1 and step.scheduler.get_last_lr()[0] > first_lr  # OneCycleLR's warm-up
    assert all("exp_avg" in step.optimizer.state[p] for p in module.parameters())  # AdamW took the step
    assert module.train_acc.update_count == 1


def test_random_batches_have_each_tasks_shape_vocabulary_and_padding():
    generator = torch.Generator().manual_seed(0)
    for task in train.TASKS:
        cfg = train.task_config(task, torch.device("cpu"))
        spec = get_spec(task)
        batch = train.random_batch(cfg, 2048, 64, generator)
        assert set(batch) == {*spec.inputs, "label"}
        assert batch["label"].shape == (64,) and int(batch["label"].max()) < spec.num_classes
        for name in spec.inputs:
            ids = batch[name]
            assert ids.shape == (64, 2048) and ids.dtype == torch.int64
            assert 0 <= int(ids.min()) <= int(ids.max()) < spec.vocab_size
        share = train.padding_share(batch)
        if task == "listops":  # real lengths 501..1999 of 2048 (the generator's bounds): zeros after them only
            lengths = (batch["input_ids"] != 0).sum(1)
            assert 501 <= int(lengths.min()) and int(lengths.max()) <= 1999
            assert torch.equal(batch["input_ids"] != 0, torch.arange(2048) < lengths[:, None])
        elif task == "pathfinder":
            assert share == pytest.approx(train.BLACK_PIXEL_SHARE["pathfinder"], abs=0.01)
        elif task == "image":
            assert share < 0.01  # CIFAR's black pixels are rare
        else:
            assert 0.02 < share < 0.98  # Text and Retrieval: lengths 1..4000 of 4096


def test_an_unknown_attention_or_length_is_one_clear_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        train.main(["--attentions", "bogus", "none"])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert "unknown attention(s) ['bogus']; available: " in error and "Traceback" not in error
    available = error.split("available: ", 1)[1].split("\n", 1)[0].split(", ")
    assert available == sorted(config.attention_rows()), "every row of conf/attention, sorted"
    with pytest.raises(SystemExit):
        train.main(["--seq-len", "0"])
    assert "a sequence length is 'paper' (the task's own) or a positive integer, got '0'" in capsys.readouterr().err
