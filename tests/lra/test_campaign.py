"""lra.campaign: a sweep's cells K at a time in the background, its status, its archive, and the curve K is chosen from."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import hold_at_step
import pytest
import torch
from tiny_listops import TINY

from lra import campaign, checkpoints, run_lock
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


def test_a_campaign_crosses_the_experiments_sweep_with_the_command_lines_as_hydras_sweeper_does():
    """The experiment's sweep first, a key the command line sweeps too in its place, every combination, ordered seed
    by seed: the cells ``python -m lra.train -m`` runs, planned with Hydra's public override parser."""
    cells = campaign.sweep_cells(["experiment=table3_cpu", "attention=softmax,none", "seed=range(0,2)", "task.protocol.lr=1e-3"])
    assert cells == [
        ["task=listops", f"attention={row}", f"seed={seed}", "experiment=table3_cpu", "task.protocol.lr=0.001"]
        for seed in (0, 1)
        for row in ("softmax", "none")
    ]
    with pytest.raises(CampaignError, match=r"task.protocol.lr=interval\(0.1,1\): a campaign sweeps lists and ranges"):
        campaign.sweep_cells(["task.protocol.lr=interval(0.1,1)"])


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
    assert campaign.auto_parallel(rows, 16) == 4


def curve(*points):
    return [{"parallel": str(k), "cells_per_hour": str(rate)} for k, rate in points]


def test_auto_tries_twice_the_best_k_while_the_largest_measured_one_still_gains():
    """Each job measures its K (the campaign's own row): K doubles while it pays, and settles where it stops."""
    assert campaign.auto_parallel(curve((2, 10)), 16) == 4  # one K measured: try the next
    assert campaign.auto_parallel(curve((2, 10), (4, 18)), 16) == 8  # 4 gained on 2: try 8
    assert campaign.auto_parallel(curve((2, 10), (4, 18), (8, 18.5)), 16) == 4  # 8 gained under 5%: the smallest near the best
    assert campaign.auto_parallel(curve((2, 10), (4, 18)), 4) == 4  # never more cells than cores
    assert campaign.auto_parallel(curve((2, 10), (4, 9)), 16) == 2  # 4 lost: stay at 2


def test_auto_with_nothing_measured_runs_two_cells_and_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LRA_OUTPUT_DIR", str(tmp_path / "outputs"))
    argv = ["start", "--dry-run", "--parallel", "auto", "--results", str(tmp_path / "results"), "attention=softmax,none"]
    assert campaign.main(argv) == 0
    said = capsys.readouterr().out
    assert "--parallel auto: nothing measured on this device yet" in said and "2 cells, 2 at a time" in said


