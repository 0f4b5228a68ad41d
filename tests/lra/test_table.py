"""``python -m lra.table``: run records -> Table 3 (Markdown, CSV, LaTeX, figure)."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from lra import table

REPO = Path(__file__).resolve().parents[2]
SMOKE = dict(
    name="smoke",
    batch_size=32,
    max_steps=400,
    warmup_steps=40,
    val_check_interval=50,
    limit_val_batches=8,
    lr=1e-3,
    weight_decay=0.0,
)
MODEL = dict(dim=64, depth=2, num_heads=2, head_dim=32, ffn_dim=128, dropout=0.1, head_hidden_dim=128, attention_in_fp32=True)


def record(
    row,
    task,
    seed,
    acc,
    status="finished",
    source="generated",
    num_test=1000,
    finished_at="2026-01-01T00:00:00",
    protocol=None,
    model=None,
    hparams=None,
    **extra,
):
    """A run record as lra.train writes it; the config hash stands for the whole configuration."""
    protocol = protocol or SMOKE
    hparams = {"dropout": 0.1} if hparams is None else hparams
    config = dict(task=task, row=row, protocol=protocol, model=model or MODEL, hparams=hparams, seed=seed)
    result = {
        "task": task,
        "attention": row.split(" ")[0],
        "row": row,
        "seed": seed,
        "status": status,
        "attention_hparams": hparams,
        "protocol": protocol,
        "model": model or MODEL,
        "seq_len": 256,
        "data": {"source": "generated", "max_length": 250},
        "finished_at": finished_at,
        "config_hash": hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16],
        "best_checkpoint": "/somewhere/best.ckpt",
        **extra,
    }
    if status == "finished":
        result.update(test_acc=acc, data_source=source, num_samples={"train": 2000, "val": 256, "test": num_test})
    else:
        result["error"] = extra.get("error", "RuntimeError: out of memory")
    return result


def write_runs(folder, records):
    for i, r in enumerate(records):
        run = folder / f"run{i}"
        run.mkdir(parents=True)
        (run / "results.json").write_text(json.dumps(r))


def only(sections, title):
    (section,) = [s for s in sections if s.title == title]
    return section


def test_runs_with_different_budgets_are_never_averaged_as_seeds():
    """The issue's case: smoke softmax/ListOps runs of 400, 20 and 10 steps, all seed 0, and failures."""
    records = [
        record("softmax", "listops", 0, 0.3125),
        record("softmax", "listops", 0, 0.15, protocol={**SMOKE, "max_steps": 20}),
        record("softmax", "listops", 0, 0.14, protocol={**SMOKE, "max_steps": 10}),
        record("softmax", "listops", 0, None, status="failed", finished_at="2025-01-01T00:00:00"),  # finished later
        record("softmax", "listops", 0, None, status="failed", protocol={**SMOKE, "max_steps": 5}),
    ]
    sections = table.build_sections(records)
    assert [s.title for s in sections] == [
        "smoke, protocol.max_steps=10",
        "smoke, protocol.max_steps=20",
        "smoke, protocol.max_steps=400",
        "smoke, protocol.max_steps=5",
    ]
    cell = only(sections, "smoke, protocol.max_steps=400").cells["softmax", "listops"]
    assert cell.accuracies == [31.25] and cell.seeds == [0]
    text = table.markdown(sections, "test records")
    assert "## smoke, protocol.max_steps=400" in text and "| softmax | 31.25 ± 1.47† |" in text
    # Only the configuration with no finished run did not finish.
    assert text.count("Did not finish") == 1
    assert "- listops / softmax / seed 0: failed: RuntimeError: out of memory" in text.split("max_steps=5")[1]


def test_seeds_of_one_configuration_pool_and_a_repeated_seed_counts_once():
    records = [
        record("softmax", "listops", 0, 0.36),
        record("softmax", "listops", 1, 0.38),
        # The same configuration and seed run again: the latest finished counts, and the table says so.
        record("softmax", "listops", 1, 0.30, finished_at="2026-02-01T00:00:00"),
    ]
    records[2]["config_hash"] += "-other-machine"
    copy = dict(records[0])  # one run found twice (outputs/ and results/runs/) is one record
    (section,) = table.build_sections([*records, copy])
    cell = section.cells["softmax", "listops"]
    assert cell.accuracies == [36.0, 30.0] and cell.seeds == [0, 1]
    assert cell.standard_error == pytest.approx(cell.std / 2**0.5) and cell.std == pytest.approx(4.2426, rel=1e-4)
    assert section.duplicates == [
        "listops / softmax / seed 1: 2 runs of one configuration, the latest (2026-02-01T00:00:00) counts"
    ]
    assert "Counted once:" in table.markdown([section], "test records")


