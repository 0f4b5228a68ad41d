"""``python -m lra.bench gpu``: what runs of it on a CPU (its plan, its refusal, its runner, its summary)."""

import csv
import json
import subprocess
import sys
import tarfile
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import torch

from lra import config
from lra.bench import gpu

STEPS = ["check", "tests", "memcheck", "racecheck", "kernels", "efficiency", "train", "cells", "step"]


def test_the_plan_runs_every_step_in_order_and_a_dry_run_prints_it(tmp_path, capsys):
    assert list(gpu.plan(tmp_path, tmp_path / "train")) == STEPS
    assert gpu.main(["--dry-run", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("]")[0].lstrip("[") for line in lines] == STEPS
    assert "YOSO_KERNELS=require" in lines[0] and lines[0].endswith("-m yoso_cuda --check")
    assert "-m pytest -q -p no:cacheprovider -m cuda tests/yoso_cuda" in lines[1]
    assert (
        "--tool memcheck --report-api-errors no --error-exitcode 1" in lines[2] and "PYTORCH_NO_CUDA_MEMORY_CACHING=1" in lines[2]
    )
    assert f"--out {tmp_path}" in lines[4] and f"--out {tmp_path}" in lines[5]
    assert "attention=" + ",".join(gpu.preset_names()) in lines[6] and "trainer=gpu" in lines[6]
    for line in lines[2:4]:
        assert ("# skipped: compute-sanitizer not found" in line) == (gpu.compute_sanitizer() is None)


def test_steps_can_be_chosen_and_a_typo_is_a_clear_error(tmp_path, capsys):
    assert gpu.main(["--dry-run", "--steps", "train,check", "-k", "matches", "--timeout", "60"]) == 0
    assert [line.split("]")[0] for line in capsys.readouterr().out.splitlines()] == ["[check", "[train"]
    plan = gpu.plan(tmp_path, tmp_path, timeout=60, pytest_filter="matches")
    assert plan["memcheck"].command[-2:] == ["-k", "matches"] and plan["kernels"].timeout_s == 60
    with pytest.raises(SystemExit):
        gpu.main(["--steps", "check,sanitizer"])
    assert "unknown step(s) sanitizer; choose from check,tests,memcheck" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_without_a_gpu_it_refuses_clearly():
    process = subprocess.run([sys.executable, "-m", "lra.bench", "gpu"], capture_output=True, text=True, timeout=120)
    assert process.returncode == 2
    assert "No CUDA GPU is visible" in process.stdout and "--dry-run" in process.stdout


def test_the_training_overrides_compose_with_every_preset():
    for preset in gpu.preset_names():
        cfg = config.compose([f"attention={preset}", *gpu.TRAIN_OVERRIDES])
        assert cfg.trainer.accelerator == "gpu" and cfg.trainer.precision == "bf16-mixed"
        protocol = cfg.task.protocol
        assert protocol.val_check_interval <= protocol.max_steps == 60 and protocol.warmup_steps >= 2
        assert cfg.task.data.source == "generated", "the smoke ListOps: nothing to download"


def test_the_cells_step_measures_each_k_with_and_without_mps_where_the_daemons_command_is_on_path(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    command = gpu.plan(tmp_path, tmp_path)["cells"].command
    assert command[command.index("--mps") + 1] == "off"
    fields = ["parallel", "mps", "cells_per_hour", "paper_steps", "speedup", "finished", "wall_s"]
    with open(tmp_path / "cells_per_hour_cuda_h200.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(
            [
                dict(zip(fields, ("1", "off", "2.0", "5000", "1.0", "1/1", "60.0"))),
                dict(zip(fields, ("2", "off", "3.0", "5000", "1.5", "2/2", "80.0"))),
            ]
        )
    assert gpu.cells_figures(tmp_path) == (
        [
            "K=1, MPS off: 2.0 cells of 5000 steps per hour (x1.0), 1/1 finished in 60.0 s",
            "K=2, MPS off: 3.0 cells of 5000 steps per hour (x1.5), 2/2 finished in 80.0 s",
            "without MPS only: nvidia-cuda-mps-control is not on PATH",
        ],
        True,
    )

    (bin_dir / "nvidia-cuda-mps-control").write_text("#!/bin/sh\n")
    (bin_dir / "nvidia-cuda-mps-control").chmod(0o755)
    command = gpu.plan(tmp_path, tmp_path)["cells"].command
    assert command[command.index("--mps") + 1] == "off,on" and command[command.index("--parallel") + 1] == "1,2,4,8,16"
    with open(tmp_path / "cells_per_hour_cuda_h200.csv", "a", newline="") as handle:
        csv.DictWriter(handle, fieldnames=fields).writerow(dict(zip(fields, ("2", "on", "3.9", "5000", "1.95", "1/2", "81.0"))))
    figures, every_copy_finished = gpu.cells_figures(tmp_path)
    assert figures[-1] == "K=2, MPS on: 3.9 cells of 5000 steps per hour (x1.95), 1/2 finished in 81.0 s" and len(figures) == 3
    assert not every_copy_finished


def test_a_step_that_fails_or_outlives_its_timeout_is_recorded_and_stopped(tmp_path):
    failing = gpu.Step("failing", [sys.executable, "-c", "print('some output'); raise SystemExit(3)"], 60)
    assert gpu.run_step(failing, tmp_path / "failing.log")[0] == "failed"
    assert "some output" in (tmp_path / "failing.log").read_text()
    sleeper = gpu.Step("sleeper", [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(600)"], 2)
    start = time.monotonic()
    status, duration = gpu.run_step(sleeper, tmp_path / "sleeper.log")
    assert status == "timeout" and duration < 30 and time.monotonic() - start < 30
    assert "stopped after the step's timeout of 2 s" in (tmp_path / "sleeper.log").read_text()


def test_a_steps_log_names_the_checkout_relatively_and_the_interpreter_as_python(tmp_path):
    """A record committed from one machine reads the same on another: no absolute paths of the machine it ran on."""
    script = f"print({str(gpu.ROOT / 'results' / 'x.csv')!r}); print({str(gpu.ROOT)!r})"
    step = gpu.Step("paths", [sys.executable, "-c", script, str(gpu.ROOT / "results")], 60)
    assert gpu.run_step(step, tmp_path / "paths.log")[0] == "passed"
    log = (tmp_path / "paths.log").read_text()
    assert log.startswith("$ python -c ") and " results\n" in log.splitlines(keepends=True)[0]
    assert "\nresults/x.csv\n.\n" in log and str(gpu.ROOT) not in log and sys.executable not in log


CHECK_LOG = """cpu kernels: loaded (/x/yoso_kernels_cpu.so)
cuda kernels: loaded (/x/yoso_kernels_cuda.so, archs 9.0 (the visible GPUs))
cpu   lsh_cumulation                             PASS  max |error| 0.00e+00 over 12 comparisons
cuda  lsh_cumulation                             PASS  max |error| 1.20e-07 over 12 comparisons
cuda  lsh_collided_gradient                      FAIL  max |error| 3.00e-01 over 12 comparisons; float32, nq=7: beyond
check FAILED in 4.0 s
"""
SANITIZER_LOG = """========= COMPUTE-SANITIZER
........                                                                 [100%]
49 passed, 3 skipped in 201.30s (0:03:21)
========= ERROR SUMMARY: 0 errors
"""


def fake_outputs(out: Path, train_dir: Path) -> None:
    rows = [
        dict(method="softmax/flash", seq_len=65536, head_dim=64, dtype="bfloat16", time_ms=80.0, error=""),
        dict(method="softmax/math", seq_len=65536, head_dim=64, dtype="bfloat16", time_ms="nan", error="out of memory"),
        dict(method="yoso_32", seq_len=65536, head_dim=64, dtype="bfloat16", time_ms=25.5, error=""),
        dict(method="yoso_32", seq_len=1024, head_dim=64, dtype="bfloat16", time_ms=1.5, error=""),
    ]
    with open(out / "kernels_cuda.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[*rows[0], "pass"])
        writer.writeheader()
        writer.writerows({**row, "pass": "forward+backward"} for row in rows)
    with open(out / "efficiency_cuda.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["attention", "seq_len", "batch", "time_ms", "memory_mb", "status"])
        writer.writeheader()
        writer.writerow(dict(attention="yoso_32", seq_len=8192, batch=32, time_ms=0.75, memory_mb=120.0, status="ok"))
        writer.writerow(dict(attention="softmax", seq_len=8192, batch="", time_ms="nan", memory_mb="nan", status="out_of_memory"))
        writer.writerow(dict(attention="softmax", seq_len=512, batch=512, time_ms=0.1, memory_mb=10.0, status="ok"))
    for preset in gpu.preset_names():
        run = train_dir / "listops" / preset / "trainer=gpu,task.protocol.max_steps=60"
        run.mkdir(parents=True)
        failed = preset == "reformer"
        record = {
            "status": "failed" if failed else "finished",
            "attention": preset,
            "steps": 60,
            "test_acc": 0.25,
            "wall_time_s": 12.5,
            "peak_memory_mb": 300.0,
            "device": "NVIDIA H100",
            "error": "CUDA error" if failed else "",
        }
        (run / "results.json").write_text(json.dumps(record))


def test_the_summary_holds_each_steps_status_duration_and_key_figures(tmp_path):
    out, train_dir = tmp_path / "results", tmp_path / "outputs"
    out.mkdir()
    fake_outputs(out, train_dir)
    figures = {
        "check": gpu.figures_for("check", CHECK_LOG, out, train_dir),
        "memcheck": gpu.figures_for("memcheck", SANITIZER_LOG, out, train_dir),
        "kernels": gpu.figures_for("kernels", "", out, train_dir),
        "efficiency": gpu.figures_for("efficiency", "", out, train_dir),
        "train": gpu.figures_for("train", "", out, train_dir),
    }
    assert figures["check"][0][0] == "2 PASS, 1 FAIL"
    assert (
        "cuda lsh_collided_gradient: FAIL (max |error| 3.00e-01 over 12 comparisons; float32, nq=7: beyond)"
        in figures["check"][0]
    )
    assert figures["memcheck"][0][:2] == ["ERROR SUMMARY: 0 errors", "pytest: 49 passed, 3 skipped in 201.30s (0:03:21)"]
    assert "bfloat16 d=64 n=65536 forward+backward: yoso_32 25.50 ms, softmax/flash 80.00 ms" in figures["kernels"][0]
    assert figures["efficiency"][0][:2] == [
        "yoso_32 n=8192: 0.750 ms and 120.0 MB per instance (batch 32)",
        "softmax n=8192: out_of_memory",
    ]
    train_lines, every_preset_finished = figures["train"]
    assert (
        not every_preset_finished
        and "reformer: failed, 60 steps, test acc 0.25, 12.5 s, 300.0 MB, error: CUDA error" in train_lines
    )
    with open(out / "train_presets_cuda.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["attention_preset"] for row in rows] == gpu.preset_names()

    record = gpu.load_record(out, STEPS)
    record["machine"] = {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "driver, GPU memory": "580.65, 81559 MiB"}
    for name, status in (("train", "failed"), ("check", "failed"), ("kernels", "passed")):
        result = gpu.StepResult(
            name, f"python -m {name}", status, 12.3, figures[name][0], f"gpu_validation_cuda/{name}.log", "now"
        )
        record["steps"][name] = result.__dict__
    gpu.save(out, record)
    summary = (out / "gpu_validation_cuda.md").read_text()
    assert "| device | NVIDIA H100 80GB HBM3 |" in summary and "| driver, GPU memory | 580.65, 81559 MiB |" in summary
    assert "| train | failed | 12 s | not recorded | `python -m train` |" in summary
    assert "## kernels: passed" in summary and "- bfloat16 d=64 n=65536 forward+backward: yoso_32 25.50 ms" in summary

    # A later run of other steps keeps these, in step order.
    reloaded = gpu.load_record(out, STEPS)
    assert list(reloaded["steps"]) == ["check", "kernels", "train"]
    assert reloaded["steps"]["kernels"]["figures"] == figures["kernels"][0]


def test_the_step_figures_check_the_none_listops_step_and_the_twelve_rows_against_their_targets(tmp_path):
    from lra.bench.output import write_csv
    from lra.bench.step import FIELDS
    from lra.paper import TABLES

    def row(attention, compiled, step_ms, eval_ms):
        values = dict.fromkeys(FIELDS, "")
        values.update(task="listops", seq_len=2048, attention=attention, data_loading=False, status="ok", compiled=compiled)
        values.update(
            step_ms=step_ms, eval_ms=eval_ms, device_ms=0.4, kernels=12, compile_mode="reduce-overhead" if compiled else ""
        )
        values.update(loop_ms=round(step_ms * 0.7, 2), eval_loop_ms=round(eval_ms * 0.5, 2))
        return values

    write_csv([row("none", False, 6.1, 2.0), row("softmax", False, 20.0, 5.0)], tmp_path / "step_cuda.csv", FIELDS)
    figures, holds = gpu.step_figures(tmp_path)
    assert holds and figures[0].startswith(
        "none eager: step 6.1 ms (4.27 back to back), evaluation batch 2.0 ms (1.0 back to back), device busy 0.4 ms in 12"
    )
    assert "none step <= 3.0 ms: NOT met" in figures[-1]
    write_csv([row("none", False, 6.1, 2.0), row("none", True, 2.5, 1.0)], tmp_path / "step_cuda.csv", FIELDS)
    figures, _ = gpu.step_figures(tmp_path)
    assert (
        "none compiled reduce-overhead: step 2.5 ms" in figures[1]
        and "met (best: 2.5 ms step, 1.0 ms evaluation, compiled; back to back, as lra.train's loop: 1.75 and 0.5 ms)"
        in figures[-1]
    )
    assert gpu.step_figures(tmp_path / "nothing") == ([], False)
    twelve = TABLES["table3"].presets
    candidates = [row("softmax_unpadded", True, 3.5, 1.0), row("yoso_e_flex", False, 9.0, 1.0)]  # never in the sum
    write_csv(
        [*candidates, *(row(name, True, 4.0 + i, 1.0) for i, name in enumerate(twelve))], tmp_path / "step_cuda.csv", FIELDS
    )
    figures, _ = gpu.step_figures(tmp_path)
    assert twelve.index("softmax") == 1 and figures[0].startswith(
        "softmax_unpadded compiled reduce-overhead: step 3.5 ms, 0.70x softmax's (2.45 back to back)"
    )
    assert figures[1].startswith("yoso_e_flex eager: step 9.0 ms (6.3 back to back)"), "no eager yoso_e to compare with"
    assert figures[-1] == (
        f"the twelve rows' compiled steps sum to 114.0 ms (target 60 ms on an H100: NOT met); slowest {twelve[-1]} 15.00 ms"
    )


def test_the_step_figures_of_a_run_are_its_own_rows_not_the_files_earlier_ones(tmp_path):
    from lra.bench.output import write_csv
    from lra.bench.step import FIELDS

    def row(attention, step_ms, measured_at):
        values = dict.fromkeys(FIELDS, "")
        values.update(task="listops", seq_len=2048, attention=attention, data_loading=False, status="ok", compiled=False)
        values.update(step_ms=step_ms, eval_ms=1.0, measured_at=measured_at)
        return values

    started = datetime(2026, 11, 28, 20, 30, 5, tzinfo=timezone.utc)
    rows = [row("none", 8.4, ""), row("softmax", 21.9, "2026-11-28T20:30:04+00:00")]  # an older file's, a minute-old
    rows += [row("yoso_32", 21.4, "2026-11-28T20:30:05+00:00"), row("yoso_e", 26.8, "2026-11-28T21:02:00+00:00")]
    write_csv(rows, tmp_path / "step_cuda.csv", FIELDS)
    figures, _ = gpu.step_figures(tmp_path, started.timestamp() + 0.4)
    assert figures[0] == "2 rows of step_cuda.csv are earlier runs' (not shown)"
    assert [figure.split(":")[0] for figure in figures[1:]] == ["yoso_32 eager", "yoso_e eager"]
    every = gpu.step_figures(tmp_path)[0]  # without a start, every row (and none's target, as it has a row now)
    assert [figure.split(":")[0] for figure in every[:4]] == ["none eager", "softmax eager", "yoso_32 eager", "yoso_e eager"]


def test_the_step_times_each_candidate_path_right_after_its_row():
    attentions = gpu.step_attentions()
    twelve = gpu.TABLES["table3"].presets
    assert [name for name in attentions if name in twelve] == list(twelve)
    assert sorted(set(attentions) - set(twelve)) == sorted(gpu.STEP_CANDIDATES)
    for candidate, row in gpu.STEP_CANDIDATES.items():
        assert attentions.index(candidate) == attentions.index(row) + 1
    assert ",".join(attentions) in gpu.plan(Path("results"), Path("train"))["step"].command


def sleeper(name: str, timeout_s: float = 20) -> gpu.Step:
    return gpu.Step(name, [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(600)"], timeout_s)


def test_a_budget_caps_the_running_step_and_skips_the_steps_it_leaves_no_time_for(tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    record = {**gpu.load_record(out, STEPS), "machine": {"device": "a stand-in GPU"}}
    earlier = gpu.StepResult("racecheck", "old", "passed", 62.2, ["RACECHECK SUMMARY: 0 hazards"], "r.log", "2026-11-25")
    record["steps"]["racecheck"] = earlier.__dict__
    steps = [
        gpu.Step("check", [sys.executable, "-c", "print('cuda  lsh_cumulation  PASS  max |error| 0')"], 540),
        sleeper("tests"),
        sleeper("memcheck"),
        sleeper("racecheck"),
    ]
    start = time.monotonic()
    statuses = gpu.run_steps(steps, out, tmp_path / "train", record, STEPS, budget=6, started=start, min_step_s=1)
    assert statuses == ["passed", "timeout", "skipped", "skipped"] and time.monotonic() - start < 15
    assert 1 < steps[1].timeout_s < 6, "the running step's timeout: what was left of the budget, not its own 20 s"
    saved = json.loads((out / "gpu_validation_cuda.json").read_text())["steps"]
    assert saved["check"]["figures"][0] == "1 PASS, 0 FAIL"
    assert saved["tests"]["figures"][:2] == [
        f"stopped after {steps[1].timeout_s:.0f} s, what was left of --budget 6 s (its own timeout: 20 s)",
        "pytest: no summary line",
    ]
    reason = "no time left in --budget 6 s: 0 s left, a step starts only with at least 1 s"
    assert [saved[name]["figures"] for name in ("memcheck", "racecheck")] == [[reason], [reason]]
    assert saved["memcheck"]["earlier"] is None and saved["racecheck"]["earlier"] == earlier.__dict__
    summary = (out / "gpu_validation_cuda.md").read_text()
    assert "## racecheck: skipped\n\n`python -c" in summary and f"- {reason}\n" in summary
    assert "- before: passed in 62 s (2026-11-25), kept here:\n  - RACECHECK SUMMARY: 0 hazards\n" in summary
    assert "| memcheck | skipped | 0 s |" in summary

    # Without a budget the steps keep their own timeouts, and a skip keeps nothing.
    quick = gpu.Step("racecheck", [sys.executable, "-c", "pass"], 540)
    assert gpu.run_steps([quick], out, tmp_path / "train", record, STEPS) == ["passed"] and quick.timeout_s == 540


UNBUILT = (
    "print('cpu kernels: loaded (/x/yoso_kernels_cpu.so)'); "
    "print('cuda kernels: FAILED: it links its own static copy of the C++ standard library'); raise SystemExit(1)"
)


def test_kernels_that_did_not_build_skip_the_steps_that_test_or_time_them(tmp_path):
    """A window's first call once ran tests, memcheck, racecheck and kernels after the build had
    failed, each rebuilding and failing the same way; now they are skipped and step still runs."""
    out = tmp_path / "results"
    out.mkdir()
    record = {**gpu.load_record(out, STEPS), "machine": {"device": "a stand-in GPU"}}
    earlier = gpu.StepResult("kernels", "old", "passed", 55.0, ["yoso_32 1.5 ms"], "k.log", "2026-11-25")
    record["steps"]["kernels"] = earlier.__dict__
    ran = "print('ran')"
    steps = [gpu.Step("check", [sys.executable, "-c", UNBUILT], 60)]
    steps += [gpu.Step(name, [sys.executable, "-c", ran], 60) for name in ("tests", "memcheck", "kernels", "step")]
    statuses = gpu.run_steps(steps, out, tmp_path / "train", record, STEPS)
    assert statuses == ["failed", "skipped", "skipped", "skipped", "failed"]
    saved = json.loads((out / "gpu_validation_cuda.json").read_text())["steps"]
    reason = saved["tests"]["figures"][0]
    assert reason.startswith("the CUDA kernels did not build or are unsafe (check, gpu_validation_cuda/check.log)")
    assert saved["kernels"]["figures"] == [reason] and saved["kernels"]["earlier"] == earlier.__dict__
    assert saved["step"]["figures"] == ["wrote no step_cuda.csv"]  # it ran: none and softmax need no kernels

    # A check that fails on a wrong result, with the kernels built, still lets the tests show where.
    steps = [gpu.Step("check", [sys.executable, "-c", "print('cuda  lsh_cumulation  FAIL  max |error| 1'); exit(1)"], 60)]
    steps += [gpu.Step("tests", [sys.executable, "-c", ran], 60)]
    assert gpu.run_steps(steps, out, tmp_path / "train", record, STEPS) == ["failed", "passed"]


def test_an_output_older_than_its_step_is_not_read_as_the_steps_result(tmp_path):
    """A kernels step that failed before writing once showed the rows of an earlier run as its own."""
    out, train_dir = tmp_path / "results", tmp_path / "outputs"
    out.mkdir()
    fake_outputs(out, train_dir)
    figures, holds = gpu.figures_for("kernels", "", out, train_dir, since=time.time() + 5)
    assert figures == ["wrote no kernels_cuda.csv (the one there is an earlier run's, left as it was)"] and not holds
    figures, holds = gpu.figures_for("kernels", "", out, train_dir, since=time.time() - 60)
    assert holds and "yoso_32 25.50 ms" in figures[0]
    assert gpu.figures_for("efficiency", "", out / "empty", train_dir, since=0.0) == (["wrote no efficiency_cuda.csv"], False)


WRITES = """from pathlib import Path; import sys; out = Path(sys.argv[1])
(out / 'kernels_cuda.csv').write_text('method,time_ms\\nyoso_32,1.5\\n')
(out / 'step_cuda_profile').mkdir(); (out / 'step_cuda_profile' / 'none.txt').write_text('a profile')
(out / 'last.ckpt').write_text('a checkpoint'); (out / 'old.csv').touch()"""
LISTS = """import sys, tarfile, time; print(sorted(tarfile.open(sys.argv[1]).getnames()), flush=True); time.sleep(600)"""


def test_the_archive_after_every_step_holds_what_the_run_wrote_relative_to_out(tmp_path, monkeypatch, capsys):
    out, archive = tmp_path / "results", tmp_path / "OUT" / "gpu_validation.tar.gz"
    out.mkdir()
    (out / "old.csv").write_text("kept\n")
    (out / "untouched.csv").write_text("not this run's\n")
    earlier = gpu.StepResult("train", "python -m lra.train", "passed", 56.8, ["softmax: finished"], "t.log", "earlier")
    (out / "gpu_validation_cuda.json").write_text(json.dumps({"steps": {"train": earlier.__dict__}}))

    def fake_plan(*args, **kwargs):
        steps = [
            gpu.Step("check", [sys.executable, "-c", WRITES, str(out)], 540),
            gpu.Step("tests", [sys.executable, "-c", LISTS, str(archive)], 20),
            sleeper("memcheck"),
            sleeper("train"),
        ]
        return {step.name: step for step in steps}

    monkeypatch.setattr(gpu, "plan", fake_plan)
    monkeypatch.setattr(gpu, "machine", lambda: {"device": "a stand-in GPU"})
    monkeypatch.setattr(gpu, "MIN_STEP_S", 1.0)
    monkeypatch.setattr(gpu.torch.cuda, "is_available", lambda: True)
    start = time.monotonic()
    argv = ["--steps", "check,tests,memcheck", "--out", str(out), "--budget", "6", "--archive", str(archive)]
    assert gpu.main(argv) == 1 and time.monotonic() - start < 15
    assert f"{archive}: 7 files" in capsys.readouterr().out

    first = [
        "gpu_validation_cuda.json",
        "gpu_validation_cuda.md",
        "gpu_validation_cuda/check.log",
        "kernels_cuda.csv",
        "old.csv",
        "step_cuda_profile/none.txt",
    ]
    tests_log = (out / "gpu_validation_cuda" / "tests.log").read_text()
    assert str(first) in tests_log, "the archive, as the next step found it, held the first step's files"
    assert "# stopped after the step's timeout of" in tests_log
    assert sorted(p.name for p in archive.parent.iterdir()) == ["gpu_validation.tar.gz"], "no temporary file left"

    home = tmp_path / "home" / "results"
    home.mkdir(parents=True)
    with tarfile.open(archive) as opened:
        assert sorted(opened.getnames()) == sorted([*first, "gpu_validation_cuda/tests.log"])
        opened.extractall(home, filter="data")
    assert (home / "kernels_cuda.csv").read_text() == "method,time_ms\nyoso_32,1.5\n"
    assert (home / "step_cuda_profile" / "none.txt").read_text() == "a profile"
    assert (home / "gpu_validation_cuda" / "tests.log").read_text() == tests_log
    record = json.loads((home / "gpu_validation_cuda.json").read_text())
    assert {name: step["status"] for name, step in record["steps"].items()} == {
        "check": "passed",
        "tests": "timeout",
        "memcheck": "skipped",
        "train": "passed",
    }
    assert record["steps"]["train"] == earlier.__dict__ and record["machine"] == {"device": "a stand-in GPU"}
    assert (home / "gpu_validation_cuda.md").read_text() == gpu.render(record)


def test_each_step_names_the_machine_and_commit_it_ran_on_when_a_later_run_on_another_keeps_it(tmp_path):
    """The summary's machine is the latest run's; a step kept from an earlier run on another GPU must say so."""
    out = tmp_path / "results"
    out.mkdir()
    kept = gpu.StepResult("tests", "old", "passed", 28.0, ["pytest: 128 passed"], "t.log", "2026-11-27", None, "GPU A, abc1234")
    record = {"steps": {"tests": kept.__dict__}, "machine": {"device": "GPU B", "commit": "f" * 40 + "-dirty"}}
    check = gpu.Step("check", [sys.executable, "-c", "print('cuda  lsh_cumulation  PASS  max |error| 0')"], 60)
    assert gpu.run_steps([check], out, tmp_path / "train", record, STEPS) == ["passed"]
    saved = json.loads((out / "gpu_validation_cuda.json").read_text())["steps"]
    assert saved["check"]["ran_on"] == "GPU B, fffffff with uncommitted changes"
    assert saved["tests"]["ran_on"] == "GPU A, abc1234"
    summary = (out / "gpu_validation_cuda.md").read_text()
    assert "| check | passed |" in summary and "| GPU B, fffffff with uncommitted changes |" in summary
    assert "| tests | passed | 28 s | GPU A, abc1234 |" in summary
    assert gpu.ran_on({"device": "GPU C", "commit": "abc"}) == "GPU C, abc"  # a commit that is not a hash: as given
