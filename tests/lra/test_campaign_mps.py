"""lra.campaign under CUDA MPS: the choice (--mps, the curve per MPS setting) and the daemon's life, on the CPU with a
stand-in for ``nvidia-cuda-mps-control``."""

from __future__ import annotations

import csv
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from tiny_listops import TINY

from lra import campaign
from lra.campaign import CampaignError, Cell, Share
from lra.rows import read_rows

FAKE_MPS = '''#!{python}
"""A stand-in for nvidia-cuda-mps-control. -d: a detached daemon opens $CUDA_MPS_PIPE_DIRECTORY/control and writes its
pid and environment into $FAKE_MPS_RECORD/daemon.json; "quit" on stdin stops it, removes the control file and writes
quit.json; $FAKE_MPS_FAIL: -d fails as a driver without MPS does."""
import json, os, signal, subprocess, sys, time
from pathlib import Path

record = Path(os.environ["FAKE_MPS_RECORD"])
pipe = Path(os.environ["CUDA_MPS_PIPE_DIRECTORY"])
if sys.argv[1:] == ["-d"]:
    if os.environ.get("FAKE_MPS_FAIL"):
        print("An instance of this daemon could not be started", flush=True)
        sys.exit(1)
    quiet = subprocess.DEVNULL
    subprocess.Popen([sys.executable, __file__, "--serve"], start_new_session=True, stdin=quiet, stdout=quiet, stderr=quiet)
elif sys.argv[1:] == ["--serve"]:
    keys = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")
    (record / "daemon.json").write_text(json.dumps({{"pid": os.getpid(), **{{key: os.environ.get(key) for key in keys}}}}))
    (pipe / "control").write_text("")
    time.sleep(600)
elif sys.stdin.read().strip() == "quit":
    os.kill(json.loads((record / "daemon.json").read_text())["pid"], signal.SIGTERM)
    (pipe / "control").unlink()
    (record / "quit.json").write_text(json.dumps({{"CUDA_MPS_PIPE_DIRECTORY": str(pipe)}}))
'''


@pytest.fixture
def fake_mps(tmp_path, monkeypatch):
    """``nvidia-cuda-mps-control`` on PATH, as the stand-in above; no MPS daemon running for this user. Yields the
    folder its daemon writes into."""
    folder = tmp_path / "fake_bin"
    folder.mkdir()
    control = folder / campaign.MPS_CONTROL
    control.write_text(FAKE_MPS.format(python=sys.executable))
    control.chmod(0o755)
    record = tmp_path / "fake_mps"
    record.mkdir()
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_MPS_RECORD", str(record))
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.setattr(campaign.mps, "MPS_DEFAULT_PIPE", tmp_path / "no_default_mps")
    yield record
    if (record / "daemon.json").is_file() and not (record / "quit.json").is_file():  # a test that failed half-way
        os.kill(json.loads((record / "daemon.json").read_text())["pid"], signal.SIGKILL)


def started(record: Path) -> dict | None:
    return json.loads((record / "daemon.json").read_text()) if (record / "daemon.json").is_file() else None


CELL = Cell(0, "listops / softmax / seed 0", ["attention=softmax", "seed=0"], "/f", "h", "listops", 10, 0)


