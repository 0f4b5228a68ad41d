"""lra.campaign: a sweep's cells K at a time in the background, its status, its archive, and the curve K is chosen from."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch
from tiny_listops import TINY

from lra import campaign, run_lock
from lra.campaign import CampaignError, Cell, Share
from lra.paper import TABLE3
from lra.results import MACHINE_KEYS, RunRecord

REPO = Path(__file__).resolve().parents[2]
TWO_CELLS = ["attention=softmax,none", *TINY]  # the smoke experiment's tiny ListOps, two rows


def test_a_campaign_plans_the_sweep_of_its_experiment_whole_seeds_first():
    cells, datasets, trainer = campaign.make_plan(["experiment=table3", "task=listops", "seed=0,1,2", "trainer=gpu"])
    rows = TABLE3.presets
    assert [cell.name for cell in cells] == [f"listops / {row} / seed {seed}" for seed in (0, 1, 2) for row in rows]
    assert len({cell.folder for cell in cells}) == 36 and len({cell.config_hash for cell in cells}) == 36
    # The folder python -m lra.train -m would give the cell (trainer=gpu: bf16, named so), and the paper's protocol.
    softmax = cells[1]
    folder = Path(softmax.folder).relative_to(Path("outputs").absolute())
    assert folder == Path("listops/softmax/precision=bf16-mixed,experiment=table3,seed=0")
    assert softmax.max_steps == 5000 and softmax.num_workers == 4 and trainer.accelerator == "gpu"
    assert [dataset["data"]["generator"]["num_train"] for dataset in datasets] == [96000]  # one data set, paper-size


def test_a_cells_hash_is_the_one_lra_train_recorded():
    """A campaign knows a committed run by lra.train's configuration hash: the committed table3_cpu records are found."""
    cells, _, _ = campaign.make_plan(["experiment=table3_cpu", "attention=softmax,yoso_32", "seed=0"])
    found, committed = campaign.finished_records(cells, Path("/nonexistent"), REPO / "results" / "runs")
    assert not found and set(committed) == {cell.config_hash for cell in cells}


def test_k_cells_divide_the_cores_and_data_loader_workers():
    cell = Cell(0, "listops / softmax / seed 0", ["attention=softmax", "num_workers=8", "seed=0"], "/f", "h", "listops", 10, 8)
    share = Share.of(4, 16)
    assert (share.threads, share.workers) == (4, 3)
    command, env = campaign.cell_command(cell, share)
    assert command[:3] == [sys.executable, "-m", "lra.train"] and "attention=softmax" in command
    assert [arg for arg in command if arg.startswith("num_workers=")] == ["num_workers=3"]  # the campaign's, once
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "4"
    assert (Share.of(16, 16).threads, Share.of(16, 16).workers) == (1, 0)
    assert (Share.of(3, 2).threads, Share.of(3, 2).workers) == (1, 0)  # more cells than cores: a thread each
    four = Cell(**{**cell.__dict__, "num_workers": 2})
    assert "num_workers=2" in campaign.cell_command(four, Share.of(1, 16))[0]  # never more than the configuration's
    with pytest.raises(CampaignError, match="at least 1"):
        Share.of(0, 16)


def test_auto_takes_the_smallest_k_near_the_best_measured_rate():
    rows = [{"parallel": str(k), "cells_per_hour": str(rate)} for k, rate in ((1, 10), (2, 19), (4, 30), (8, 31), (16, 29))]
    assert campaign.best_parallel(rows) == 4  # 30 >= 0.95 * 31


