""".ci/gpu/job.py, a short GPU job's run of ``python -m lra.bench gpu``: its budget, its archive after every step, its
exit status. The command is a stand-in here (no GPU), one that does what a step does to the folder and the clock."""

import importlib.util
import json
import random
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gpu_job", ROOT / ".ci" / "gpu" / "job.py")
job = importlib.util.module_from_spec(spec)
spec.loader.exec_module(job)

# A step's stand-in: it notes its step and time limit, then does what its step's name says.
STAND_IN = """import json, sys, time, tarfile; from pathlib import Path
step, limit, out = sys.argv[1], float(sys.argv[2]), Path(sys.argv[3])
with open(out.parent / "steps.jsonl", "a") as notes: notes.write(json.dumps([step, limit]) + "\\n")
if step == "check":  # writes results, a profile, a checkpoint, touches an old file, and the record
    (out / "kernels_cuda.csv").write_text("method,time_ms\\nyoso_32,1.5\\n")
    (out / "step_cuda_profile").mkdir(); (out / "step_cuda_profile" / "none.txt").write_text("a profile")
    (out / "last.ckpt").write_text("a checkpoint"); (out / "old.csv").touch()
    (out / "gpu_validation_cuda.json").write_text('{"steps": {"check": {}}}')
    (out / "gpu_validation_cuda.md").write_text("# the summary")
if step == "tests":  # the archive as it found it, then all its time limit but 2.5 s
    print("ARCHIVE", sorted(tarfile.open(sys.argv[4]).getnames()), flush=True)
    time.sleep(max(limit - 2.5, 0))
raise SystemExit({"memcheck": 1, "kernels": 2}.get(step, 0))"""


@pytest.fixture
def stand_in(monkeypatch, tmp_path):
    archive = tmp_path / "OUT" / "gpu_validation.tar.gz"

    def command(step, limit_s, out, options):
        assert options == ["-k", "float32"], "the command's own options go through"
        return [sys.executable, "-c", STAND_IN, step, str(limit_s), str(out), str(archive)]

    monkeypatch.setattr(job, "gpu_command", command)
    return archive


def steps_run(tmp_path: Path) -> list[list]:
    return [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]


def test_the_budget_caps_each_step_and_starts_none_it_leaves_no_time_for(tmp_path, stand_in, capsys):
    out = tmp_path / "results"
    start = time.monotonic()
    argv = ["--budget", "8", "--min-step", "3", "--steps", "check,tests,memcheck,racecheck", "--out", str(out)]
    assert job.main([*argv, "--archive", str(stand_in), "--", "-k", "float32"]) == 0
    assert time.monotonic() - start < 15
    (check, check_limit), (tests, tests_limit) = steps_run(tmp_path)
    assert (check, tests) == ("check", "tests") and 7 < check_limit <= 8 and 3 < tests_limit < check_limit
    printed = capsys.readouterr().out
    assert f"[job] tests: at most {tests_limit:.0f} s, what is left of --budget 8 s" in printed
    assert "[job] not run: memcheck, racecheck: 2 s left of --budget 8 s, a step starts only with 3 s" in printed

    # Within a long budget every step gets --step-limit; a failed step fails the job, the next ones still run.
    (tmp_path / "steps.jsonl").unlink()
    argv = ["--budget", "3600", "--step-limit", "540", "--steps", "memcheck,racecheck", "--out", str(out)]
    assert job.main([*argv, "--", "-k", "float32"]) == 1
    assert steps_run(tmp_path) == [["memcheck", 540.0], ["racecheck", 540.0]]


def test_without_a_gpu_the_job_stops_at_the_first_step(tmp_path, stand_in):
    argv = ["--budget", "3600", "--steps", "kernels,racecheck", "--out", str(tmp_path / "results"), "--", "-k", "float32"]
    assert job.main(argv) == job.NO_GPU and steps_run(tmp_path) == [["kernels", 570.0]]


def test_the_archive_after_every_step_holds_what_the_job_wrote_relative_to_out(tmp_path, stand_in, capfd):
    out = tmp_path / "results"
    out.mkdir()
    (out / "old.csv").write_text("kept\n")
    (out / "untouched.csv").write_text("not this job's\n")
    argv = ["--budget", "6", "--min-step", "1", "--steps", "check,tests", "--out", str(out), "--archive", str(stand_in)]
    assert job.main([*argv, "--", "-k", "float32"]) == 0
    first = ["gpu_validation_cuda.json", "gpu_validation_cuda.md", "kernels_cuda.csv", "old.csv", "step_cuda_profile/none.txt"]
    printed = capfd.readouterr().out  # the steps' output too
    assert f"ARCHIVE {first}" in printed, "the archive, as the next step found it, held the first step's files"
    assert f"{stand_in}: 5 files" in printed
    assert sorted(p.name for p in stand_in.parent.iterdir()) == ["gpu_validation.tar.gz"], "no temporary file left"
    home = tmp_path / "home" / "results"
    home.mkdir(parents=True)
    with tarfile.open(stand_in) as opened:
        assert sorted(opened.getnames()) == first, "no checkpoint, nothing the job did not write"
        opened.extractall(home, filter="data")
    assert (home / "kernels_cuda.csv").read_text() == "method,time_ms\nyoso_32,1.5\n"
    assert (home / "step_cuda_profile" / "none.txt").read_text() == "a profile"


def test_an_archive_over_what_a_job_may_bring_back_is_warned_of(tmp_path, monkeypatch, capsys):
    out = tmp_path / "results"
    out.mkdir()
    (out / "big.bin").write_bytes(random.Random(0).randbytes(2 * 2**20))  # 2 MiB that gzip cannot shrink
    monkeypatch.setattr(job, "ARCHIVE_LIMIT", 2**20)
    args = job.parse(["--budget", "60", "--out", str(out), "--archive", str(tmp_path / "a.tar.gz")])
    job.archive_now(args, before={})
    assert "warning: over 1 MiB, more than a short GPU job may bring back in one file" in capsys.readouterr().out


def test_bad_options_are_one_clear_error(capsys):
    for argv, message in (
        (["--budget", "-5"], "--budget is a positive number of seconds, got -5"),
        (["--budget", "60", "--step-limit", "0"], "--step-limit is a positive number of seconds, got 0"),
        (["--budget", "60", "--steps", "check,sanitizer"], "unknown step(s) sanitizer; choose from check,tests,memcheck"),
    ):
        with pytest.raises(SystemExit):
            job.main(argv)
        assert message in capsys.readouterr().err


def test_each_step_is_the_gpu_command_of_that_step_under_its_limit(tmp_path):
    command = job.gpu_command("racecheck", 212.4, tmp_path, ["-k", "float32"])
    assert command[:8] == [sys.executable, "-m", "lra.bench", "gpu", "--steps", "racecheck", "--timeout", "racecheck=212"]
    assert command[8:] == ["--out", str(tmp_path), "-k", "float32"]
    dry_run = subprocess.run([*command, "--dry-run"], capture_output=True, text=True, timeout=120)
    assert dry_run.returncode == 0 and dry_run.stdout.startswith("[racecheck] limit 212 s: "), dry_run.stderr