@pytest.mark.parametrize(
    "argv, message, status",
    [
        (["start", "experiment=tabel3"], "experiment=tabel3 is not an experiment; the choices: ", 2),
        (["start", "--parallel", "0", "attention=softmax"], "--parallel must be at least 1, got 0", 2),
        (["start", "--parallel", "many"], "--parallel must be a whole number of cells at once or auto", 2),
        (["start", "attention=sofmax"], "attention=sofmax is not an attention; did you mean softmax?", 2),
        (["measure", "--parallel", "1,0", "attention=softmax"], "--parallel must be at least 1, got 0", 2),
        (["start", "--nice", "20", "attention=softmax"], "--nice must be from 0 (the default priority) to 19", 2),
        (["start", "--nice", "-1", "attention=softmax"], "--nice must be from 0 (the default priority) to 19", 2),
        (["status"], "no campaign in", 1),
        (["pack"], "no campaign in", 1),
        (["resume"], "no campaign to resume in", 1),
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
    (folder / "metrics" / "metrics.csv").write_text("epoch,step,train/loss,val/acc\n0,50,2.3,\n0,50,,0.25\n0,100,2.1,\n")
    cell = Cell(0, "listops / softmax / seed 0", ["attention=softmax"], str(folder), "abc", "listops", 5000, 0)
    where = [tmp_path / "out", tmp_path / "runs"]
    (tmp_path / "c" / campaign.CELLS).mkdir(parents=True)
    assert [s.status for s in campaign.cell_states(tmp_path / "c", [cell], *where)] == ["pending"]
    with run_lock.held(folder):
        (state,) = campaign.cell_states(tmp_path / "c", [cell], *where)
    assert state.status == "running" and state.detail.startswith("step 100/5000, val acc 0.2500 (pid ")


def test_status_gives_a_running_cells_pace_from_its_latest_evaluations_not_the_hours_it_was_stopped(tmp_path):
    folder = tmp_path / "run"
    (folder / "metrics").mkdir(parents=True)
    (folder / "metrics" / "metrics.csv").write_text("epoch,step,val/acc\n0,200,0.25\n")
    evaluation = "[2026-12-05 {}][lra.train.file][INFO] - step {}: val/acc 0.2000, val/loss 2.2000"
    (folder / "train.log").write_text(
        "\n".join(
            [
                evaluation.format("09:00:00,000", 50),
                evaluation.format("09:02:00,000", 100),
                "[2026-12-05 09:02:01,000][lra.train][INFO] - Not an evaluation, step 999: val/acc 0.9",
                evaluation.format("14:00:00,000", 150),  # carried to another machine for five hours
                evaluation.format("14:02:00,000", 200),
            ]
        )
    )
    cell = Cell(0, "listops / softmax / seed 0", ["attention=softmax"], str(folder), "abc", "listops", 5000, 0)
    (tmp_path / "c" / campaign.CELLS).mkdir(parents=True)
    with run_lock.held(folder):
        (state,) = campaign.cell_states(tmp_path / "c", [cell], tmp_path / "out", tmp_path / "runs")
    # 50 steps in 2 minutes, twice; 4800 steps left at 25 a minute
    assert state.detail.startswith("step 200/5000, val acc 0.2500, 25 steps/min, about 3.2 h to its last step (pid ")
    assert campaign.state.pace_text(0.5, 600) == "30 steps/min, about 20 min to its last step"
    (folder / "metrics" / "metrics.csv").write_text("epoch,step,val/acc\n0,5000,0.25\n")  # trained: now its test
    with run_lock.held(folder):
        (state,) = campaign.cell_states(tmp_path / "c", [cell], tmp_path / "out", tmp_path / "runs")
    assert state.detail.startswith("step 5000/5000, val acc 0.2500 (pid ")


def test_status_estimates_the_time_left_from_the_running_cells_pace_and_each_rows_finished_runs(tmp_path):
    def cell(index: int, row: str, seed: int) -> Cell:
        overrides = ["experiment=table3", f"attention={row}", f"seed={seed}"]
        return Cell(index, f"listops / {row} / seed {seed}", overrides, str(tmp_path / f"{row}{seed}"), "h", "listops", 1000, 0)

    def record(name: str, wall_time_s: float, steps_per_second: float) -> Path:
        path = tmp_path / f"{name}.json"
        RunRecord(status="finished", steps=1000, wall_time_s=wall_time_s, steps_per_second=steps_per_second).write(path)
        return path

    State = campaign.CellState
    states = [
        State(cell(0, "a", 0), "committed", "", record("a0", 3600, 0.5)),  # 3.6 s a step, evaluations included
        State(cell(1, "a", 1), "finished", "", record("a1", 4400, 0.5)),  # 4.4 s: the row's mean is 4 s
        State(cell(2, "a", 2), "interrupted", "", step=400),  # 600 steps at 4 s
        State(cell(3, "b", 0), "committed", "", record("b0", 100, 0.25)),  # a last piece's 100 s: 1000 steps at 0.25/s
        State(cell(4, "b", 1), "pending", ""),  # 1000 steps at 4 s
        State(cell(5, "b", 2), "running", "", step=700, pace=0.5),  # 300 steps at its own 0.5 a second
        State(cell(6, "c", 0), "diverged", "", step=300),
        State(cell(7, "c", 1), "pending", ""),  # no finished run of its row
    ]
    expected = "about 1.9 h for 3 cells, 1 at a time"  # 2400 + 4000 + 600 s
    assert campaign.state.time_left(states, parallel=1) == (
        f"Left: {expected} (a running cell at its pace, the others at the wall time per step of their row's finished "
        "runs); and 1 cell of rows with no finished run yet, not estimated"
    )
    assert campaign.state.time_left(states, parallel=2).startswith("Left: about 58 min for 3 cells, 2 at a time (")
    assert campaign.state.time_left(states[:2] + states[6:7], parallel=1) is None


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
    assert "Nothing left to run" in done, done
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
    assert "2 cells: 0 finished, 2 committed" in shown and "Nothing left to run" in shown


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


def holding(folder: Path, lock_file: str = run_lock.LOCK_FILE) -> subprocess.Popen:
    """Another process that holds ``folder``'s lock (``lock_file``) for two minutes, once it has taken it."""
    hold = "\n".join(
        ["import sys, time", "from lra import run_lock", "with run_lock.held(sys.argv[1], sys.argv[2]):"]
        + ["    print('held', flush=True)", "    time.sleep(120)"]
    )
    holder = subprocess.Popen([sys.executable, "-c", hold, str(folder), lock_file], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_stop_interrupts_the_campaign_process_that_holds_the_folder(tmp_path, capsys):
    folder = tmp_path / "campaign"
    assert campaign.main(["stop", "--dir", str(folder)]) == 0 and "No campaign is running" in capsys.readouterr().out
    holder = holding(folder)
    try:
        assert campaign.main(["stop", "--dir", str(folder)]) == 0
        assert holder.wait(timeout=30) == -signal.SIGTERM and f"pid {holder.pid}" in capsys.readouterr().out
    finally:
        if holder.poll() is None:
            holder.kill()


def test_stop_wait_waits_for_the_campaign_to_end_and_says_when_it_has_not(tmp_path, capsys):
    folder = tmp_path / "campaign"
    holder = holding(folder)
    try:
        assert campaign.main(["stop", "--dir", str(folder), "--wait", "30"]) == 0
        assert holder.poll() is not None and "The campaign has ended" in capsys.readouterr().out
    finally:
        holder.kill()
    deaf = subprocess.Popen(  # a campaign that takes its time to end: SIGTERM ignored
        [
            sys.executable,
            "-c",
            "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "from lra import run_lock\nwith run_lock.held(sys.argv[1]):\n    print('held', flush=True); time.sleep(120)",
            str(folder),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert deaf.stdout.readline().strip() == "held"
        assert campaign.main(["stop", "--dir", str(folder), "--wait", "1"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: the campaign has not ended within 1 s") and len(err.splitlines()) == 1
    finally:
        deaf.kill()


@pytest.mark.skipif(not campaign.AUTOGROUP.exists(), reason="Linux's autogroup scheduling is not on this machine")
@pytest.mark.parametrize("autogroup", ["its own", "the root one"])
def test_a_niced_campaign_lowers_its_own_scheduling_group_and_never_anothers(autogroup, tmp_path):
    """A detached campaign (setsid) is a scheduling group of its own for Linux: at nice 19 in a group at nice 0 it took
    half the machine from a shell's work. Its group gets its niceness; a campaign in the foreground, in the user's
    terminal's group (or in the root autogroup, where a container or a CI runner starts it), leaves that group alone.
    Where the file reads empty, as for a process in the root autogroup (stood in by an empty file), the campaign writes
    and claims nothing of a group."""
    empty = tmp_path / "autogroup"
    empty.write_text("")
    root = autogroup == "the root one"
    probe = (
        "import os, sys\n"
        "if sys.argv[1] == 'detached': os.setsid()\n"
        "from lra.campaign import machine\n"
        f"if {root}: machine.AUTOGROUP = machine.Path({str(empty)!r})\n"
        "print(machine.lower_priority(7)); print(os.nice(0)); print(machine.autogroup_nice())"
    )
    terminals = None if root else campaign.autogroup_nice()  # None where pytest itself runs in the root autogroup
    for where, group_nice in (("detached", None if root else 7), ("in the foreground", terminals)):
        said, nice, group = subprocess.run(
            [sys.executable, "-c", probe, where], capture_output=True, text=True, check=True
        ).stdout.splitlines()
        assert (nice, group) == ("7", str(group_nice)), where
        assert said == ("nice 7, its scheduling group at nice 7" if group_nice == 7 else "nice 7"), where
    assert empty.read_text() == ""


def test_unpack_missing_ok_starts_with_nothing_carried(tmp_path, capsys, monkeypatch):
    """A first job has nothing to unpack: under set -e, a job script's unpack must not end the job."""
    monkeypatch.chdir(tmp_path)
    assert campaign.main(["unpack", str(tmp_path / "carry" / "campaign.tar.gz")]) == 2
    assert "there is no archive at" in capsys.readouterr().err
    assert campaign.main(["unpack", "--missing-ok", str(tmp_path / "carry" / "campaign.tar.gz")]) == 0
    assert "Nothing to unpack" in capsys.readouterr().out and not (tmp_path / "results").exists()


REHEARSAL = [  # two cells of 24 steps, evaluated every 4: long enough to be stopped twice on the way
    "attention=softmax,none",
    *[o for o in TINY if not o.startswith(("task.protocol.max_steps", "task.protocol.val_check_interval"))],
    "task.protocol.max_steps=24",
    "task.protocol.val_check_interval=4",
    hold_at_step.OVERRIDE,
]


def job(
    root: Path, environment, deadline: float, hold_at: int | None, carried: list[Path], parallel: str = "2"
) -> tuple[str, list[Path]]:
    """One short job on a bare machine: a fresh folder at its own path, the carried files unpacked, the campaign started
    with the job's deadline and SIGKILLed at it if still there; what unpack said and the files it packed for the next."""
    root.mkdir()
    env = {**environment(root), **hold_at_step.environment(hold_at)}
    said = ""
    if carried:
        (root / "carry").mkdir()
        for path in carried:
            shutil.copy(path, root / "carry" / path.name)
        base = re.sub(r"\.part\d{3}$", "", carried[0].name)
        said = command("lra.campaign", "unpack", str(root / "carry" / base), "--remove", cwd=root, env=env).stdout
        assert not list((root / "carry").iterdir()), "--remove empties the folder the files came in"
    argv = ["--deadline", str(deadline), "--margin", "15", "--pack", str(root / "out" / "campaign.tar.gz"), "--part-size", "0.25"]
    process = subprocess.Popen(
        [sys.executable, "-m", "lra.campaign", "start", "--foreground", "--parallel", parallel, *argv, *REHEARSAL],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        process.wait(timeout=deadline)
    except subprocess.TimeoutExpired:  # the job's end: nothing is saved after this
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return said, sorted((root / "out").iterdir())


@pytest.mark.slow
def test_a_campaign_finishes_over_short_jobs_killed_at_their_deadlines_as_one_uninterrupted_run(tmp_path, environment):
    """The dress rehearsal of a campaign on short GPU jobs, on the CPU: three jobs, each in a fresh folder at another
    path and killed at its deadline, with only the packed files carried from one to the next."""
    reference = tmp_path / "reference"
    reference.mkdir()
    env = {**environment(reference), **hold_at_step.environment()}  # no step to hold at: one uninterrupted run
    command("lra.campaign", "start", "--foreground", "--parallel", "2", *REHEARSAL, cwd=reference, env=env)

    first_files = job(tmp_path / "job1", environment, 45, 9, [], parallel="auto")[1]  # nothing measured: K = 2
    assert len(first_files) > 1 and all(path.stat().st_size <= 2**18 for path in first_files), "parts of 0.25 MiB"
    said2, second_files = job(tmp_path / "job2", environment, 45, 17, first_files)
    # Held at step 9 (17 in the second job) until the deadline's margin: there, unless the machine is too slow to reach
    # it in time, which must not fail the rehearsal, only shorten each job's share.
    restored2 = [int(step) for step in re.findall(r"restored at step (\d+)", said2)]
    assert len(restored2) == 2 and min(restored2) > 0, said2
    # The first job measured its K on the real cells, and the measurement came along for the next one's auto.
    measured = list(csv.DictReader((tmp_path / "job2" / "results" / "cells_per_hour_cpu.csv").read_text().splitlines()))
    assert [(row["parallel"], row["cell"].split(":")[0]) for row in measured] == [("2", "campaign of 2 cells")]
    assert int(measured[0]["steps"]) >= 8 and float(measured[0]["cells_per_hour"]) > 0
    said3, third_files = job(tmp_path / "job3", environment, 240, None, second_files)
    restored3 = [int(step) for step in re.findall(r"restored at step (\d+)", said3)]
    assert len(restored3) == 2 and sum(restored3) > sum(restored2), said3

    home = tmp_path / "job3"
    command("lra.campaign", "unpack", str(third_files[0]), cwd=home, env=environment(home))
    assert "2 cells: 2 finished" in command("lra.campaign", "status", cwd=home, env=environment(home)).stdout

    def finished(root: Path) -> dict[str, tuple[RunRecord, list[dict[str, str]]]]:
        found = {}
        for path in (root / "outputs" / "listops").rglob("results.json"):
            record = RunRecord.read(path)
            with open(path.parent / "metrics" / "metrics.csv", newline="") as file:
                found[record.attention] = (record, list(csv.DictReader(file)))
        return found

    expected, got = finished(reference), finished(home)
    assert set(expected) == set(got) == {"softmax", "none"}
    for attention, (record, rows) in got.items():
        want, want_rows = expected[attention]
        assert record.status == "finished" and record.resumed_from, "resumed from the carried last.ckpt"
        assert (record.best_val_step, record.best_val_acc) == (want.best_val_step, want.best_val_acc)
        assert record.test_acc == pytest.approx(want.test_acc, abs=1e-6)
        assert record.test_loss == pytest.approx(want.test_loss, rel=1e-5)
        evaluations = [int(float(row["step"])) for row in rows if row.get("val/acc")]
        assert evaluations == [int(float(row["step"])) for row in want_rows if row.get("val/acc")]
        assert len(evaluations) == len(set(evaluations)) == 6, "every evaluation once"
        best = list((Path(record.best_checkpoint).parent).glob("best-step*.ckpt"))
        assert [path.name for path in best] == [Path(want.best_checkpoint).name]


def test_an_archive_over_the_part_size_is_written_in_parts_that_read_back_whole(tmp_path):
    members = {f"campaign/failed/{n}.log": os.urandom(3000) for n in range(4)}  # incompressible: 12 kB packed
    out = tmp_path / "carry" / "campaign.tar.gz"
    paths = campaign.archive.write(members, out, 4096)
    names = [path.name for path in paths]
    assert names == [f"campaign.tar.gz.part{i:03d}" for i in range(len(names) - 1)] + ["campaign.tar.gz.manifest.json"]
    assert len(names) >= 4, "three parts at least, and the manifest"
    assert all(path.stat().st_size <= 4096 for path in paths[:-1]) and not out.exists()
    for given in (out, paths[1], paths[-1]):  # the archive's name, any of its parts, its manifest
        assert campaign.archive.read(given, campaign.is_member) == members
    small = {"campaign/status.txt": b"done\n"}
    assert campaign.archive.write(small, out, 4096) == [out, paths[-1]]  # a smaller one later: the old parts go
    assert sorted(p.name for p in out.parent.iterdir()) == ["campaign.tar.gz", "campaign.tar.gz.manifest.json"]
    with pytest.raises(CampaignError, match="--part-size must be positive"):
        campaign.archive.write(members, out, 0)


def checkpoint(path: Path, step: int, optimizer: bool = True) -> None:
    """A checkpoint as the harness writes one (lra.checkpoints: with its digest)."""
    content = {"global_step": step, "state_dict": {"w": torch.full((4,), float(step))}}
    checkpoints.write(
        path, {**content, "optimizer_states": [{"m": torch.zeros(4)}], "lr_schedulers": [{}]} if optimizer else content
    )


def test_an_unfinished_cells_state_is_packed_small_and_restored_where_it_is_behind(tmp_path, monkeypatch):
    """pack carries an interrupted cell's last.ckpt, best weights, metrics and record; unpack puts them in its run
    folder under this machine's output folder, unless that folder is as far along already."""
    monkeypatch.chdir(tmp_path)
    outputs = tmp_path / "outputs"
    folder = outputs / "listops" / "softmax" / "seed=0"
    checkpoint(folder / "checkpoints" / "last.ckpt", 12)
    checkpoint(folder / "checkpoints" / "best-step8.ckpt", 8)
    (folder / "metrics").mkdir()
    (folder / "metrics" / "metrics.csv").write_text("step,val/acc\n7,0.5\n")
    RunRecord(task="listops", attention="softmax", status="interrupted", config_hash="abc").write(folder / "results.json")
    cell = Cell(0, "listops / softmax / seed 0", ["attention=softmax"], str(folder), "abc", "listops", 24, 0)
    state = campaign.CellState(cell, "interrupted", "step 12/24")
    members = campaign.unfinished_state(state, outputs)
    prefix = "state/listops/softmax/seed=0"
    assert sorted(members) == [
        f"{prefix}/{name}"
        for name in ("checkpoints/best-step8.ckpt", "checkpoints/last.ckpt", "metrics/metrics.csv", "results.json")
    ]
    best = checkpoints.load(members[f"{prefix}/checkpoints/best-step8.ckpt"], Path("best-step8.ckpt"))
    assert "optimizer_states" not in best and torch.equal(best["state_dict"]["w"], torch.full((4,), 8.0))
    assert campaign.unfinished_state(campaign.CellState(cell, "running", ""), outputs) == {}  # being written

    archive = tmp_path / "carry.tar.gz"
    campaign.archive.write(members, archive, 2**20)
    elsewhere = tmp_path / "next-job"
    elsewhere.mkdir()
    monkeypatch.setenv("LRA_OUTPUT_DIR", str(elsewhere / "outputs"))
    monkeypatch.chdir(elsewhere)
    assert campaign.main(["unpack", str(archive)]) == 0
    moved = elsewhere / "outputs" / "listops" / "softmax" / "seed=0"
    assert (moved / "checkpoints" / "last.ckpt").read_bytes() == members[f"{prefix}/checkpoints/last.ckpt"]
    assert checkpoints.step(moved / "checkpoints" / "last.ckpt") == 12, "written with its digest, read back against it"
    assert RunRecord.read(moved / "results.json").status == "interrupted"
    assert (moved / "metrics" / "metrics.csv").read_text() == "step,val/acc\n7,0.5\n"

    # A folder already further along keeps its own state; one behind is replaced, its old best checkpoint gone.
    carried = {name.removeprefix(prefix + "/"): data for name, data in members.items()}
    checkpoint(moved / "checkpoints" / "last.ckpt", 16)
    restore = campaign.checked_cell(elsewhere / "outputs", "listops/softmax/seed=0", carried)
    assert not restore.restore and restore.why == "not restored, its own last.ckpt is at step 16, the archive's at 12"
    checkpoint(moved / "checkpoints" / "last.ckpt", 4)
    checkpoint(moved / "checkpoints" / "best-step4.ckpt", 4)
    (moved / "train.log").write_text("the earlier attempt's log\n")
    campaign.restore_cell(campaign.checked_cell(elsewhere / "outputs", "listops/softmax/seed=0", carried))
    assert sorted(p.name for p in (moved / "checkpoints").iterdir()) == [
        "best-step8.ckpt", "best-step8.ckpt.sha256", "last.ckpt", "last.ckpt.sha256",
    ]  # fmt: skip
    assert (moved / "train.log").read_text() == "the earlier attempt's log\n", "the folder's other files stay"
    assert sorted(p.name for p in moved.parent.iterdir()) == ["seed=0"], "nothing left beside it"


def test_unpack_refuses_an_archive_member_outside_a_run_folders_state(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    archive = tmp_path / "bad.tar.gz"
    campaign.archive.write({"state/listops/softmax/seed=0/checkpoints/evil.py": b"x"}, archive, 2**20)
    assert campaign.main(["unpack", str(archive)]) == 1
    assert "which is not part of a campaign archive; nothing unpacked" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.tar.gz", "bad.tar.gz.manifest.json"]


def test_a_deadline_that_leaves_no_time_to_train_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LRA_OUTPUT_DIR", str(tmp_path / "outputs"))
    assert campaign.main(["start", "--dry-run", "--deadline", "60", "--margin", "90", "attention=softmax"]) == 2
    assert "--deadline 60 s leaves no time to train before its --margin of 90 s" in capsys.readouterr().err


def test_a_diverged_cell_is_not_trained_again_and_its_verdict_goes_to_the_next_job(tmp_path, monkeypatch):
    outputs = tmp_path / "outputs"
    folder = outputs / "listops" / "softmax" / "seed=0"
    checkpoint(folder / "checkpoints" / "last.ckpt", 3)  # the last finite state: never carried, never resumed
    error = "training diverged: the loss is not finite from step 5 (the last finite loss 2.3)"
    RunRecord(task="listops", attention="softmax", status="diverged", config_hash="abc", error=error).write(
        folder / "results.json"
    )
    cell = Cell(0, "listops / softmax / seed 0", ["attention=softmax"], str(folder), "abc", "listops", 24, 0)
    runs = tmp_path / "results" / "runs"
    campaign_dir = tmp_path / "campaign"
    campaign_dir.mkdir()
    [state] = campaign.cell_states(campaign_dir, [cell], outputs, runs)
    assert state.status == "diverged" and "from step 5" in state.detail
    members = campaign.unfinished_state(state, outputs)
    assert sorted(members) == ["state/listops/softmax/seed=0/results.json"]

    elsewhere = tmp_path / "next" / "outputs" / "listops" / "softmax" / "seed=0"
    carried = {"results.json": members["state/listops/softmax/seed=0/results.json"]}
    restore = campaign.checked_cell(tmp_path / "next" / "outputs", "listops/softmax/seed=0", carried)
    campaign.restore_cell(restore)
    assert "diverged" in restore.why and RunRecord.read(elsewhere / "results.json").status == "diverged"
    there = Cell(**{**cell.__dict__, "folder": str(elsewhere)})
    assert [s.status for s in campaign.cell_states(campaign_dir, [there], tmp_path / "next", runs)] == ["diverged"]


@pytest.mark.parametrize("taken_by", ["a campaign that started while this one planned", "another start"])
def test_a_start_in_a_folder_taken_while_it_planned_refuses_at_once_naming_the_holder(taken_by, tmp_path, capsys, monkeypatch):
    """Two starts at once in one folder both said "Started in the background" and exited 0: the second's plan replaced
    the first's, and its process found the folder held and ended, saying so only in the shared log. Here the other
    start (its lock held) or the campaign it launched (the folder's lock held) takes the folder while this one plans."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LRA_OUTPUT_DIR", str(tmp_path / "outputs"))
    folder = tmp_path / "campaign"
    folder.mkdir()
    (folder / campaign.PLAN_FILE).write_text('{"planned_by": "the other start"}\n')
    lock_file = run_lock.LOCK_FILE if taken_by.startswith("a campaign") else campaign.START_LOCK_FILE
    others = []
    planned = campaign.make_plan

    def plan_while_the_other_takes_the_folder(overrides):
        plan = planned(overrides)
        others.append(holding(folder, lock_file))
        return plan

    monkeypatch.setattr(campaign.control, "make_plan", plan_while_the_other_takes_the_folder)
    try:
        assert campaign.main(["start", "--dir", str(folder), "attention=none", *TINY]) == 1
    finally:
        for other in others:
            other.kill()
    said = capsys.readouterr()
    holder = f"pid {others[0].pid} on {socket.gethostname()} since "
    what = "a campaign is already running" if lock_file == run_lock.LOCK_FILE else "another python -m lra.campaign start is"
    assert said.err.startswith(f"error: {what}") and holder in said.err and len(said.err.splitlines()) == 1, said.err
    assert f"python -m lra.campaign status --dir {folder}" in said.err and "another folder (--dir)" in said.err
    assert "Started" not in said.out and not (folder / campaign.LOG_FILE).exists(), "no campaign process was launched"
    assert json.loads((folder / campaign.PLAN_FILE).read_text()) == {"planned_by": "the other start"}


@pytest.mark.slow
def test_two_starts_at_once_in_one_folder_are_one_campaign_and_one_refusal(tmp_path, environment):
    """As a user met it: two `lra.campaign start` in one folder at once both said "Started in the background" and
    exited 0, and the second never ran."""
    env = environment(tmp_path)
    argv = [sys.executable, "-m", "lra.campaign", "start", "--dir", str(tmp_path / "c"), "attention=none", *TINY]
    starts = [subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
    starts.append(subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = [start.communicate(timeout=300) for start in starts]
    said = [(start.returncode, out, err) for start, (out, err) in zip(starts, outputs)]
    try:
        assert sorted(status for status, _, _ in said) == [0, 1], said
        (started,) = [out for status, out, _ in said if status == 0]
        (refused,) = [err for status, _, err in said if status == 1]
        assert "Started in the background (pid " in started
        assert re.fullmatch(
            rf"error: (a campaign is already running|another python -m lra.campaign start is starting a campaign) in "
            rf"{re.escape(str(tmp_path / 'c'))} \(pid \d+ on .*\): wait for it to end .*, or start this campaign in "
            r"another folder \(--dir\)\n",
            refused,
        ), refused
    finally:
        command("lra.campaign", "stop", "--dir", str(tmp_path / "c"), cwd=tmp_path, env=env)
        command("lra.campaign", "status", "--dir", str(tmp_path / "c"), "--wait", "120", cwd=tmp_path, env=env)


def test_a_plan_that_leaves_out_the_carried_unfinished_cells_is_refused_until_replaced(tmp_path, capsys, monkeypatch):
    """A campaign started again with fewer cells (a seed left out of the command) replaced its plan, and the next pack
    carried only the new plan's cells: an interrupted cell's training stayed behind on the machine it ran on. Here
    that start is refused, in the campaign's folder and on the next machine after unpack, naming the cell and the
    command that starts its plan again."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LRA_OUTPUT_DIR", str(tmp_path / "outputs"))
    two_seeds = ["attention=none", "seed=0,1", *TINY]
    plan, _ = campaign.control.new_plan(campaign.parser().parse_args(["start", "--dir", "c", "--nice", "19", *two_seeds]))
    (tmp_path / "c").mkdir()
    plan.write(tmp_path / "c")
    seed1 = Path(plan.cells[1].folder)
    checkpoint(seed1 / "checkpoints" / "last.ckpt", 3)
    expected = f"listops / none / seed 1 (step 3 of {plan.cells[1].max_steps}). A pack carries only the running plan's cells"
    again = f"python -m lra.campaign start --dir c --nice 19 {' '.join(two_seeds)}"

    def start(*argv: str) -> tuple[int, str]:
        status = campaign.main(["start", "--dir", "c", *argv])
        return status, capsys.readouterr().err

    status, err = start("attention=none", "seed=0", *TINY)
    assert status == 1 and expected in err and again in err and "add --replace" in err
    assert campaign.Plan.read(tmp_path / "c").overrides == plan.overrides, "the earlier plan stays"
    assert campaign.main(["start", "--dry-run", "--dir", "c", "attention=none", "seed=0", *TINY]) == 0
    assert "note: start refuses this plan: " in capsys.readouterr().out
    for keeps in (two_seeds, ["attention=none", "seed=1", *TINY], ["--replace", "attention=none", "seed=0", *TINY]):
        assert campaign.main(["start", "--dry-run", "--dir", "c", *keeps]) == 0
        assert "refuses" not in capsys.readouterr().out, keeps
    changed = campaign.Plan.read(tmp_path / "c")
    changed.cells[1].config_hash = "another configuration"  # of an earlier version: its own run refuses its last.ckpt
    changed.write(tmp_path / "c")
    assert campaign.main(["start", "--dry-run", "--dir", "c", *two_seeds]) == 0
    assert "refuses" not in capsys.readouterr().out, "the plan still trains in the cell's folder"
    plan.write(tmp_path / "c")

    # On the next machine, at another path: the plan comes back with the archive, the cell with its state.
    assert campaign.main(["pack", "--dir", "c", "--out", str(tmp_path / "carry.tar.gz")]) == 0
    elsewhere = tmp_path / "next"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("LRA_OUTPUT_DIR", str(elsewhere / "outputs"))
    assert campaign.main(["unpack", str(tmp_path / "carry.tar.gz")]) == 0
    status, err = start("attention=none", "seed=0", *TINY)
    assert status == 1 and expected in err and again in err
    assert campaign.main(["start", "--dry-run", "--dir", "other", "attention=none", "seed=0", *TINY]) == 0
    assert "refuses" not in capsys.readouterr().out, "another campaign's folder: not this plan's cells"


def test_resume_starts_the_latest_plan_again_in_its_folder_and_on_the_next_machine(tmp_path, capsys, monkeypatch):
    """A campaign carried from machine to machine goes on with its own sweep and settings, its command line not typed
    again: ``resume`` takes the latest of the plan in its folder and the ones unpacked from its archive."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LRA_OUTPUT_DIR", str(tmp_path / "outputs"))

    def planned(*argv: str) -> campaign.Plan:
        plan, _ = campaign.control.new_plan(campaign.parser().parse_args(["start", "--dir", "c", *argv]))
        (tmp_path / "c").mkdir(exist_ok=True)
        plan.write(tmp_path / "c")
        return plan

    def resumed() -> str:
        assert campaign.main(["resume", "--dry-run", "--dir", "c"]) == 0
        return capsys.readouterr().out

    first = planned("--nice", "19", "attention=none", "seed=0", *TINY)
    said = resumed()
    assert f"Resuming the plan of {first.planned_at}" in said and first.describe() in said, said
    assert "refuses" not in said
    assert campaign.main(["status", "--dir", "c"]) == 0
    said = capsys.readouterr().out
    assert "Campaign process: not running (python -m lra.campaign resume --dir c goes on with its cells)" in said, said
    checkpoint(Path(first.cells[0].folder) / "checkpoints" / "last.ckpt", 3)
    second = planned("--nice", "19", "--parallel", "2", "attention=none", "seed=0,1", *TINY)
    second.planned_at = "2999-01-01T00:00:00+00:00"  # later than the first, whatever the clock's resolution
    second.write(tmp_path / "c")
    said = resumed()
    assert "Campaign attention=none seed=0,1 " in said and "2 cells, 2 at a time" in said and "at nice 19" in said, said
    assert "refuses" not in said

    # On the next machine, at another path, nothing in the campaign's folder yet: the carried plan.
    assert campaign.main(["pack", "--dir", "c", "--out", str(tmp_path / "carry.tar.gz")]) == 0
    elsewhere = tmp_path / "next"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("LRA_OUTPUT_DIR", str(elsewhere / "outputs"))
    assert campaign.main(["resume", "--dry-run", "--dir", "c"]) == 1
    assert "no campaign to resume in c" in capsys.readouterr().err
    assert campaign.main(["unpack", str(tmp_path / "carry.tar.gz")]) == 0
    capsys.readouterr()
    carried = (elsewhere / "outputs" / "unpacked" / "carry" / "status.txt").read_text()
    assert "Campaign process: packed at " in carried and "resume" not in carried, "the carried status: no process to resume"
    (elsewhere / "c").mkdir()
    first.write(elsewhere / "c")  # an older plan this machine ran: the carried one is later
    said = resumed()
    assert "Campaign attention=none seed=0,1 " in said and "2 cells, 2 at a time" in said and "at nice 19" in said, said


def test_a_cell_that_trained_before_runs_first_so_a_job_leaves_as_few_unfinished_cells_as_it_can(tmp_path, capsys, monkeypatch):
    """A campaign started again with more seeds (or whose stopped cell is late in the sweep) finishes the cell it
    carried before it starts new ones, whole seeds first otherwise: in the campaign's launches and in the dry run, which
    sees the folder as start leaves it (the earlier plan's cell files gone)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LRA_OUTPUT_DIR", str(tmp_path / "outputs"))
    sweep = ["attention=softmax,none", "seed=0,1", *TINY]
    plan, _ = campaign.control.new_plan(campaign.parser().parse_args(["start", "--dir", "c", *sweep]))
    names = [cell.name for cell in plan.cells]
    assert names == [f"listops / {row} / seed {seed}" for seed in (0, 1) for row in ("softmax", "none")]
    checkpoint(Path(plan.cells[2].folder) / "checkpoints" / "last.ckpt", 3)  # seed 1's softmax, stopped at step 3
    expected = [names[2], names[0], names[1], names[3]]
    # The folder's earlier plan, whose cell 0 (another configuration) failed: its files are not the new cell 0's.
    earlier, _ = campaign.control.new_plan(
        campaign.parser().parse_args(["start", "--dir", "c", "attention=none", "seed=3", *TINY])
    )
    (tmp_path / "c" / campaign.CELLS).mkdir(parents=True)
    earlier.write(tmp_path / "c")
    (tmp_path / "c" / campaign.CELLS / "0.log").write_text("$ python -m lra.train ...\n")
    (tmp_path / "c" / campaign.CELLS / "0.exit").write_text("1\n")

    assert campaign.main(["start", "--dry-run", "--dir", "c", *sweep]) == 0
    listed = re.findall(r"^  (\w+) +(listops / \w+ / seed \d)  ", capsys.readouterr().out, re.MULTILINE)
    assert listed == [("pending", name) for name in expected]

    # The campaign's own process, each cell a process that ends at once (the order is the scheduler's, not training's).
    instant = (
        "import sys; import lra.campaign.scheduler as s; s.prepared = lambda plan: True; "
        "s.cell_command = lambda cell, share, mps=None: ([sys.executable, '-c', ''], {}); "
        "from lra import campaign; sys.exit(campaign.main(sys.argv[1:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", instant, "start", "--foreground", "--dir", "c", *sweep],
        cwd=tmp_path,
        env={**os.environ, "LRA_OUTPUT_DIR": str(tmp_path / "outputs")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    launched = re.findall(r"launched (listops / \w+ / seed \d) \(pid", done.stderr)
    assert launched == expected, done.stderr[-3000:]