@pytest.mark.parametrize(
    "argv, message, status",
    [
        (["start", "experiment=tabel3"], "experiment=tabel3 is not an experiment; the choices: ", 2),
        (["start", "--parallel", "0", "attention=softmax"], "--parallel must be at least 1, got 0", 2),
        (["start", "--parallel", "many"], "--parallel must be a whole number of cells at once or auto", 2),
        (["start", "attention=sofmax"], "attention=sofmax is not an attention; did you mean softmax?", 2),
        (["start", "--parallel", "auto", "attention=softmax"], "--parallel auto reads the measured curve", 2),
        (["measure", "--parallel", "1,0", "attention=softmax"], "--parallel must be at least 1, got 0", 2),
        (["status"], "no campaign in", 1),
        (["pack"], "no campaign in", 1),
    ],
)
def test_bad_input_is_one_message(argv, message, status, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    where = [] if argv[0] == "measure" else ["--dir", str(tmp_path / "campaign")]
    assert campaign.main([*argv[:1], *where, *argv[1:]]) == status
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message for a machine without a GPU")
def test_cells_on_a_gpu_without_one_are_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert campaign.main(["start", "--dir", str(tmp_path / "c"), "trainer=gpu"]) == 2
    assert "no CUDA GPU is visible" in capsys.readouterr().err and not (tmp_path / "c").exists()


def test_status_shows_a_running_cells_step_from_its_metrics(tmp_path):
    folder = tmp_path / "run"
    (folder / "metrics").mkdir(parents=True)
    (folder / "metrics" / "metrics.csv").write_text("epoch,step,train/loss,val/acc\n0,49,2.3,\n0,49,,0.25\n0,99,2.1,\n")
    cell = Cell(0, "listops / softmax / seed 0", ["attention=softmax"], str(folder), "abc", "listops", 5000, 0)
    plan = {"cells": [cell.__dict__], "output_dir": str(tmp_path / "out"), "runs_dir": str(tmp_path / "runs")}
    (tmp_path / "c" / campaign.CELLS).mkdir(parents=True)
    assert [s.status for s in campaign.cell_states(tmp_path / "c", plan)] == ["pending"]
    with run_lock.held(folder):
        (state,) = campaign.cell_states(tmp_path / "c", plan)
    assert state.status == "running" and state.detail.startswith("step 100/5000, val acc 0.2500 (pid ")


@pytest.fixture
def environment(tmp_path):
    def env(root: Path) -> dict[str, str]:
        return {**os.environ, "LRA_DATA_DIR": str(tmp_path / "data"), "LRA_OUTPUT_DIR": str(root / "outputs")}

    return env


def command(*args: str, cwd: Path, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess:
    process = subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    if check:
        assert process.returncode == 0, f"{args} failed:\n{process.stdout[-3000:]}\n{process.stderr[-3000:]}"
    return process


@pytest.mark.slow
def test_a_campaign_runs_two_cells_at_once_in_the_background_and_its_archive_makes_them_committed(tmp_path, environment):
    home, env = tmp_path / "gpu", environment(tmp_path / "gpu")
    home.mkdir()
    started = command("lra.campaign", "start", "--parallel", "2", *TWO_CELLS, cwd=home, env=env)
    daemon = int(re.search(r"in the background \(pid (\d+)\)", started.stdout).group(1))
    folder = home / "outputs" / "campaign"
    try:
        early = command("lra.campaign", "status", cwd=home, env=env).stdout
        # Six steps a cell: on an idle machine the campaign can end before this first poll has started up.
        assert "2 cells:" in early and (
            f"Campaign process: running, pid {daemon} " in early or "Campaign process: not running" in early
        ), early
        done = command("lra.campaign", "status", "--wait", "240", "--every", "5", cwd=home, env=env).stdout
    finally:
        with_holder = run_lock.holder(folder)
        if with_holder and f"pid {daemon} " in with_holder:
            os.kill(daemon, signal.SIGTERM)
    assert "Campaign process: not running" in done and "2 cells: 2 finished" in done, done
    with run_lock.held(folder):  # whoever holds the campaign's lock is its running process, whatever the timing
        assert f"Campaign process: running, pid {os.getpid()} " in command("lra.campaign", "status", cwd=home, env=env).stdout
    log = (folder / campaign.LOG_FILE).read_text()
    launched = [line for line in log.splitlines() if " launched " in line]
    assert len(launched) == 2 and log.index(launched[1]) < log.index(" ended "), "both cells ran at once"
    threads = str(max(1, campaign.cores() // 2))
    for n in (0, 1):
        header = (folder / campaign.CELLS / f"{n}.log").read_text().splitlines()[:2]
        assert header[1] == f"# env: OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} PYTHONUNBUFFERED=1"
        assert "num_workers=0" in header[0].split()

    # The archive: the two records in their committed form and their learning curves, nothing heavier.
    archive = tmp_path / "cells.tar.gz"
    command("lra.campaign", "pack", "--out", str(archive), cwd=home, env=env)
    records = [(RunRecord.read(path), path) for path in (home / "outputs" / "listops").rglob("results.json")]
    assert len(records) == 2
    with tarfile.open(archive) as packed:
        members = {member.name: packed.extractfile(member).read() for member in packed.getmembers()}
    from lra.table import run_file_name

    expected = set()
    for record, path in records:
        name = run_file_name(record)
        expected |= {f"results/runs/{name}", f"results/runs/curves/{name.removesuffix('.json')}.csv"}
        committed = json.loads(members[f"results/runs/{name}"])
        assert committed == record.to_dict(committed=True) and list(committed) == sorted(committed)
        assert not set(committed) & set(MACHINE_KEYS) and committed["status"] == "finished"
        curve = members[f"results/runs/curves/{name.removesuffix('.json')}.csv"]
        assert curve == (path.parent / "metrics" / "metrics.csv").read_bytes()
        assert max(int(float(row["step"])) for row in csv.DictReader(curve.decode().splitlines())) == 6
    assert {name for name in members if name.startswith("results/")} == expected
    assert {"campaign/status.txt", "campaign/campaign.json", "campaign/campaign.log"} <= set(members)
    assert archive.stat().st_size < 20_000

    # Unpacked into a fresh checkout, the runs are committed (found by lra.train's hash): a second start runs nothing.
    fresh, fresh_env = tmp_path / "fresh", environment(tmp_path / "fresh")
    fresh.mkdir()
    command("lra.campaign", "unpack", str(archive), cwd=fresh, env=fresh_env)
    assert {
        f"results/runs/{p.relative_to(fresh / 'results' / 'runs')}" for p in (fresh / "results" / "runs").rglob("*.*")
    } == expected
    again = command("lra.campaign", "start", "--foreground", "--parallel", "2", *TWO_CELLS, cwd=fresh, env=fresh_env)
    assert "2 cells finished or committed, 0 to run" in again.stderr + again.stdout
    assert not list((fresh / "outputs" / "campaign" / campaign.CELLS).iterdir()) and not (fresh / "outputs" / "listops").exists()
    shown = command("lra.campaign", "status", cwd=fresh, env=fresh_env).stdout
    assert "2 cells: 0 finished, 2 committed" in shown


@pytest.mark.slow
def test_measure_writes_cells_per_hour_against_k(tmp_path, environment):
    env = environment(tmp_path)
    out = tmp_path / "curve"
    measured = command(
        "lra.campaign",
        "measure",
        "--parallel",
        "1,2",
        "--steps",
        "3",
        "--out",
        str(out),
        "attention=none",
        *TINY,
        cwd=tmp_path,
        env=env,
    )
    with open(out / "cells_per_hour_cpu.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert [(row["parallel"], row["finished"], row["steps"], row["paper_steps"]) for row in rows] == [
        ("1", "1/1", "3", "6"),
        ("2", "2/2", "3", "6"),
    ]
    assert all(float(row["cells_per_hour"]) > 0 for row in rows) and rows[0]["speedup"] == "1.0"
    assert (out / "cells_per_hour_cpu.png").stat().st_size > 0 and "start --parallel auto would run" in measured.stdout


def test_stop_interrupts_the_campaign_process_that_holds_the_folder(tmp_path, capsys):
    folder = tmp_path / "campaign"
    assert campaign.main(["stop", "--dir", str(folder)]) == 0 and "No campaign is running" in capsys.readouterr().out
    hold = "\n".join(
        ["import sys, time", "from lra import run_lock", "with run_lock.held(sys.argv[1]):", "    print('held', flush=True)"]
        + ["    time.sleep(120)"]
    )
    holder = subprocess.Popen([sys.executable, "-c", hold, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert campaign.main(["stop", "--dir", str(folder)]) == 0
        assert holder.wait(timeout=30) == -signal.SIGTERM and f"pid {holder.pid}" in capsys.readouterr().out
    finally:
        if holder.poll() is None:
            holder.kill()