def test_the_daemon_runs_in_a_short_folder_of_its_own_the_cells_connect_to_and_quits_when_the_block_raises(
    fake_mps, tmp_path, caplog
):
    caplog.set_level(logging.INFO, logger="lra.campaign")
    logs = tmp_path / ("a campaign folder deeper than a Unix socket's path may be " * 3) / "mps"
    with pytest.raises(RuntimeError, match="a cell failed"):
        with campaign.mps_daemon(True, True, logs) as env:
            pipe = Path(env["CUDA_MPS_PIPE_DIRECTORY"])
            assert started(fake_mps) == {"pid": started(fake_mps)["pid"], **env} and env["CUDA_MPS_LOG_DIRECTORY"] == str(logs)
            assert pipe.parent == Path(tempfile.gettempdir()) and pipe.name.startswith("lra-mps-") and (pipe / "control").exists()
            _, cell_env = campaign.cell_command(CELL, Share.of(2, 4), env)
            assert {key: cell_env[key] for key in env} == env and cell_env["OMP_NUM_THREADS"] == "2"
            raise RuntimeError("a cell failed")
    assert json.loads((fake_mps / "quit.json").read_text()) == {"CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
    assert not pipe.exists(), "its pipe folder is removed"
    said = [record.getMessage() for record in caplog.records]
    assert (
        said[0].startswith(f"MPS: started (nvidia-cuda-mps-control -d, CUDA_MPS_PIPE_DIRECTORY={pipe}")
        and said[-1] == "MPS: quit"
    )


@pytest.mark.parametrize("where", ["CUDA_MPS_PIPE_DIRECTORY", "the default pipe folder"])
@pytest.mark.parametrize("wanted", [True, False])
def test_a_daemon_already_running_for_the_user_is_used_as_it_is_and_left_running(
    where, wanted, fake_mps, tmp_path, monkeypatch, caplog
):
    caplog.set_level(logging.INFO, logger="lra.campaign")
    pipe = tmp_path / "users_mps"
    pipe.mkdir()
    (pipe / "control").write_text("")
    if where == "CUDA_MPS_PIPE_DIRECTORY":
        monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(pipe))
    else:
        monkeypatch.setattr(campaign.mps, "MPS_DEFAULT_PIPE", pipe)
    with campaign.mps_daemon(wanted, True, tmp_path / "mps") as env:
        assert env == {}, "the cells find it as this process does"
    assert started(fake_mps) is None and not (fake_mps / "quit.json").exists() and (pipe / "control").exists()
    (message,) = [record.getMessage() for record in caplog.records]
    assert message.startswith(f"MPS: already running for this user (its control socket {pipe / 'control'}), used as it is")


def test_unwanted_mps_starts_nothing(fake_mps, tmp_path):
    with campaign.mps_daemon(False, False, tmp_path / "mps") as env:
        assert env is None
    assert started(fake_mps) is None and not (tmp_path / "mps").exists()