def test_one_seed_shows_the_binomial_standard_error_of_its_test_samples():
    (section,) = table.build_sections([record("softmax", "listops", 0, 0.331, num_test=1000)])
    assert section.cells["softmax", "listops"].standard_error == pytest.approx(100 * (0.331 * 0.669 / 1000) ** 0.5)
    assert "Test samples: ListOps 1000." in table.markdown([section], "test records")


def test_best_is_bold_only_beyond_the_noise():
    chance = [record("yoso_c_16", "pathfinder", 0, 0.511, hparams={}), record("none", "pathfinder", 0, 0.508, hparams={})]
    (section,) = table.build_sections(chance)
    assert section.best("pathfinder") is None and "**" not in table.markdown([section], "test records")
    clear = [record("softmax", "listops", 0, 0.37), record("none", "listops", 0, 0.17, hparams={})]
    (section,) = table.build_sections(clear)
    assert section.best("listops") == "softmax"
    assert "| softmax | **37.00 ± 1.53**† |" in table.markdown([section], "test records")


def paper_record(row, task, seed, acc, **changes):
    protocol, model = table.paper_setup(task)
    return record(row, task, seed, acc, source="lra_release", protocol={**protocol, **changes}, model=model)


def test_the_paper_comparison_only_under_the_papers_protocol_and_model():
    (paper,) = table.build_sections([paper_record("softmax", "listops", 0, 0.36), paper_record("softmax", "listops", 1, 0.38)])
    assert paper.paper_protocol
    text = table.markdown([paper], "test records")
    assert "| softmax | 37.00 ± 1.00 (37.10, -0.10) |" in text
    # Named "paper" but shortened: no comparison, and the reason is given.
    (short,) = table.build_sections([paper_record("softmax", "listops", 0, 0.30, max_steps=1000)])
    assert not short.paper_protocol and short.not_paper_because == "protocol.max_steps"
    assert "(37.10" not in table.markdown([short], "test records")
    assert "The paper's protocol with other settings (protocol.max_steps)" in table.markdown([short], "test records")
    (smoke,) = table.build_sections([record("softmax", "listops", 0, 0.30)])
    assert "Protocol `smoke`, not the paper's" in table.markdown([smoke], "test records")


def test_average_over_the_five_tasks_and_unknown_rows_after_the_paper_rows():
    records = [paper_record("softmax", task, 0, 0.5 + 0.1 * i) for i, task in enumerate(table.TASKS)]
    records.append(paper_record("my_attention", "image", 0, 0.9))
    (section,) = table.build_sections(records)
    assert section.average("softmax") == pytest.approx(70.0)
    assert section.rows == ["softmax", "my_attention"]
    frame = table.cells_frame([section])
    softmax = frame[(frame.row == "softmax") & (frame.task == "listops")].iloc[0]
    assert (softmax["num_seeds"], softmax["mean"], softmax["paper"], softmax["difference"]) == (1, 50.0, 37.10, 12.9)
    assert pd.isna(frame[frame.row == "my_attention"].iloc[0]["paper"])


def test_a_row_whose_runs_still_differ_is_split_and_labelled():
    records = [
        record("yoso_32", "listops", 0, 0.33, hparams={"num_hashes": 32}),
        record("yoso_32", "listops", 1, 0.35, hparams={"num_hashes": 16}),
        record("softmax", "listops", 0, 0.33),
    ]
    (section,) = table.build_sections(records)
    assert section.rows == ["softmax", "yoso_32 (attention_hparams.num_hashes=16)", "yoso_32 (attention_hparams.num_hashes=32)"]


def test_a_plain_table_goes_to_the_outputs_and_the_committed_one_from_committed_records(tmp_path):
    outputs, results = tmp_path / "outputs", tmp_path / "results"
    write_runs(outputs, [record("softmax", "listops", s, 0.3 + s / 100) for s in range(3)])
    committed = record("yoso_32", "pathfinder", 0, 0.7, hparams={})
    (results / "runs").mkdir(parents=True)
    (results / "runs" / "committed.json").write_text(json.dumps(committed))
    args = ["--runs", str(outputs), "--results", str(results), "--out", str(outputs)]

    table.main(args)
    assert sorted(p.name for p in results.iterdir()) == ["runs"], "a plain lra.table never writes into results/"
    user = (outputs / "table3.md").read_text()
    assert "| softmax | 31.00 ± 0.58† | – |" in user and "| yoso-32 | – | 70.00 ± 1.45† |" in user

    table.main([*args, "--committed"])
    first = {p.name: p.read_bytes() for p in results.iterdir() if p.is_file()}
    assert set(first) == {"table3.md", "table3.csv", "table3.tex", "table3.png"}
    assert "softmax" not in first["table3.md"].decode(), "the committed table holds committed runs only"
    table.main([*args, "--committed"])
    assert {p.name: p.read_bytes() for p in results.iterdir() if p.is_file()} == first, "same records, same bytes"

    table.main([*args, "--collect"])
    collected = sorted((results / "runs").glob("listops__softmax__smoke__seed*.json"))
    assert len(collected) == 3 and all("best_checkpoint" not in json.loads(p.read_text()) for p in collected)
    assert "| softmax | 31.00 ± 0.58† | – |" in (results / "table3.md").read_text()
    frame = pd.read_csv(results / "table3.csv")
    assert list(frame.columns[:8]) == ["section", "protocol", "row", "task", "num_seeds", "seeds", "num_test", "mean"]


