"""``python -m lra.bench gpu``: what runs of it on a CPU (its plan, its options, its refusal, its runner, the figures
it reads from each step's outputs, its record and summary). A short GPU job's budget and archive: tests/test_gpu_job.py."""

import json
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import torch

from lra import config
from lra.bench import gpu, gpu_figures, gpu_record, kernel_check
from lra.bench.step import FIELDS as STEP_FIELDS
from lra.rows import write_rows

STEPS = list(gpu.STEPS)


def dry_run(capsys, *argv) -> list[str]:
    assert gpu.main(["--dry-run", *argv]) == 0
    return capsys.readouterr().out.splitlines()


def test_the_plan_runs_every_step_in_order_and_a_dry_run_prints_it(tmp_path, capsys):
    assert list(gpu.plan(tmp_path, tmp_path / "train")) == STEPS
    lines = dry_run(capsys, "--out", str(tmp_path))
    assert [line.split("]")[0].lstrip("[") for line in lines] == STEPS
    assert all(f"] limit {gpu.DEFAULT_TIMEOUT_S:.0f} s: YOSO_KERNELS=require PYTHONUNBUFFERED=1 " in line for line in lines)
    logs = tmp_path / "gpu_validation_cuda"
    assert lines[0].endswith(f"-m lra.bench.kernel_check --json {logs / 'check.json'}")
    assert (
        f"-m pytest -q -p no:cacheprovider -m cuda tests/yoso_cuda tests/attention_zoo --junitxml={logs / 'tests.xml'}"
        in lines[1]
    )
    assert (
        "--error-exitcode 86 --tool memcheck --report-api-errors no" in lines[2]
        and "PYTORCH_NO_CUDA_MEMORY_CACHING=1" in lines[2]
    )
    assert f"--junitxml={logs / 'memcheck.xml'}" in lines[2] and "--tool racecheck" in lines[3]
    assert all(f"--out {tmp_path}" in line for line in lines[4:6] + lines[7:9])
    assert "attention=" + ",".join(gpu.preset_names()) in lines[6] and "trainer=gpu" in lines[6]
    assert "--compile --compile-mode reduce-overhead --eager-too" in lines[8] and " -c " not in lines[8]
    assert lines[9].endswith("# skipped: needs --authors-code PATH, a checkout of mlpen/Nystromformer's LRA/code")
    for line in lines[2:4]:
        assert ("# skipped: compute-sanitizer not found" in line) == (gpu.compute_sanitizer() is None)


def test_steps_and_their_time_limits_can_be_chosen_and_a_typo_is_one_clear_error(tmp_path, capsys):
    lines = dry_run(capsys, "--steps", "train,check", "-k", "matches", "--timeout", "60", "--timeout", "train=90.5")
    assert [line.split(" s:")[0] for line in lines] == ["[check] limit 60", "[train] limit 90"]
    plan = gpu.plan(tmp_path, tmp_path, gpu.parse(["-k", "matches", "--timeout", "kernels=300"]))
    assert plan["memcheck"].command[-3:-1] == ["-k", "matches"] and plan["kernels"].timeout_s == 300
    assert plan["tests"].timeout_s == gpu.DEFAULT_TIMEOUT_S
    for argv, message in (
        (["--steps", "check,sanitizer"], "unknown step(s) sanitizer; choose from check,tests,memcheck"),
        (["--timeout", "racheck=60"], "--timeout racheck=60: no step 'racheck'; the steps: check,tests,"),
        (
            ["--timeout", "tests=-5"],
            "--timeout tests=-5: a time limit is a positive number of seconds, e.g. --timeout tests=1800",
        ),
        (["--timeout", "soon"], "--timeout soon: a time limit is a positive number of seconds, e.g. --timeout racecheck=1800"),
        (["--authors-code", str(tmp_path / "missing")], f"--authors-code {tmp_path / 'missing'}: no such folder"),
    ):
        with pytest.raises(SystemExit) as exit_:
            gpu.main(argv)
        assert exit_.value.code == 2 and message in capsys.readouterr().err, argv


