"""What a new user met following the README and the docs (issue 71): each case as they met it, and what it does now."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import kill_at_step
import pytest
import torch
from omegaconf import OmegaConf
from tiny_listops import TINY

from lra import campaign, checkpoints, config, run_lock
from lra.campaign.plan import Cell, Plan
from lra.data.tasks import prepare_task
from lra.results import RunRecord
from lra.sweep import summary


@pytest.mark.slow
def test_a_run_whose_configuration_changed_keeps_the_earlier_one_in_history_and_says_so(tmp_path, run_train):
    """Interrupted, then its experiment's lr edited and the same command run again: the earlier last.ckpt and metrics
    were overwritten in silence, its best checkpoint left beside the new run's. The folder is fixed here as the same
    command's would be."""
    folder = tmp_path / "outputs" / "the-same-commands-folder"
    killed = run_train(kill_at_step.OVERRIDE, f"hydra.run.dir={folder}", check=False, env=kill_at_step.environment(4))
    assert killed.returncode != 0 and (folder / "checkpoints" / "last.ckpt").is_file()
    earlier = RunRecord.read(folder / "results.json")
    again = run_train("task.protocol.lr=2e-3", f"hydra.run.dir={folder}")
    [kept] = (folder / "history").iterdir()
    assert RunRecord.read(kept / "record.json").config_hash == earlier.config_hash
    assert checkpoints.step(kept / "checkpoints" / "last.ckpt") == 3 and (kept / "metrics" / "metrics.csv").is_file()
    said = [line for line in (again.stdout + again.stderr).splitlines() if "held a run of another configuration" in line]
    assert len(said) == 1 and str(kept) in said[0] and "starts from step 0" in said[0], again.stderr[-2000:]
    now = RunRecord.read(folder / "results.json")
    assert now.status == "finished" and now.config_hash != earlier.config_hash and not now.resumed_from
    assert sorted(p.name for p in (folder / "checkpoints").glob("best-*.ckpt")) == [Path(now.best_checkpoint).name]


def test_the_summary_of_an_interrupted_cell_says_where_it_resumes(tmp_path):
    """A cut cell's summary said "the job ended without a record" where its results.json said interrupted."""
    RunRecord(task="listops", row="softmax", seed=0, status="interrupted", steps=218).write(tmp_path / "results.json")
    lines, failed = summary([{"folder": str(tmp_path)}])
    assert failed == 1 and "interrupted at step 218: the same command resumes it from its last.ckpt" in lines[1]


def a_plan(folder: Path, cells: list[Cell]) -> Plan:
    plan = Plan(["x"], 1, 2, 1, 2, str(folder), str(folder / "outputs"), str(folder / "runs"), "2026-12", "vm", [], cells)
    plan.write(folder)
    return plan


def test_the_status_of_a_stopped_cell_is_the_step_it_resumes_at(tmp_path):
    """status showed the last metrics row's step (201) where the checkpoint and unpack said 218."""
    run = tmp_path / "outputs" / "cell"
    (run / "metrics").mkdir(parents=True)
    (run / "metrics" / "metrics.csv").write_text("epoch,step,train/loss,val/acc\n0,150,2.0,\n0,200,,0.25\n0,200,1.9,\n")
    checkpoints.write(run / "checkpoints" / "last.ckpt", {"global_step": 218, "state_dict": {"w": torch.zeros(1)}})
    cell = Cell(0, "listops / softmax / seed 0", [], str(run), "abc", "listops", 5000, 0)
    [state] = campaign.cell_states(tmp_path, [cell], tmp_path / "outputs", tmp_path / "runs")
    assert state.detail.startswith("step 218/5000, val acc 0.2500")
    with run_lock.held(run):  # running: its latest logged step
        [state] = campaign.cell_states(tmp_path, [cell], tmp_path / "outputs", tmp_path / "runs")
    assert state.detail.startswith("step 200/5000")


def test_status_read_by_head_ends_quietly(tmp_path):
    """``status | head`` ended in a BrokenPipeError traceback."""
    cells = [Cell(i, f"listops / softmax / seed {i}", [], str(tmp_path / f"c{i}"), "abc", "listops", 9, 0) for i in range(4000)]
    a_plan(tmp_path, cells)
    status = subprocess.Popen(
        [sys.executable, "-m", "lra.campaign", "status", "--dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    first = status.stdout.readline()
    status.stdout.close()  # as head does once it has its lines
    assert status.wait(timeout=120) == 0 and first.startswith(b"Campaign x: 4000 cells")
    assert b"Traceback" not in status.stderr.read()


def test_a_missing_official_folder_says_which_data_trains(tmp_path, caplog):
    """A typo'd task.data.source_dir with the default source (auto) fell back to generated data with only "Generating
    ListOps" said."""
    typo = f"task.data.source_dir={tmp_path / 'lra_relase' / 'listops'}"
    cfg = config.compose([*TINY, f"paths.data_dir={tmp_path}", "task.data.source=auto", typo])
    with caplog.at_level(logging.INFO, logger="lra.data.tasks"):
        resolved = prepare_task("listops", OmegaConf.to_container(cfg.task.data, resolve=True))
    assert resolved.kind == "generated"
    said = [r.getMessage() for r in caplog.records if r.name == "lra.data.tasks"]
    assert said == [
        f"listops: no official files at {tmp_path / 'lra_relase' / 'listops'} (task.data.source=auto): the generated data "
        "trains; task.data.source=official requires the official files"
    ]


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["task.protocol.lr=-1"], "task.protocol.lr must be positive, got -1"),
        (["task.protocol.batch_size=0"], "task.protocol.batch_size must be at least 1, got 0"),
        (["task.protocol.max_steps=0"], "task.protocol.max_steps must be at least 1, got 0"),
        (["attention=yoso_32", "attention.hparams.num_hashes=0"], "num_hashes"),
        (["seed=abc"], "seed=abc is not a seed"),
        (["-m", "attention=softmax,none", "task.protocol.lr=-1"], "task.protocol.lr must be positive, got -1"),
        (["task.protocol.lr=1e-3"], None),
        (["--cfg", "job", "task.protocol.lr=-1"], None),  # composes only: nothing is trained, nothing written
    ],
)
def test_bad_values_are_found_before_the_run_makes_its_folder(arguments, message):
    """lr, batch size, steps, hash count and seed errors were found after the run's folder and a failed record existed."""
    problem = config.value_problem([*TINY, *arguments])
    assert (problem is None) if message is None else (message in problem), problem