def test_the_committed_tables_are_what_lra_table_makes_of_the_committed_records(tmp_path):
    shutil.copytree(REPO / "results" / "runs", tmp_path / "results" / "runs")
    subprocess.run(
        [sys.executable, "-m", "lra.table", "--committed"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    subprocess.run(
        [sys.executable, "-m", "lra.table", "--committed", "--protocol", "spt_short", "--name", "spt"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    for name in ("table3.md", "table3.csv", "table3.tex", "spt.md", "spt.csv", "spt.tex"):
        assert (tmp_path / "results" / name).read_text() == (REPO / "results" / name).read_text(), name


@pytest.mark.slow
def test_table_from_real_runs(tmp_path, run_train):
    run_train("attention=softmax,none", flags=["-m"])
    env = {**os.environ, "LRA_OUTPUT_DIR": str(tmp_path / "outputs")}
    process = subprocess.run(
        [sys.executable, "-m", "lra.table"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert process.returncode == 0, process.stderr
    text = (tmp_path / "outputs" / "table3.md").read_text()
    assert "## smoke" in text and "| softmax |" in text and "| none |" in text
    assert not (tmp_path / "results").exists()
    process = subprocess.run(
        [sys.executable, "-m", "lra.table", "--collect"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert process.returncode == 0, process.stderr
    assert len(list((tmp_path / "results" / "runs").glob("listops__*__smoke__seed0__*.json"))) == 2
    assert "| softmax |" in (tmp_path / "results" / "table3.md").read_text()


def test_from_scratch_pretrained_and_rotary_runs_are_separate_labelled_sections():
    mlm = {"objective": "mlm", "mask_rate": 0.15, "protocol": SMOKE}
    longer = {**mlm, "protocol": {**SMOKE, "max_steps": 800}}
    records = [
        record("softmax", "listops", 0, 0.30),  # written before pretrain and positions existed
        record("softmax", "listops", 1, 0.32, pretrain={"objective": "none"}, model={**MODEL, "positions": "learned"}),
        record("softmax", "listops", 0, 0.40, pretrain=mlm),
        record("softmax", "listops", 1, 0.42, pretrain=mlm),
        record("softmax", "listops", 0, 0.50, pretrain=longer),
        record("softmax", "listops", 0, 0.60, pretrain=mlm, model={**MODEL, "positions": "rotary"}),
    ]
    for r in records:  # the hash stands for the whole configuration, pretraining and positions included
        r["config_hash"] = hashlib.sha256(json.dumps([r["config_hash"], r.get("pretrain"), r["model"]]).encode()).hexdigest()[:16]
    sections = {s.title: s for s in table.build_sections(records)}
    scratch = sections["smoke, model.positions=learned, pretrain=none (from scratch)"]
    assert scratch.cells["softmax", "listops"].seeds == [0, 1]  # the old record is a from-scratch, learned run
    pretrained = sections["smoke, model.positions=learned, pretrain=mlm (mask_rate=0.15, protocol as fine-tuning)"]
    assert pretrained.cells["softmax", "listops"].accuracies == pytest.approx([40.0, 42.0])
    assert sections["smoke, model.positions=learned, pretrain=mlm (mask_rate=0.15, max_steps=800)"]
    rotary = sections["smoke, model.positions=rotary, pretrain=mlm (mask_rate=0.15, protocol as fine-tuning)"]
    assert rotary.cells["softmax", "listops"].accuracies == pytest.approx([60.0])
    assert len(sections) == 4


def test_pretraining_runs_are_not_cells(tmp_path):
    write_runs(tmp_path, [record("softmax", "listops", 0, 0.3), record("softmax", "listops", 0, 0.9, stage="pretraining")])
    assert [r["test_acc"] for r in table.find_records([tmp_path])] == [0.3]


def test_one_protocols_table_under_its_own_name(tmp_path):
    write_runs(
        tmp_path / "outputs",
        [record("softmax", "listops", 0, 0.3), record("yoso_32", "listops", 0, 0.4, protocol={**SMOKE, "name": "spt_short"})],
    )
    table.main(
        [
            "--runs",
            str(tmp_path / "outputs"),
            "--results",
            str(tmp_path / "results"),
            "--out",
            str(tmp_path / "out"),
            "--protocol",
            "spt_short",
            "--name",
            "spt",
        ]
    )
    text = (tmp_path / "out" / "spt.md").read_text()
    assert "## spt_short" in text and "yoso-32" in text.lower() and "smoke" not in text
    assert not (tmp_path / "out" / "table3.md").exists()