def test_the_authors_step_takes_the_checkouts_it_is_given(tmp_path, capsys):
    (tmp_path / "code").mkdir()
    (tmp_path / "performer").mkdir()
    argv = ["--steps", "authors", "--authors-code", str(tmp_path / "code"), "--performer-pytorch", str(tmp_path / "performer")]
    (line,) = dry_run(capsys, *argv, "--out", str(tmp_path))
    assert line.endswith(
        f"-m lra.bench authors --device cuda --out {tmp_path} --authors-code {tmp_path / 'code'} "
        f"--performer-pytorch {tmp_path / 'performer'}"
    )


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


CELLS = ["parallel", "mps", "cells_per_hour", "paper_steps", "speedup", "finished", "wall_s"]


def test_the_cells_step_measures_each_k_with_and_without_mps_where_the_daemons_command_is_on_path(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    command = gpu.plan(tmp_path, tmp_path)["cells"].command
    assert command[command.index("--mps") + 1] == "off"
    rows = [
        dict(zip(CELLS, ("1", "off", "2.0", "5000", "1.0", "1/1", "60.0"))),
        dict(zip(CELLS, ("2", "off", "3.0", "5000", "1.5", "2/2", "80.0"))),
    ]
    write_rows(rows, tmp_path / "cells_per_hour_cuda_h200.csv", CELLS)
    assert gpu_figures.cells_figures(tmp_path) == (
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
    rows.append(dict(zip(CELLS, ("2", "on", "3.9", "5000", "1.95", "1/2", "81.0"))))
    write_rows(rows, tmp_path / "cells_per_hour_cuda_h200.csv", CELLS)
    figures, every_copy_finished = gpu_figures.cells_figures(tmp_path)
    assert figures[-1] == "K=2, MPS on: 3.9 cells of 5000 steps per hour (x1.95), 1/2 finished in 81.0 s" and len(figures) == 3
    assert not every_copy_finished


def test_a_step_that_fails_or_outlives_its_time_limit_is_recorded_and_stopped(tmp_path):
    failing = gpu.Step("failing", [sys.executable, "-c", "print('some output'); raise SystemExit(3)"], 60)
    assert gpu.run_step(failing, tmp_path / "failing.log")[::2] == ("failed", 3)
    assert "some output" in (tmp_path / "failing.log").read_text()
    sleeper = gpu.Step("sleeper", [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(600)"], 2)
    start = time.monotonic()
    status, duration, exit_status = gpu.run_step(sleeper, tmp_path / "sleeper.log")
    assert (status, exit_status) == ("timeout", None) and duration < 30 and time.monotonic() - start < 30
    assert "stopped after the step's time limit of 2 s" in (tmp_path / "sleeper.log").read_text()


def test_a_steps_log_names_the_checkout_relatively_and_the_interpreter_as_python(tmp_path):
    """A record committed from one machine reads the same on another: no absolute paths of the machine it ran on."""
    script = f"print({str(gpu.ROOT / 'results' / 'x.csv')!r}); print({str(gpu.ROOT)!r})"
    step = gpu.Step("paths", [sys.executable, "-c", script, str(gpu.ROOT / "results")], 60)
    assert gpu.run_step(step, tmp_path / "paths.log")[0] == "passed"
    log = (tmp_path / "paths.log").read_text()
    assert log.startswith("$ python -c ") and " results\n" in log.splitlines(keepends=True)[0]
    assert "\nresults/x.csv\n.\n" in log and str(gpu.ROOT) not in log and sys.executable not in log


# ---- the figures, read from what each step wrote -----------------------------------------------------------------


def verdict(device, op, passed, detail="max |error| 0"):
    return {
        "device": device,
        "op": op,
        "passed": passed,
        "line": f"{device:<5} {op:<42} {'PASS' if passed else 'FAIL'}  {detail}",
    }


def write_check(out: Path, cuda_usable: bool = True, cuda_verdicts=None) -> None:
    cuda = "cuda kernels: loaded (build/yoso_kernels_cuda.so, archs 9.0)" if cuda_usable else "cuda kernels: FAILED: no nvcc"
    check = {
        "passed": False,
        "cuda_usable": cuda_usable,
        "libraries": {"cpu": "cpu kernels: loaded (build/yoso_kernels_cpu.so)", "cuda": cuda},
        "verdicts": [verdict("cpu", "lsh_cumulation", True), *(cuda_verdicts or [])],
    }
    (out / "gpu_validation_cuda").mkdir(parents=True, exist_ok=True)
    (out / "gpu_validation_cuda" / "check.json").write_text(json.dumps(check))


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1" failures="1" skipped="3"
tests="54" time="201.3"><testcase classname="tests.yoso_cuda.test_ops" name="test_a"/><testcase
classname="tests.yoso_cuda.test_ops" name="test_b[float32]"><failure message="boom"/></testcase><testcase
classname="tests.yoso_cuda.test_ops" name="test_c"><error message="setup"/></testcase></testsuite></testsuites>"""


def fake_outputs(out: Path, train_dir: Path) -> None:
    write_check(
        out, cuda_verdicts=[verdict("cuda", "lsh_cumulation", True), verdict("cuda", "lsh_collided_gradient", False, "3e-1")]
    )
    for name in ("tests", "memcheck"):
        (out / "gpu_validation_cuda" / f"{name}.xml").write_text(JUNIT)
    kernels = [
        dict(method="softmax/flash", seq_len=65536, head_dim=64, dtype="bfloat16", time_ms=80.0, error=""),
        dict(method="softmax/math", seq_len=65536, head_dim=64, dtype="bfloat16", time_ms="nan", error="out of memory"),
        dict(method="yoso_32", seq_len=65536, head_dim=64, dtype="bfloat16", time_ms=25.5, error=""),
        dict(method="yoso_32", seq_len=1024, head_dim=64, dtype="bfloat16", time_ms=1.5, error=""),
    ]
    write_rows([{**row, "pass": "forward+backward"} for row in kernels], out / "kernels_cuda.csv", [*kernels[0], "pass"])
    efficiency = [
        dict(attention="yoso_32", seq_len=8192, batch=32, time_ms=0.75, memory_mb=120.0, status="ok"),
        dict(attention="softmax", seq_len=8192, batch="", time_ms="nan", memory_mb="nan", status="out_of_memory"),
        dict(attention="softmax", seq_len=512, batch=512, time_ms=0.1, memory_mb=10.0, status="ok"),
    ]
    write_rows(efficiency, out / "efficiency_cuda.csv", list(efficiency[0]))
    authors = [
        dict(
            row="softmax",
            their_s=0.05,
            our_s=0.02,
            ratio=2.5,
            status="ok",
            error="",
            device="NVIDIA H200",
            date="2026-12-05 01:00 UTC",
        ),
        dict(row="performer", their_s="", our_s="", ratio="", status="failed", error="ModuleNotFoundError: performer_pytorch"),
    ]
    write_rows(authors, out / "authors_cuda.csv", list(authors[0]))
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
    fake_outputs(out, train_dir)
    figures = {
        name: gpu_figures.figures_for(name, out, 0.0, 0, train_dir) for name in ("check", "kernels", "efficiency", "train")
    }
    figures["tests"] = gpu_figures.figures_for("tests", out, 0.0, 1, train_dir)
    figures["memcheck"] = gpu_figures.figures_for("memcheck", out, 0.0, gpu.SANITIZER_ERRORS, train_dir)
    figures["authors"] = gpu_figures.figures_for("authors", out, 0.0, 0, train_dir)
    assert figures["check"] == (
        [
            "2 PASS, 1 FAIL",
            "cuda lsh_cumulation PASS max |error| 0",
            "cuda lsh_collided_gradient FAIL 3e-1",
            "cpu kernels: loaded (build/yoso_kernels_cpu.so)",
            "cuda kernels: loaded (build/yoso_kernels_cuda.so, archs 9.0)",
        ],
        True,
    )
    assert figures["tests"] == (
        [
            "pytest: 49 passed, 1 failed, 1 errors, 3 skipped in 201.3 s",
            "failed: tests.yoso_cuda.test_ops.test_b[float32]",
            "failed: tests.yoso_cuda.test_ops.test_c",
        ],
        True,
    )
    assert figures["memcheck"][0][:2] == [
        "compute-sanitizer memcheck: errors reported (exit status 86), the first ones in the log",
        "pytest: 49 passed, 1 failed, 1 errors, 3 skipped in 201.3 s",
    ]
    assert "bfloat16 d=64 n=65536 forward+backward: yoso_32 25.50 ms, softmax/flash 80.00 ms" in figures["kernels"][0]
    assert figures["efficiency"][0][:2] == [
        "yoso_32 n=8192: 0.750 ms and 120.0 MB per instance (batch 32)",
        "softmax n=8192: out_of_memory",
    ]
    assert figures["authors"] == (
        [
            "softmax: theirs 0.05 s, ours 0.02 s a step, theirs / ours 2.5 (NVIDIA H200 2026-12-05 01:00 UTC)",
            "performer: failed ModuleNotFoundError: performer_pytorch",
        ],
        True,
    )
    train_lines, every_preset_finished = figures["train"]
    assert (
        not every_preset_finished
        and "reformer: failed, 60 steps, test acc 0.25, 12.5 s, 300.0 MB, error: CUDA error" in train_lines
    )
    with open(out / "train_presets_cuda.csv") as handle:
        assert [line.split(",")[0] for line in handle.read().splitlines()[1:]] == gpu.preset_names()

    record = gpu_record.load(out, gpu.STEPS)
    record["machine"] = {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "driver, GPU memory": "580.65, 81559 MiB"}
    for name, status in (("train", "failed"), ("check", "failed"), ("kernels", "passed")):
        result = gpu_record.StepResult(
            name, f"python -m {name}", status, 12.3, figures[name][0], f"gpu_validation_cuda/{name}.log"
        )
        record["steps"][name] = result.__dict__
    gpu_record.save(out, record)
    summary = (out / "gpu_validation_cuda.md").read_text()
    assert "| device | NVIDIA H100 80GB HBM3 |" in summary and "| driver, GPU memory | 580.65, 81559 MiB |" in summary
    assert "| train | failed | 12 s | not recorded | `python -m train` |" in summary
    assert "## kernels: passed" in summary and "- bfloat16 d=64 n=65536 forward+backward: yoso_32 25.50 ms" in summary
    reloaded = gpu_record.load(out, gpu.STEPS)  # a later run of other steps keeps these, in step order
    assert list(reloaded["steps"]) == ["check", "kernels", "train"]
    assert reloaded["steps"]["kernels"]["figures"] == figures["kernels"][0]


def test_compute_sanitizers_exit_status_tells_its_errors_from_the_tests_own():
    assert gpu_figures.sanitizer_figure("racecheck", 0) == "compute-sanitizer racecheck: no errors reported"
    assert (
        gpu_figures.sanitizer_figure("racecheck", 1) == "compute-sanitizer racecheck: no errors reported; the tests exited with 1"
    )
    assert "errors reported (exit status 86)" in gpu_figures.sanitizer_figure("memcheck", 86)
    assert "stopped at the step's time limit" in gpu_figures.sanitizer_figure("memcheck", None)


def test_the_committed_record_still_reads_and_renders_as_it_was_written():
    results = Path(__file__).resolve().parents[2] / "results"
    record = gpu_record.load(results, gpu.STEPS)
    assert gpu_record.render(record) == (results / "gpu_validation_cuda.md").read_text()


def step_row(attention, compiled, step_ms, eval_ms, **values):
    row = dict.fromkeys(STEP_FIELDS, "")
    row.update(task="listops", seq_len=2048, attention=attention, data_loading=False, status="ok", compiled=compiled)
    row.update(step_ms=step_ms, eval_ms=eval_ms, device_ms=0.4, kernels=12, compile_mode="reduce-overhead" if compiled else "")
    row.update(loop_ms=round(step_ms * 0.7, 2), eval_loop_ms=round(eval_ms * 0.5, 2))
    return {**row, **values}


def test_the_step_figures_check_the_none_listops_step_and_the_twelve_rows_against_their_targets(tmp_path):
    path = tmp_path / "step_cuda.csv"
    write_rows([step_row("none", False, 6.1, 2.0), step_row("softmax", False, 20.0, 5.0)], path, STEP_FIELDS)
    figures, holds = gpu_figures.step_figures(tmp_path)
    assert holds and figures[0].startswith(
        "none eager: step 6.1 ms (4.27 back to back), evaluation batch 2.0 ms (1.0 back to back), device busy 0.4 ms in 12"
    )
    assert "none step <= 3.0 ms: NOT met" in figures[-1]
    write_rows([step_row("none", False, 6.1, 2.0), step_row("none", True, 2.5, 1.0)], path, STEP_FIELDS)
    figures, _ = gpu_figures.step_figures(tmp_path)
    assert (
        "none compiled reduce-overhead: step 2.5 ms" in figures[1]
        and "met (best: 2.5 ms step, 1.0 ms evaluation, compiled; back to back, as lra.train's loop: 1.75 and 0.5 ms)"
        in figures[-1]
    )
    assert gpu_figures.step_figures(tmp_path / "nothing") == ([], False)
    twelve = gpu.TABLES["table3"].presets
    candidates = [step_row("softmax_unpadded", True, 3.5, 1.0), step_row("yoso_e_flex", False, 9.0, 1.0)]  # never in the sum
    write_rows([*candidates, *(step_row(name, True, 4.0 + i, 1.0) for i, name in enumerate(twelve))], path, STEP_FIELDS)
    figures, _ = gpu_figures.step_figures(tmp_path)
    assert twelve.index("softmax") == 1 and figures[0].startswith(
        "softmax_unpadded compiled reduce-overhead: step 3.5 ms, 0.70x softmax's (2.45 back to back)"
    )
    assert figures[1].startswith("yoso_e_flex eager: step 9.0 ms (6.3 back to back)"), "no eager yoso_e to compare with"
    assert figures[-1] == (
        f"the twelve rows' compiled steps sum to 114.0 ms (target 60 ms on an H100: NOT met); slowest {twelve[-1]} 15.00 ms"
    )


def test_the_step_figures_of_a_run_are_its_own_rows_not_the_files_earlier_ones(tmp_path):
    started = datetime(2026, 11, 28, 20, 30, 5, tzinfo=timezone.utc)
    rows = [step_row("none", False, 8.4, 1.0), step_row("softmax", False, 21.9, 1.0, measured_at="2026-11-28T20:30:04+00:00")]
    rows += [step_row("yoso_32", False, 21.4, 1.0, measured_at="2026-11-28T20:30:05+00:00")]
    rows += [step_row("yoso_e", False, 26.8, 1.0, measured_at="2026-11-28T21:02:00+00:00")]
    write_rows(rows, tmp_path / "step_cuda.csv", STEP_FIELDS)
    figures, _ = gpu_figures.step_figures(tmp_path, started.timestamp() + 0.4)
    assert figures[0] == "2 rows of step_cuda.csv are earlier runs' (not shown)"
    assert [figure.split(":")[0] for figure in figures[1:]] == ["yoso_32 eager", "yoso_e eager"]
    every = gpu_figures.step_figures(tmp_path)[0]  # without a start, every row (and none's target, as it has a row now)
    assert [figure.split(":")[0] for figure in every[:4]] == ["none eager", "softmax eager", "yoso_32 eager", "yoso_e eager"]


def test_the_step_times_each_candidate_path_right_after_its_row():
    attentions = gpu.step_attentions()
    twelve = gpu.TABLES["table3"].presets
    assert [name for name in attentions if name in twelve] == list(twelve)
    assert sorted(set(attentions) - set(twelve)) == sorted(gpu.STEP_CANDIDATES)
    for candidate, row in gpu.STEP_CANDIDATES.items():
        assert attentions.index(candidate) == attentions.index(row) + 1
    assert ",".join(attentions) in gpu.plan(Path("results"), Path("train"))["step"].command


def test_an_output_older_than_its_step_is_not_read_as_the_steps_result(tmp_path):
    """A kernels step that failed before writing once showed the rows of an earlier run as its own."""
    out, train_dir = tmp_path / "results", tmp_path / "outputs"
    fake_outputs(out, train_dir)
    figures, holds = gpu_figures.figures_for("kernels", out, time.time() + 5, 0, train_dir)
    assert figures == ["wrote no kernels_cuda.csv (the one there is an earlier run's, left as it was)"] and not holds
    figures, holds = gpu_figures.figures_for("kernels", out, time.time() - 60, 0, train_dir)
    assert holds and "yoso_32 25.50 ms" in figures[0]
    assert gpu_figures.figures_for("efficiency", out / "empty", 0.0, 0, train_dir) == (["wrote no efficiency_cuda.csv"], False)
    assert gpu_figures.figures_for("memcheck", out, time.time() + 5, None, train_dir) == (
        ["compute-sanitizer memcheck: stopped at the step's time limit, before its summary"],
        True,
    )


# ---- the runner and its record --------------------------------------------------------------------------------------

CHECK_WRITES = "import json, sys; from pathlib import Path; path = Path(sys.argv[1]); path.parent.mkdir(exist_ok=True); "
CHECK_WRITES += "path.write_text(json.dumps({0}))"


def check_step(out: Path, passed: bool, cuda_usable: bool) -> gpu.Step:
    """A stand-in of the check step that writes the verdicts JSON a check of that outcome writes."""
    check = {
        "passed": passed,
        "cuda_usable": cuda_usable,
        "libraries": {"cuda": f"cuda kernels: loaded ({gpu.ROOT}/build/cuda.so)"},  # a path of this checkout
        "verdicts": [verdict("cuda", "lsh_cumulation", passed)],
    }
    if not cuda_usable:
        check["libraries"]["cuda"] = "cuda kernels: FAILED: it links its own libstdc++"
    program = CHECK_WRITES.format(repr(check)) + f"; raise SystemExit({0 if passed else 1})"
    return gpu.Step("check", [sys.executable, "-c", program, str(out / "gpu_validation_cuda" / "check.json")], 60)


def test_kernels_that_did_not_build_skip_the_steps_that_test_or_time_them_until_a_check_passes(tmp_path):
    """A GPU job's first command once ran tests, memcheck, racecheck and kernels after the build had failed, each
    rebuilding and failing the same way; now they are skipped, in that run and in later ones on the same machine and
    commit, and step still runs."""
    out = tmp_path / "results"
    out.mkdir()
    record = {**gpu_record.load(out, gpu.STEPS), "machine": {"device": "a stand-in GPU", "commit": "a" * 40}}
    earlier = gpu_record.StepResult("kernels", "old", "passed", 55.0, ["yoso_32 1.5 ms"], "k.log", "2026-11-25")
    record["steps"]["kernels"] = earlier.__dict__
    ran = [sys.executable, "-c", "print('ran')"]
    steps = [check_step(out, passed=False, cuda_usable=False)]
    steps += [gpu.Step(name, ran, 60) for name in ("tests", "memcheck", "kernels", "step")]
    assert gpu.run_steps(steps, out, record, tmp_path / "train") == ["failed", "skipped", "skipped", "skipped", "failed"]
    saved = json.loads((out / "gpu_validation_cuda.json").read_text())["steps"]
    reason = saved["tests"]["figures"][0]
    assert reason.startswith("the CUDA kernels did not build or are unsafe (cuda kernels: FAILED: it links its own libstdc++;")
    assert reason.endswith("nothing to run until a check passes (--steps check)")
    assert saved["kernels"]["figures"] == [reason] and saved["kernels"]["earlier"] == earlier.__dict__
    assert saved["step"]["figures"] == ["wrote no step_cuda.csv"]  # it ran: none and softmax need no kernels

    # A later run of the tests alone, on the same machine and commit: still nothing to run.
    assert gpu.run_steps([gpu.Step("tests", ran, 60)], out, record, tmp_path / "train") == ["skipped"]
    # On another commit (the build fixed, say), the earlier check says nothing of these kernels.
    record["machine"]["commit"] = "b" * 40
    assert gpu.run_steps([gpu.Step("tests", ran, 60)], out, record, tmp_path / "train") == ["failed"]  # no tests.xml
    # A check that fails on a wrong result, with the kernels built, still lets the tests show where.
    steps = [check_step(out, passed=False, cuda_usable=True), gpu.Step("tests", ran, 60)]
    assert gpu.run_steps(steps, out, record, tmp_path / "train") == ["failed", "failed"]
    assert json.loads((out / "gpu_validation_cuda.json").read_text())["steps"]["tests"]["figures"] == ["wrote no tests.xml"]


def test_each_step_names_the_machine_and_commit_it_ran_on_when_a_later_run_on_another_keeps_it(tmp_path):
    """The summary's machine is the latest run's; a step kept from an earlier run on another GPU must say so."""
    out = tmp_path / "results"
    out.mkdir()
    kept = gpu_record.StepResult(
        "tests", "old", "passed", 28.0, ["pytest: 128 passed"], "t.log", "2026-11-27", None, "GPU A, abc1234"
    )
    record = {"steps": {"tests": kept.__dict__}, "machine": {"device": "GPU B", "commit": "f" * 40 + "-dirty"}}
    assert gpu.run_steps([check_step(out, passed=True, cuda_usable=True)], out, record, tmp_path / "train") == ["passed"]
    saved = json.loads((out / "gpu_validation_cuda.json").read_text())["steps"]
    assert saved["check"]["ran_on"] == "GPU B, fffffff with uncommitted changes"
    assert saved["check"]["figures"] == [
        "1 PASS, 0 FAIL",
        "cuda lsh_cumulation PASS max |error| 0",
        "cuda kernels: loaded (build/cuda.so)",
    ]
    assert saved["tests"]["ran_on"] == "GPU A, abc1234"
    summary = (out / "gpu_validation_cuda.md").read_text()
    assert "| check | passed |" in summary and "| GPU B, fffffff with uncommitted changes |" in summary
    assert "| tests | passed | 28 s | GPU A, abc1234 |" in summary
    assert gpu_record.ran_on({"device": "GPU C", "commit": "abc"}) == "GPU C, abc"  # a commit that is not a hash: as given


def test_a_skipped_step_keeps_its_earlier_result_beside_the_reason(tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    earlier = gpu_record.StepResult("racecheck", "old", "passed", 62.2, ["RACECHECK SUMMARY: 0 hazards"], "r.log", "2026-11-25")
    record = {"steps": {"racecheck": earlier.__dict__}, "machine": {"device": "a stand-in GPU"}}
    step = gpu.Step("racecheck", ["compute-sanitizer"], 60, skip_reason="compute-sanitizer not found")
    for _ in range(2):  # skipped twice: the result before the first skip is the one kept
        assert gpu.run_steps([step], out, record, tmp_path / "train") == ["skipped"]
    saved = json.loads((out / "gpu_validation_cuda.json").read_text())["steps"]["racecheck"]
    assert saved["figures"] == ["compute-sanitizer not found"] and saved["earlier"] == earlier.__dict__
    summary = (out / "gpu_validation_cuda.md").read_text()
    assert "- before: passed in 62 s (2026-11-25), kept here:\n  - RACECHECK SUMMARY: 0 hazards\n" in summary


# ---- the check step's program ---------------------------------------------------------------------------------------


def test_the_check_writes_each_verdict_and_whether_the_cuda_kernels_can_be_used(tmp_path):
    from yoso_cuda.build import BuildReport, Library

    assert kernel_check.main(["--json", str(tmp_path / "check.json")]) == 0  # this machine's own kernels
    check = json.loads((tmp_path / "check.json").read_text())
    assert check["passed"] and check["cuda_usable"] == torch.cuda.is_available()
    assert check["libraries"]["cpu"].startswith("cpu kernels: loaded") and len(check["verdicts"]) >= 9

    report = BuildReport("require", Library("cpu", wanted=True, loaded=True), Library("cuda", wanted=True, reason="no nvcc"))
    found = kernel_check.verdicts(report)
    assert found[-1] == {
        "device": "cuda",
        "op": "kernel library",
        "passed": False,
        "line": f"cuda  {'kernel library':<42} FAIL  not built: no nvcc",
    }
    assert {v["device"] for v in found[:-1]} == {"cpu"} and all(v["passed"] for v in found[:-1]), "the CPU's ops checked"
    report.cpu.unsafe = "it links its own libstdc++"
    assert kernel_check.verdicts(report)[0]["line"].endswith("FAIL  unsafe: it links its own libstdc++")