def test_a_daemon_that_does_not_start_is_a_line_in_the_log_under_auto_and_the_campaigns_error_under_on(
    fake_mps, tmp_path, monkeypatch, caplog
):
    caplog.set_level(logging.INFO, logger="lra.campaign")
    monkeypatch.setenv("FAKE_MPS_FAIL", "1")
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    with campaign.mps_daemon(True, False, tmp_path / "mps") as env:
        assert env is None
    reason = "nvidia-cuda-mps-control -d exited with status 1: An instance of this daemon could not be started"
    assert [record.getMessage() for record in caplog.records] == [f"MPS: did not start ({reason}); the cells run without it"]
    with pytest.raises(CampaignError, match=re.escape(f"MPS did not start: {reason}; start it yourself")) as refused:
        with campaign.mps_daemon(True, True, tmp_path / "mps"):
            pytest.fail("the block runs without the MPS that --mps on requires")
    assert refused.value.status == 1
    assert list((tmp_path / "tmp").iterdir()) == [], "the pipe folders are removed"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["start", "--mps", "on", "attention=softmax"], "--mps on: the cells run on the CPU, and MPS shares a CUDA GPU; "),
        (["start", "--mps", "on", "--parallel", "auto", "--dry-run", "attention=softmax"], "--mps on: the cells run on the CPU"),
        (["measure", "--parallel", "1,2", "--mps", "off,on", "attention=softmax"], "--mps on: the cells run on the CPU"),
        (["measure", "--parallel", "1", "--mps", "on", "trainer=gpu"], "--mps on measures K above 1 only"),
        (["measure", "--parallel", "2", "--mps", "of", "attention=softmax"], "--mps takes off, on or both separated by a comma"),
    ],
)
def test_mps_on_where_it_cannot_be_used_is_one_message(argv, message, fake_mps, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LRA_OUTPUT_DIR", str(tmp_path / "outputs"))
    where = ["--dir", str(tmp_path / "campaign")] if argv[0] == "start" else []
    assert campaign.main([*argv[:1], *where, *argv[1:]]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and len(err.splitlines()) == 1, err
    assert started(fake_mps) is None and not (tmp_path / "campaign").exists()


def test_measuring_without_mps_while_a_daemon_runs_for_the_user_is_refused(fake_mps, tmp_path, capsys, monkeypatch):
    """Every copy would connect to it: the rows without MPS would be with it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LRA_OUTPUT_DIR", str(tmp_path / "outputs"))
    (tmp_path / "users_mps").mkdir()
    (tmp_path / "users_mps" / "control").write_text("")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "users_mps"))
    assert campaign.main(["measure", "--parallel", "1,2", "attention=none", *TINY]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: MPS is already running for this user (its control socket ") and len(err.splitlines()) == 1
    assert "without it cannot be measured; quit it (echo quit | nvidia-cuda-mps-control) or measure --mps on only" in err
    assert not (tmp_path / "outputs").exists(), "nothing measured"


def test_mps_on_without_the_daemons_command_is_one_message_and_a_dry_runs_note(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LRA_OUTPUT_DIR", str(tmp_path / "outputs"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    missing = "nvidia-cuda-mps-control is not on PATH (it is installed with the NVIDIA driver)"
    assert campaign.main(["start", "--dir", str(tmp_path / "c"), "--mps", "on", "--parallel", "2", "trainer=gpu", *TINY]) == 2
    assert capsys.readouterr().err == f"error: --mps on: {missing}; put the folder that holds it on PATH, or leave out on\n"
    # A dry run shows a GPU campaign's plan on any machine, and what refuses it on this one.
    assert campaign.main(["start", "--dry-run", "--mps", "on", "--parallel", "2", "trainer=gpu", *TINY]) == 0
    said = capsys.readouterr().out
    assert f"MPS off: {missing}" in said.splitlines()[0]
    assert f"note: {missing}; start --mps on refuses these cells on this machine" in said
    assert campaign.main(["measure", "--dry-run", "--parallel", "1,2", "--mps", "off,on", "trainer=gpu", *TINY]) == 0
    said = capsys.readouterr().out
    assert f"note: {missing}; measure --mps on refuses this cell on this machine" in said and "K = 1, 2, 2 with MPS (" in said


def test_auto_plans_a_cpu_campaign_without_mps_and_says_why(fake_mps, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LRA_OUTPUT_DIR", str(tmp_path / "outputs"))
    argv = ["start", "--dry-run", "--parallel", "2", "--results", str(tmp_path / "results"), "attention=softmax,none"]
    assert campaign.main(argv) == 0
    said = capsys.readouterr().out.splitlines()[0]
    # "each, at nice N)" where pytest itself runs niced (beside a campaign): the cells inherit its priority.
    assert re.search(r"each(, at nice \d+)?\); MPS off: the cells run on the CPU, and MPS shares a CUDA GPU$", said), said
    assert started(fake_mps) is None


def rows(*points: tuple[int, str | None, float]) -> list[dict[str, str]]:
    """Curve rows (K, MPS, cells per hour); MPS None: a row written before the column was."""
    return [{"parallel": str(k), "cells_per_hour": str(rate), **({} if mps is None else {"mps": mps})} for k, mps, rate in points]


def test_mps_auto_is_used_for_k_cells_unless_measured_slower_at_that_k():
    gpu = None  # no problem: a CUDA GPU and the daemon's command
    measured = rows((2, "on", 14), (2, "off", 10), (4, "on", 15), (4, "off", 16))
    assert campaign.mps_decision("auto", gpu, 2, measured) == (
        True,
        "measured at K = 2: 14 cells per hour with MPS, 10 without",
    )
    assert campaign.mps_decision("auto", gpu, 4, measured) == (
        False,
        "measured at K = 4: 15 cells per hour with MPS, 16 without",
    )
    assert campaign.mps_decision("auto", gpu, 8, measured)[0], "not measured both ways at 8"
    assert campaign.mps_decision("on", gpu, 4, measured) == (True, "--mps on")
    assert campaign.mps_decision("off", gpu, 2, measured) == (False, "--mps off")
    assert campaign.mps_decision("auto", gpu, 1, measured) == (False, "one cell at a time: MPS has nothing to share")
    cpu = ("the cells run on the CPU, and MPS shares a CUDA GPU", "the fix")
    assert campaign.mps_decision("auto", cpu, 4, measured) == (False, cpu[0])
    # A row from before the column is without MPS.
    assert campaign.mps_decision("auto", gpu, 2, rows((2, "on", 9), (2, None, 10)))[0] is False


@pytest.fixture
def gpu_curve(fake_mps, tmp_path, monkeypatch):
    """Write a GPU device's curve; --parallel and --mps chosen from it as on a 16-core GPU machine with MPS."""
    monkeypatch.setattr(campaign.control, "cores", lambda: 16)
    trainer = SimpleNamespace(accelerator="gpu")
    path = tmp_path / "results" / f"cells_per_hour_{campaign.device_slug(trainer)}.csv"

    def choose(curve: list[dict[str, str]], parallel: str = "auto", mps: str = "auto") -> tuple[int, bool, str]:
        if curve:
            path.parent.mkdir(exist_ok=True)
            with open(path, "w", newline="") as file:
                writer = csv.DictWriter(file, fieldnames=["parallel", "mps", "cells_per_hour"], restval="")
                writer.writeheader()
                writer.writerows(curve)
        return campaign.chosen_parallel(parallel, mps, trainer, path.parent)

    return choose


def test_auto_k_comes_from_the_curve_of_the_mps_setting_the_campaign_runs_with(gpu_curve, capsys):
    without = [(1, "off", 5), (2, "off", 12), (4, "off", 20)]  # 4 gained on 2: an off campaign tries 8
    assert gpu_curve(rows(*without, (2, "on", 10), (4, "on", 18))) == (
        8,
        True,
        "8 cells at once on a CUDA GPU (K = 8 not yet measured both with and without MPS)",
    )
    assert gpu_curve(rows(*without, (2, "on", 10), (4, "on", 18)), mps="off") == (8, False, "--mps off")
    # With MPS best at 2 and slower there than without: K from the curve without it.
    assert gpu_curve(rows(*without, (2, "on", 10.2), (4, "on", 10.3))) == (
        8,
        False,
        "measured at K = 2: 10.2 cells per hour with MPS, 12 without; K = 8 from the curve without it",
    )
    assert gpu_curve(rows(*without, (4, "on", 30), (8, "on", 30.5))) == (
        4,
        True,
        "measured at K = 4: 30 cells per hour with MPS, 20 without",
    )
    # Nothing with MPS yet: the K of the curve without it, measured with MPS this time.
    assert gpu_curve(rows((1, None, 5), (2, None, 9), (4, None, 9.1)))[:2] == (2, True)
    assert gpu_curve(rows((2, "on", 10)), mps="off") == (2, False, "--mps off")
    assert "nothing measured on this device without MPS yet" in capsys.readouterr().out
    assert gpu_curve(rows((2, "on", 10)), parallel="1") == (1, False, "one cell at a time: MPS has nothing to share")


def test_a_campaigns_measured_row_goes_under_its_own_mps_setting_and_speedups_stay_over_one_cell_without(tmp_path):
    results = tmp_path / "results"
    path = results / "cells_per_hour_cuda_h200.csv"
    path.parent.mkdir()
    old = {"device": "cuda_h200", "paper_steps": "10", "threads_per_cell": "16"}
    with open(path, "w", newline="") as file:  # a curve from before the mps column
        writer = csv.DictWriter(file, fieldnames=[field for field in campaign.CURVE_FIELDS if field != "mps"], restval="")
        writer.writeheader()
        writer.writerows(
            [
                {**old, "parallel": "1", "cells_per_hour": "10", "cell": "measure"},
                {**old, "parallel": "2", "cells_per_hour": "16", "cell": "campaign of 3 cells: x"},
            ]
        )
    plan = SimpleNamespace(device="cuda_h200", runs_dir=str(results / "runs"), cells=[CELL] * 3, overrides=["x"], cores=16)
    said = campaign.record_throughput(plan, 2, [CELL, CELL], 20, 3600, True)
    assert said.startswith("K = 2 with MPS: 20 steps in 3600 s, 2.0 cells per hour")
    campaign.record_throughput(plan, 2, [CELL], 25, 3600, True)  # the next job's campaign with MPS replaces its row
    curve = read_rows(path)
    assert [(r["parallel"], r["mps"], r["cells_per_hour"], r["speedup"]) for r in curve] == [
        ("1", "off", "10.0", "1.0"),
        ("2", "off", "16.0", "1.6"),
        ("2", "on", "2.5", "0.25"),
    ]


@pytest.mark.slow
def test_a_campaign_under_mps_starts_the_daemon_before_its_cells_connects_them_and_quits_it_at_its_end(
    fake_mps, tmp_path, monkeypatch
):
    """Two tiny cells at once, MPS forced on a CPU campaign (its one gate, mps_problem, says yes): the campaign's own
    daemon, its variables in each cell's environment, quit once both cells ended."""
    env = {**os.environ, "LRA_DATA_DIR": str(tmp_path / "data"), "LRA_OUTPUT_DIR": str(tmp_path / "outputs")}
    forced = "import sys; from lra import campaign as c; c.control.mps_problem = lambda trainer: None; sys.exit(c.main())"
    argv = ["start", "--foreground", "--parallel", "2", "--mps", "on", "attention=softmax,none", *TINY]
    done = subprocess.run(
        [sys.executable, "-c", forced, *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    folder = tmp_path / "outputs" / "campaign"
    plan = json.loads((folder / campaign.PLAN_FILE).read_text())
    assert (plan["mps_setting"], plan["mps"], plan["mps_reason"]) == ("on", True, "--mps on")
    daemon = started(fake_mps)
    pipe = daemon["CUDA_MPS_PIPE_DIRECTORY"]
    assert daemon["CUDA_MPS_LOG_DIRECTORY"] == str(folder / "mps")
    assert json.loads((fake_mps / "quit.json").read_text()) == {"CUDA_MPS_PIPE_DIRECTORY": pipe} and not Path(pipe).exists()
    # --foreground: the campaign logs to its stderr
    lines = [line.split(" ", 2)[2] for line in done.stderr.splitlines() if re.match(r"\d{4}-\d\d-\d\d \d\d:", line)]
    plan_line = next(line for line in lines if not line.startswith("Priority: "))  # that line: where pytest runs niced
    assert "; MPS on: --mps on; pid " in plan_line, lines
    events = [line for line in lines if line.startswith(("MPS", "launched", "ended"))]
    assert (
        events[0].startswith(f"MPS: started (nvidia-cuda-mps-control -d, CUDA_MPS_PIPE_DIRECTORY={pipe},")
        and events[-1] == "MPS: quit"
    )
    assert sorted(event.split(" ")[0] for event in events[1:-1]) == ["ended", "ended", "launched", "launched"], events
    for n in (0, 1):
        header = (folder / campaign.CELLS / f"{n}.log").read_text().splitlines()[1]
        assert header.endswith(f" CUDA_MPS_PIPE_DIRECTORY={pipe} CUDA_MPS_LOG_DIRECTORY={folder / 'mps'}"), header
