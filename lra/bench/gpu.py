"""One command for a GPU machine: validate YOSO's CUDA kernels and measure the GPU benchmarks.

``python -m lra.bench gpu [--steps check,tests,...] [--out results] [--timeout S] [--budget S] [--archive PATH]
[-k EXPR] [--dry-run]`` runs these steps in order from the repository root, each as its own process, and goes
on past a step that fails:

============  ================================================================================
``check``     ``python -m yoso_cuda --check``: builds the kernels (``YOSO_KERNELS=require``),
              every compiled op against the reference on the CPU and the GPU
``tests``     ``pytest -m cuda tests/yoso_cuda tests/attention_zoo``: the CUDA kernel tests, and the
              attentions' GPU paths: ``softmax_unpadded``'s fused nested kernels against ``softmax``,
              ``yoso_e_flex``'s compiled FlexAttention against ``yoso_e``
``memcheck``  the kernel tests under ``compute-sanitizer --tool memcheck`` (no caching allocator,
              so an out-of-bounds access lands outside an allocation)
``racecheck`` the kernel tests under ``compute-sanitizer --tool racecheck`` (shared-memory hazards)
``kernels``   ``python -m lra.bench kernels`` (YOSO-32 against every SDPA backend, 1K..64K tokens;
              with ``--official-yoso PATH``, also the official mlpen/YOSO kernels and the ratio
              official / ours per shape at forward+backward)
``efficiency``  a short ``python -m lra.bench efficiency`` (every attention, n = 512, 2048, 8192)
``train``     ``python -m lra.train -m trainer=gpu attention=<every preset>``: a short run of
              each preset on the smoke ListOps (generated), outputs in a fresh folder
``cells``     ``python -m lra.campaign measure``: cells per hour against the cells run at once
              on the GPU (K = 1..16), each K > 1 without and with CUDA MPS (``--mps off,on``;
              without only where ``nvidia-cuda-mps-control`` is not on PATH, as its figures say),
              200-step copies of Table 3's softmax ListOps cell (the paper-size ListOps is
              generated first where it is missing)
``step``      ``python -m lra.bench step`` of ListOps (n = 2048, batch 32, bf16) for the twelve
              rows of Table 3 with ``softmax_unpadded`` and ``yoso_e_flex`` (softmax and YOSO-E
              without the padding's work) each right after its row, compiled (``reduce-overhead``:
              CUDA graphs) and then eager, ``--profile``: step and evaluation ms, device busy
              ms and kernels per step, and a profile per cell (``step_cuda_profile/``); the figures
              check the none step against 3 ms and the twelve compiled steps' sum against 60 ms,
              and give each candidate's step as a ratio to its row's
============  ================================================================================

It writes into ``--out`` (default ``results/`` of the current folder): ``kernels_cuda.{csv,png}``,
``efficiency_cuda.{csv,png}``, ``train_presets_cuda.csv``, ``cells_per_hour_<device>.{csv,png}``, the step's rows
of ``step_cuda.{csv,png}`` and ``step_cuda_profile/``, each step's full output in
``gpu_validation_cuda/<step>.log``, and the summary ``gpu_validation_cuda.md`` (machine, driver,
CUDA, torch; each step's command, status, duration and key figures) rendered from
``gpu_validation_cuda.json``. A later run of some steps replaces theirs in that record and keeps
the others, so the steps can be split across GPU jobs (each step has a timeout, ``--timeout``). Commands and logs
name files relative to the checkout and the interpreter as ``python``, so a record reads the same on any machine.

For a short GPU job, whose commands have a time limit and whose files come back only from one folder:

- ``--budget S``: S seconds for the whole command, counted from its start. Each step's timeout becomes the smaller
  of its own and what is left; a step is not started while under :data:`MIN_STEP_S` (30 s) are left, and is
  recorded as skipped with the reason "no time left in --budget S s", as is every step after it (time only goes
  down, and skipping takes none). A skipped step keeps its earlier result in the record (``earlier``, shown in the
  summary). A step stopped by what was left says so in its figures. Without ``--budget`` nothing changes.
- ``--archive PATH``: after every step (skipped ones too), one .tar.gz of what this run wrote under ``--out``:
  the files new or changed since the command started (the steps' logs, CSV, PNG and profiles) and the summary
  ``.json``/``.md`` always, named relative to ``--out`` (``tar -xzf PATH -C results`` puts them where
  ``--out results`` would), written to a temporary file and renamed, so a command killed at its limit leaves the
  archive of the steps it finished. Never checkpoints (``.ckpt``, ``.pt``, ``.pth``); the steps write none there.

It needs only what the project's training needs (torch, Lightning, Hydra, pandas, matplotlib,
ninja, pytest) plus, for the sanitizer steps, ``compute-sanitizer`` from the CUDA toolkit; without
it those steps are recorded as skipped. ``--dry-run`` prints the commands without running them.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from lra import config
from lra.bench.output import RESULTS, write_csv
from lra.campaign import MPS_CONTROL
from lra.paper import TABLES
from lra.results import RunRecord, git_commit
from yoso_cuda.build import cuda_toolkit

ROOT = Path(__file__).resolve().parents[2]  # the checkout whose tests the steps run
SUMMARY = "gpu_validation_cuda"
STEP_ROWS = "table3"  # the step's attentions (lra.bench step --attentions): the twelve rows of the YOSO paper's Table 3
# Another path to a row's attention (the same results), timed right after its row and compared with it, not in the sum.
STEP_CANDIDATES = {"softmax_unpadded": "softmax", "yoso_e_flex": "yoso_e"}
STEP_SUM_TARGET_MS = 60.0  # issue 56: the twelve rows' compiled ListOps steps together within this on an H100
STEP_TARGET_MS = 3.0  # issue 38: the none ListOps step (and an evaluation batch) within this on an H100/H200
CUDA_TESTS = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda", "tests/yoso_cuda"]
ATTENTION_CUDA_TESTS = ["tests/attention_zoo"]  # the tests step also runs these (Triton's kernels: no sanitizer)
TRAIN_OVERRIDES = [  # the smoke experiment's generated ListOps, shortened to a few steps
    "trainer=gpu",
    "trainer.enable_progress_bar=false",
    "task.protocol.max_steps=60",
    "task.protocol.warmup_steps=6",
    "task.protocol.val_check_interval=30",
    "task.protocol.limit_val_batches=4",
]
CELLS_CELL = ["experiment=table3", "task=listops", "attention=softmax", "trainer=gpu"]  # the cell the cells step copies
CELLS_PARALLEL = "1,2,4,8,16"


@dataclass
class Step:
    name: str
    command: list[str]
    timeout_s: float
    env: dict[str, str] = field(default_factory=dict)
    skip_reason: str | None = None  # set when the step cannot run on this machine


@dataclass
class StepResult:
    name: str
    command: str
    status: str  # passed | failed | timeout | skipped
    duration_s: float
    figures: list[str]  # key figures, one line each (markdown)
    log: str | None = None  # the step's full output, relative to --out
    finished_at: str = ""
    earlier: dict | None = None  # skipped: the result it had before (itself never a skipped one)
    ran_on: str = ""  # "device, commit": a record keeps steps of earlier runs, which may be another machine's


def compute_sanitizer() -> str | None:
    toolkit = cuda_toolkit()
    candidates = [shutil.which("compute-sanitizer")] + ([str(Path(toolkit) / "bin" / "compute-sanitizer")] if toolkit else [])
    return next((path for path in candidates if path and Path(path).exists()), None)


def preset_names() -> list[str]:
    return config.attention_rows()


def plan(
    out: Path,
    train_dir: Path,
    timeout: float | None = None,
    pytest_filter: str | None = None,
    official_yoso: Path | None = None,
    official_yoso_commit: str | None = None,
) -> dict[str, Step]:
    """Every step, in order, with its command."""
    official = ["--official-yoso", str(official_yoso)] if official_yoso else []
    official += ["--official-yoso-commit", official_yoso_commit] if official_yoso and official_yoso_commit else []
    python = sys.executable
    cuda_tests = CUDA_TESTS + (["-k", pytest_filter] if pytest_filter else [])
    sanitizer = compute_sanitizer()
    missing = None if sanitizer else "compute-sanitizer not found (it ships with the CUDA toolkit, in <CUDA_HOME>/bin)"
    unpooled = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}  # each tensor its own allocation, so overruns are caught
    steps = [
        Step("check", [python, "-m", "yoso_cuda", "--check"], 540),
        Step("tests", [python, *cuda_tests, *ATTENTION_CUDA_TESTS], 540),
        # API errors that torch provokes and handles itself (probing features) are not the kernels' bugs.
        Step(
            "memcheck",
            [
                sanitizer or "compute-sanitizer",
                "--tool",
                "memcheck",
                "--report-api-errors",
                "no",
                "--error-exitcode",
                "1",
                python,
                *cuda_tests,
            ],
            570,
            unpooled,
            missing,
        ),
        Step(
            "racecheck",
            [sanitizer or "compute-sanitizer", "--tool", "racecheck", "--error-exitcode", "1", python, *cuda_tests],
            570,
            unpooled,
            missing,
        ),
        Step(
            "kernels",
            [
                python,
                "-m",
                "lra.bench",
                "kernels",
                "--device",
                "cuda",
                "--lengths",
                "1024",
                "4096",
                "16384",
                "65536",
                "--out",
                str(out),
                *official,
            ],
            570 if official else 540,  # theirs: their extensions are built first (cached in ~/.cache/torch_extensions)
        ),
        Step(
            "efficiency",
            [
                python,
                "-m",
                "lra.bench",
                "efficiency",
                "--device",
                "cuda",
                "--lengths",
                "512",
                "2048",
                "8192",
                "--max-batch-tokens",
                str(2**18),
                "--quiet",
                "--out",
                str(out),
            ],
            540,
        ),
        Step(
            "train",
            [python, "-m", "lra.train", "-m", f"attention={','.join(preset_names())}", *TRAIN_OVERRIDES],
            570,
            {"LRA_OUTPUT_DIR": str(train_dir)},
        ),
        Step(
            "cells",
            [
                python,
                "-m",
                "lra.campaign",
                "measure",
                "--parallel",
                CELLS_PARALLEL,
                "--mps",
                "off,on" if shutil.which(MPS_CONTROL) else "off",
                "--steps",
                "200",
                "--out",
                str(out),
                *CELLS_CELL,
            ],
            570,
        ),
        Step(
            "step",
            [
                python,
                "-c",
                # two grids into one step_cuda.csv: compiled with CUDA graphs, then eager (its own rows); Table 3's
                # targets are on the compiled steps, so a time limit that cuts the step short cuts the eager grid
                "import sys; from lra.bench.step import main; "
                "common = ['--device', 'cuda', '--tasks', 'listops', '--attentions', sys.argv[1], "
                "'--warmup', '5', '--profile', '--quiet', '--out', sys.argv[2]]; "
                "sys.exit(main(common + ['--compile', '--compile-mode', 'reduce-overhead']) or main(common))",
                ",".join(step_attentions()),
                str(out),
            ],
            570,
        ),
    ]
    for step in steps:
        step.env = {"YOSO_KERNELS": "require", "PYTHONUNBUFFERED": "1", **step.env}
        step.timeout_s = timeout or step.timeout_s
    return {step.name: step for step in steps}


def step_attentions() -> list[str]:
    """The step's attentions in order: Table 3's twelve rows, each followed by its candidates, so that a step its time
    limit cuts short has timed each candidate it reached beside its row."""
    rows = TABLES[STEP_ROWS].presets
    return [name for row in rows for name in [row, *(path for path, of in STEP_CANDIDATES.items() if of == row)]]


def portable(text: str) -> str:
    """``text`` with this checkout's absolute paths made relative to it and the interpreter called ``python``."""
    return text.replace(sys.executable, "python").replace(f"{ROOT}{os.sep}", "").replace(str(ROOT), ".")


def run_step(step: Step, log_path: Path) -> tuple[str, float]:
    """Run ``step`` with its output into ``log_path``; its status and duration."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log_path, "w") as log:
        log.write(portable(f"$ {' '.join(step.command)}\n# env: {step.env}\n"))
        log.flush()
        process = subprocess.Popen(
            step.command,
            cwd=ROOT,
            env={**os.environ, **step.env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so a timeout stops its children too
        )
        try:
            status = "passed" if process.wait(timeout=step.timeout_s) == 0 else "failed"
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            log.write(f"\n# stopped after the step's timeout of {step.timeout_s:.0f} s\n")
            status = "timeout"
    log_path.write_text(portable(log_path.read_text(errors="replace")))
    return status, time.perf_counter() - start


# ---- key figures, read from each step's log and outputs ------------------------------------------


def last_match(pattern: str, text: str) -> str | None:
    found = re.findall(pattern, text, flags=re.MULTILINE)
    return found[-1].strip() if found else None


def check_figures(log: str) -> list[str]:
    verdicts = re.findall(r"^(cpu|cuda)\s+(.+?)\s+(PASS|FAIL)\s+(.*)$", log, flags=re.MULTILINE)
    figures = [f"{sum(v[2] == 'PASS' for v in verdicts)} PASS, {sum(v[2] == 'FAIL' for v in verdicts)} FAIL"]
    figures += [
        f"{device} {op}: {verdict} ({detail})"
        for device, op, verdict, detail in verdicts
        if device == "cuda" or verdict == "FAIL"
    ]
    figures += [line for line in log.splitlines() if line.startswith(("cuda kernels:", "cpu kernels:"))]
    return figures


def pytest_figures(log: str) -> list[str]:
    summary = last_match(r"^=*\s*(\d+ (?:passed|failed|error).*?)\s*=*$", log)
    failed = re.findall(r"^FAILED (\S+)", log, flags=re.MULTILINE)
    return [f"pytest: {summary or 'no summary line'}"] + [f"failed: {name}" for name in failed[:20]]


def sanitizer_figures(log: str) -> list[str]:
    lines = [last_match(r"^=+ ((?:ERROR|RACECHECK) SUMMARY: .*)$", log) or "no sanitizer summary line"]
    lines += [f"first report: {line.strip()}" for line in re.findall(r"^=+ (?:Invalid|Race|Error).*$", log, re.MULTILINE)[:5]]
    return lines + pytest_figures(log)


def stale(path: Path, since: float | None) -> str | None:
    """Why ``path`` is not the output of a step started at ``since`` (``time.time()``): missing, or older."""
    if not path.exists():
        return f"wrote no {path.name}"
    if since is not None and path.stat().st_mtime < since:
        return f"wrote no {path.name} (the one there is an earlier run's, left as it was)"
    return None


def kernels_figures(out: Path) -> list[str]:
    """Per dtype and head dim, at the longest length YOSO-32 ran: its forward+backward time and the fastest softmax's."""
    rows = read_csv(out / "kernels_cuda.csv")
    figures = []
    for dtype, head_dim in sorted({(r["dtype"], r["head_dim"]) for r in rows}):
        timed = [
            r
            for r in rows
            if (r["dtype"], r["head_dim"]) == (dtype, head_dim)
            and r["pass"] == "forward+backward"
            and r["time_ms"] not in ("", "nan")
        ]
        yoso = [r for r in timed if r["method"] == "yoso_32"]
        if not yoso:
            figures.append(f"{dtype} d={head_dim}: yoso_32 did not run")
            continue
        longest = max(yoso, key=lambda r: int(r["seq_len"]))
        softmax = [r for r in timed if r["method"].startswith("softmax") and r["seq_len"] == longest["seq_len"]]
        best = min(softmax, key=lambda r: float(r["time_ms"]), default=None)
        against = f"{best['method']} {float(best['time_ms']):.2f} ms" if best else "no softmax backend ran"
        figures.append(
            f"{dtype} d={head_dim} n={longest['seq_len']} forward+backward: yoso_32 {float(longest['time_ms']):.2f} ms, {against}"
        )
    failed = sum(bool(r["error"]) for r in rows)
    return (
        figures
        + official_figures(rows)
        + [f"{len(rows)} rows, {failed} with an error (out of memory or a backend refusing the inputs)"]
    )


def official_figures(rows: list[dict[str, str]]) -> list[str]:
    """Per shape, forward+backward: official mlpen/YOSO's time / ours (issue 39's target: >= 5), where both ran."""
    figures = []
    for method in sorted({r["method"] for r in rows if r["method"].startswith("yoso_32/official")}):
        ratios = []
        for theirs in [r for r in rows if r["method"] == method and r["pass"] == "forward+backward"]:
            shape = (theirs["dtype"], theirs["head_dim"], theirs["seq_len"])
            label = f"{shape[0]} d={shape[1]} n={shape[2]}"
            ours = next(
                (
                    r
                    for r in rows
                    if r["method"] == "yoso_32"
                    and r["pass"] == "forward+backward"
                    and (r["dtype"], r["head_dim"], r["seq_len"]) == shape
                ),
                None,
            )
            if theirs["error"] or theirs["time_ms"] in ("", "nan"):
                figures.append(f"{label} forward+backward: {method} failed: {theirs['error'][:160]}")
            elif ours is None or ours["error"] or ours["time_ms"] in ("", "nan"):
                figures.append(f"{label} forward+backward: {method} {float(theirs['time_ms']):.2f} ms, yoso_32 did not run")
            else:
                ratio = float(theirs["time_ms"]) / float(ours["time_ms"])
                ratios.append(ratio)
                figures.append(
                    f"{label} forward+backward: {method} {float(theirs['time_ms']):.2f} ms / yoso_32 "
                    f"{float(ours['time_ms']):.2f} ms = {ratio:.1f}x"
                )
        commit = next((r.get("official_commit") for r in rows if r["method"] == method and r.get("official_commit")), "?")
        verdict = f"{'met' if ratios and min(ratios) >= 5 else 'NOT met'}" + (
            f" (lowest {min(ratios):.1f}x)" if ratios else " (no ratio)"
        )
        figures.append(f"{method} (mlpen/YOSO {commit[:12]}) / yoso_32 >= 5x at every shape: {verdict}")
    return figures


def efficiency_figures(out: Path) -> list[str]:
    rows = read_csv(out / "efficiency_cuda.csv")
    if not rows:
        return ["no rows"]
    longest = max(int(r["seq_len"]) for r in rows)
    figures = [
        f"{r['attention']} n={longest}: {float(r['time_ms']):.3f} ms and {float(r['memory_mb']):.1f} MB per instance "
        f"(batch {r['batch']})"
        if r["status"] == "ok"
        else f"{r['attention']} n={longest}: {r['status']}"
        for r in rows
        if int(r["seq_len"]) == longest
    ]
    statuses = sorted({r["status"] for r in rows})
    return figures + ["cells: " + ", ".join(f"{sum(r['status'] == s for r in rows)} {s}" for s in statuses)]


TRAIN_FIELDS = [
    "attention_preset",
    "attention",
    "status",
    "steps",
    "test_acc",
    "best_val_acc",
    "wall_time_s",
    "peak_memory_mb",
    "device",
    "error",
]


def train_figures(train_dir: Path, out: Path) -> tuple[list[str], bool]:
    """Every preset's results.json into train_presets_cuda.csv; figures and whether every preset finished."""
    rows = []
    for preset in preset_names():
        found = sorted(train_dir.glob(f"*/{preset}/**/results.json"))
        record = RunRecord.read(found[-1]) if found else RunRecord(status="missing")
        values = {key: getattr(record, key) for key in TRAIN_FIELDS[1:]}
        rows.append({"attention_preset": preset, **{key: "" if value is None else value for key, value in values.items()}})
    write_csv(rows, out / "train_presets_cuda.csv", TRAIN_FIELDS)
    figures = [
        f"{r['attention_preset']}: {r['status']}, {r['steps']} steps, test acc {r['test_acc']}, {r['wall_time_s']} s, "
        f"{r['peak_memory_mb']} MB" + (f", error: {str(r['error'])[:200]}" if r["error"] else "")
        for r in rows
    ]
    return figures, all(r["status"] == "finished" for r in rows)


def read_csv(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def step_figures(out: Path, since: float | None = None) -> tuple[list[str], bool]:
    """The ListOps rows of the step: train and evaluation ms, device busy ms, kernels; whether none meets the target.
    With ``since`` (``time.time()`` at the step's start), only the rows measured from then on: the file keeps earlier
    runs' cells (another GPU's, a row this run did not reach), which are not this run's figures."""
    rows = [r for r in read_csv(out / "step_cuda.csv") if r["task"] == "listops" and r.get("data_loading") == "False"]
    rows = [r for r in rows if r["attention"] in [*TABLES[STEP_ROWS].presets, *STEP_CANDIDATES] and r["seq_len"] == "2048"]
    figures, met = [], True
    if since is not None:
        earlier = [r for r in rows if not measured_since(r, since)]
        rows = [r for r in rows if measured_since(r, since)]
        if earlier:
            figures.append(f"{len(earlier)} rows of step_cuda.csv are earlier runs' (not shown)")

    def variant(r):
        return f"compiled {r.get('compile_mode') or 'default'}" if r["compiled"] == "True" else "eager"

    ok = {(r["attention"], variant(r)): float(r["step_ms"]) for r in rows if r["status"] == "ok"}
    for r in rows:
        if r["status"] != "ok":
            figures.append(f"{r['attention']} {variant(r)}: {r['status']} {r['error'][:200]}")
            continue
        row = STEP_CANDIDATES.get(r["attention"])
        against = f", {float(r['step_ms']) / ok[row, variant(r)]:.2f}x {row}'s" if (row, variant(r)) in ok else ""
        figures.append(
            f"{r['attention']} {variant(r)}: step {r['step_ms']} ms{against} ({r.get('loop_ms') or '?'} back to back), "
            f"evaluation batch {r.get('eval_ms') or '?'} ms ({r.get('eval_loop_ms') or '?'} back to back), device busy "
            f"{r.get('device_ms') or '?'} ms in {r.get('kernels') or '?'} kernels per step"
        )
    floor = [r for r in rows if r["attention"] == "none" and r["status"] == "ok"]
    if floor:
        best = min(floor, key=lambda r: float(r["step_ms"]))
        eval_ms = float(best.get("eval_ms") or "inf")
        met = float(best["step_ms"]) <= STEP_TARGET_MS and eval_ms <= STEP_TARGET_MS
        figures.append(
            f"none step <= {STEP_TARGET_MS} ms: {'met' if met else 'NOT met'} (best: {best['step_ms']} ms step, "
            f"{best.get('eval_ms')} ms evaluation, {'compiled' if best['compiled'] == 'True' else 'eager'}; back to back, as "
            f"lra.train's loop: {best.get('loop_ms') or '?'} and {best.get('eval_loop_ms') or '?'} ms); "
            "profiles in step_cuda_profile/"
        )
    compiled = {
        r["attention"]: float(r["step_ms"])
        for r in rows
        if r["compiled"] == "True" and r["status"] == "ok" and r["attention"] in TABLES[STEP_ROWS].presets
    }
    if len(compiled) == len(TABLES[STEP_ROWS].presets):
        total = sum(compiled.values())
        figures.append(
            f"the twelve rows' compiled steps sum to {total:.1f} ms (target {STEP_SUM_TARGET_MS:g} ms on an H100: "
            f"{'met' if total <= STEP_SUM_TARGET_MS else 'NOT met'}); slowest {max(compiled, key=compiled.get)} "
            f"{max(compiled.values()):.2f} ms"
        )
    return figures, bool(floor)


def measured_since(row: dict[str, str], since: float) -> bool:
    """Whether a row of the step's CSV was measured at ``since`` (``time.time()``) or later (a row without the time
    is an earlier run's)."""
    return bool(row.get("measured_at")) and datetime.fromisoformat(row["measured_at"]).timestamp() >= int(since)


OUTPUTS = {"kernels": "kernels_cuda.csv", "efficiency": "efficiency_cuda.csv", "step": "step_cuda.csv"}


def figures_for(name: str, log: str, out: Path, train_dir: Path, since: float | None = None) -> tuple[list[str], bool]:
    """The step's key figures and whether its outputs hold up (beyond its exit status); with ``since`` (when
    the step started, ``time.time()``), an output file older than the step is not read as its result."""
    if name in OUTPUTS and (note := stale(out / OUTPUTS[name], since)):
        return [note], False
    if name == "check":
        return check_figures(log), True
    if name == "tests":
        return pytest_figures(log), True
    if name in ("memcheck", "racecheck"):
        return sanitizer_figures(log), True
    if name == "kernels":
        return kernels_figures(out), True
    if name == "efficiency":
        return efficiency_figures(out), True
    if name == "step":
        return step_figures(out, since)
    if name == "cells":
        return cells_figures(out, since)
    return train_figures(train_dir, out)


def cells_figures(out: Path, since: float | None = None) -> tuple[list[str], bool]:
    """Cells per hour at each K, without and with MPS, from the newest cells_per_hour_cuda*.csv; whether every copy
    finished."""
    curves = sorted(out.glob("cells_per_hour_cuda*.csv"), key=lambda path: path.stat().st_mtime)
    rows = read_csv(curves[-1]) if curves and not stale(curves[-1], since) else []
    figures = [
        f"K={r['parallel']}, MPS {r.get('mps') or 'off'}: {r['cells_per_hour']} cells of {r['paper_steps']} steps per hour "
        f"(x{r['speedup']}), {r['finished']} finished in {r['wall_s']} s"
        for r in rows
    ]
    if rows and not any(r.get("mps") == "on" for r in rows):
        why = "no measurement with it was written" if shutil.which(MPS_CONTROL) else f"{MPS_CONTROL} is not on PATH"
        figures.append(f"without MPS only: {why}")
    return figures or ["no curve written"], bool(rows) and all(r["finished"] == f"{r['parallel']}/{r['parallel']}" for r in rows)


# ---- the summary ---------------------------------------------------------------------------------


def machine() -> dict[str, str]:
    info = {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU visible",
        "torch": torch.__version__,
        "torch CUDA": str(torch.version.cuda),
        "python": platform.python_version(),
        "commit": git_commit(),
    }
    smi = shutil.which("nvidia-smi")
    if smi:
        query = subprocess.run(
            [smi, "--query-gpu=driver_version,memory.total", "--format=csv,noheader"], capture_output=True, text=True, timeout=60
        )
        info["driver, GPU memory"] = (
            query.stdout.strip().splitlines()[0] if query.returncode == 0 and query.stdout.strip() else "unknown"
        )
    toolkit = cuda_toolkit()
    if toolkit:
        version = subprocess.run([str(Path(toolkit) / "bin" / "nvcc"), "--version"], capture_output=True, text=True, timeout=60)
        info["nvcc"] = last_match(r"(release .*)$", version.stdout) or "unknown"
    sanitizer = compute_sanitizer()
    if sanitizer:
        version = subprocess.run([sanitizer, "--version"], capture_output=True, text=True, timeout=60)
        info["compute-sanitizer"] = last_match(r"(Version .*)$", version.stdout) or sanitizer
    return info


def render(record: dict) -> str:
    """The markdown summary of a validation record."""
    lines = [
        "# YOSO on a GPU: validation and benchmarks",
        "",
        f"Written by `python -m lra.bench gpu` (lra/bench/gpu.py); each step's full output is in `{SUMMARY}/<step>.log`.",
        "",
    ]
    lines += ["The latest run's machine (each step below names the device and commit it ran on):", ""]
    lines += ["| | |", "| --- | --- |"] + [f"| {key} | {value} |" for key, value in record["machine"].items()] + [""]
    lines += ["| step | status | duration | ran on | command |", "| --- | --- | --- | --- | --- |"]
    results = [StepResult(**result) for result in record["steps"].values()]
    for result in results:
        ran_on = result.ran_on or "not recorded"
        lines.append(f"| {result.name} | {result.status} | {result.duration_s:.0f} s | {ran_on} | `{result.command}` |")
    for result in results:
        when = ", ".join(filter(None, [result.finished_at, result.ran_on]))
        lines += ["", f"## {result.name}: {result.status}", "", f"`{result.command}` ({when})", ""]
        lines += [f"- {figure}" for figure in result.figures]
        if result.earlier:
            kept = StepResult(**result.earlier)
            lines.append(f"- before: {kept.status} in {kept.duration_s:.0f} s ({kept.finished_at}), kept here:")
            lines += [f"  - {figure}" for figure in kept.figures]
    return "\n".join(lines) + "\n"


def ran_on(machine: dict[str, str]) -> str:
    """The device and the commit a step ran on, as the summary's table shows them."""
    commit = machine.get("commit") or "unknown commit"
    found = re.fullmatch(r"([0-9a-f]{40})(-dirty)?", commit)
    short = f"{found[1][:7]}{' with uncommitted changes' if found[2] else ''}" if found else commit
    return f"{machine.get('device', 'unknown device')}, {short}"


def save(out: Path, record: dict) -> None:
    (out / f"{SUMMARY}.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / f"{SUMMARY}.md").write_text(render(record))


def load_record(out: Path, order: list[str]) -> dict:
    """The record of earlier runs into ``out`` (their steps kept), in step order."""
    path = out / f"{SUMMARY}.json"
    record = json.loads(path.read_text()) if path.exists() else {"steps": {}}
    record["steps"] = {name: record["steps"][name] for name in order if name in record["steps"]}
    return record


# ---- the run: a budget for the whole command, an archive after every step ------------------------

MIN_STEP_S = 30.0  # --budget: a step starts only while at least this much of the budget is left
KERNEL_STEPS = ("tests", "memcheck", "racecheck", "kernels")  # nothing to do without YOSO's CUDA kernels
ARCHIVE_SKIPS = (".ckpt", ".pt", ".pth", ".partial")  # never archived: checkpoints, unfinished archives
ARCHIVE_LIMIT = 16 * 2**20  # what one file brought back from a short GPU job may weigh (a common cap)


def snapshot(out: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``out`` (relative path) with its modification time and size: what was there before."""
    files = {}
    for path in sorted(out.rglob("*")):
        if path.is_file() and not path.is_symlink():
            stat = path.stat()
            files[str(path.relative_to(out))] = (stat.st_mtime_ns, stat.st_size)
    return files


def written_since(out: Path, before: dict[str, tuple[int, int]], leave_out: set[Path]) -> list[str]:
    """The files under ``out`` that are new or changed since ``before``, and the summary always (relative paths)."""
    now = snapshot(out)
    names = {name for name, seen in now.items() if before.get(name) != seen}
    names |= {name for name in (f"{SUMMARY}.json", f"{SUMMARY}.md") if name in now}
    return sorted(name for name in names if (out / name).resolve() not in leave_out and not name.endswith(ARCHIVE_SKIPS))


def write_archive(path: Path, out: Path, names: list[str]) -> int:
    """``names`` (relative to ``out``) into the .tar.gz ``path``, atomically (a temporary file, then a rename); its size."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(path.name + ".partial")
    with tarfile.open(staging, "w:gz") as archive:
        for name in names:
            archive.add(out / name, arcname=name, recursive=False)
    os.replace(staging, path)
    return path.stat().st_size


def broken_cuda_kernels(figure: str) -> bool:
    """Whether a line of the check's figures says the CUDA library did not load or cannot be used."""
    return figure.startswith("cuda kernels:") and ("FAILED" in figure or "UNSAFE" in figure)


def run_steps(
    steps: list[Step],
    out: Path,
    train_dir: Path,
    record: dict,
    order: list[str],
    budget: float | None = None,
    archive: Path | None = None,
    started: float | None = None,
    min_step_s: float | None = None,
) -> list[str]:
    """Run ``steps`` in turn, saving ``record`` (and ``archive``) after each one; their statuses.

    With ``budget``, seconds from ``started`` (``time.monotonic()``, default now): a step's timeout is at most what is
    left, and a step is skipped, with the reason, when less than ``min_step_s`` (:data:`MIN_STEP_S`) is left (so are all
    after it). When the check finds the CUDA kernels unbuilt or unsafe, the :data:`KERNEL_STEPS` after it are skipped too
    (each would rebuild and fail the same way). A skipped step keeps its earlier result beside the reason."""
    started = time.monotonic() if started is None else started
    min_step_s = MIN_STEP_S if min_step_s is None else min_step_s
    before = snapshot(out) if archive else {}
    leave_out = {archive.resolve(), archive.resolve().with_name(archive.name + ".partial")} if archive else set()
    statuses, no_kernels = [], None
    for step in steps:
        log_path = out / SUMMARY / f"{step.name}.log"
        earlier, capped = None, None
        if no_kernels and step.name in KERNEL_STEPS and not step.skip_reason:
            step.skip_reason = no_kernels
        if budget is not None and not step.skip_reason:
            left = budget - (time.monotonic() - started)
            if left < min_step_s:
                step.skip_reason = (
                    f"no time left in --budget {budget:.0f} s: {max(left, 0):.0f} s left, "
                    f"a step starts only with at least {min_step_s:.0f} s"
                )
            elif left < step.timeout_s:
                capped, step.timeout_s = step.timeout_s, left
        if step.skip_reason:
            status, duration, figures, log = "skipped", 0.0, [step.skip_reason], None
            kept = record["steps"].get(step.name)
            earlier = kept.get("earlier") if kept and kept["status"] == "skipped" else kept
        else:
            print(f"[{step.name}] {' '.join(step.command)}", flush=True)
            since = time.time()
            status, duration = run_step(step, log_path)
            figures, holds = figures_for(step.name, log_path.read_text(errors="replace"), out, train_dir, since)
            status = "failed" if status == "passed" and not holds else status
            if status == "timeout" and capped:
                figures = [
                    f"stopped after {step.timeout_s:.0f} s, what was left of --budget {budget:.0f} s "
                    f"(its own timeout: {capped:.0f} s)"
                ] + figures
            log = str(log_path.relative_to(out))
        result = StepResult(
            step.name,
            portable(" ".join(step.command)),
            status,
            round(duration, 1),
            figures,
            log,
            datetime.now(timezone.utc).isoformat(timespec="seconds"),
            earlier,
            "" if step.skip_reason else ran_on(record["machine"]),
        )
        statuses.append(status)
        if step.name == "check" and status != "passed" and any(broken_cuda_kernels(figure) for figure in figures):
            no_kernels = (
                f"the CUDA kernels did not build or are unsafe (check, {SUMMARY}/check.log): "
                f"{', '.join(KERNEL_STEPS)} have nothing to run until that is fixed"
            )
        record["steps"][step.name] = asdict(result)
        record["steps"] = {name: record["steps"][name] for name in order if name in record["steps"]}
        save(out, record)  # after every step, so an interrupted run keeps what it measured
        print(f"[{step.name}] {status} in {duration:.0f} s" + "".join(f"\n    {figure}" for figure in figures[:12]), flush=True)
        if status in ("failed", "timeout"):
            print(
                "    last lines of the log:\n"
                + "\n".join("      " + line for line in log_path.read_text(errors="replace").splitlines()[-25:])
            )
        if archive:  # after every step too: a command killed at its limit still brings back the steps it finished
            members = written_since(out, before, leave_out)
            size = write_archive(archive, out, members)
            print(f"    {archive}: {len(members)} files, {size / 1024:.0f} KiB", flush=True)
            if size > ARCHIVE_LIMIT:
                limit = ARCHIVE_LIMIT / 2**20
                print(f"    warning: over {limit:.0f} MiB, more than one file brought back from a short GPU job may weigh")
    return statuses


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()  # --budget counts from here
    parser = argparse.ArgumentParser(prog="python -m lra.bench gpu", description=__doc__.split("\n\n")[0])
    names = list(plan(RESULTS, RESULTS))
    parser.add_argument(
        "--steps", default=",".join(names), help=f"comma-separated, in any order (run in this order): {','.join(names)}"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=RESULTS,
        help="folder for the results and the summary (default: results/ in the current folder)",
    )
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds per step (default: each step's own, under 10 minutes)"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        metavar="S",
        help=f"seconds for the whole command: each step's timeout is at most what is left, and a step is skipped once "
        f"under {MIN_STEP_S:.0f} s are left",
    )
    parser.add_argument(
        "--archive",
        type=Path,
        default=None,
        metavar="PATH",
        help="after every step, a .tar.gz of what this run wrote under --out (paths relative to it): tar -xzf PATH -C results",
    )
    parser.add_argument("-k", dest="pytest_filter", default=None, help="a pytest -k expression for tests, memcheck, racecheck")
    parser.add_argument(
        "--official-yoso",
        type=Path,
        default=None,
        metavar="PATH",
        help="a checkout of mlpen/YOSO: the kernels step times its kernels too (python -m lra.bench kernels --official-yoso)",
    )
    parser.add_argument(
        "--official-yoso-commit", default=None, help="its commit, where PATH is not a git checkout (passed to the kernels step)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.steps.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in names]
    if unknown or not chosen:
        parser.error(f"unknown step(s) {', '.join(unknown) or '(none given)'}; choose from {','.join(names)}")
    if args.budget is not None and args.budget <= 0:
        parser.error(f"--budget must be a positive number of seconds, got {args.budget:g}")
    out = args.out.resolve()
    archive = args.archive.resolve() if args.archive else None
    train_dir = Path("outputs", "gpu_validation", datetime.now().strftime("%Y%m%d-%H%M%S")).resolve()
    if args.official_yoso and not args.official_yoso.is_dir():
        parser.error(f"--official-yoso {args.official_yoso}: no such folder (a checkout of mlpen/YOSO)")
    official = args.official_yoso.resolve() if args.official_yoso else None  # the steps run from the repository root
    steps = plan(out, train_dir, args.timeout, args.pytest_filter, official, args.official_yoso_commit)
    steps = [step for name, step in steps.items() if name in chosen]
    if args.dry_run:
        for step in steps:
            note = f"  # skipped: {step.skip_reason}" if step.skip_reason else ""
            print(f"[{step.name}] {' '.join(f'{k}={v}' for k, v in step.env.items())} {' '.join(step.command)}{note}")
        return 0
    if not torch.cuda.is_available():
        print(
            "No CUDA GPU is visible (torch.cuda.is_available() is False): this command validates YOSO's CUDA kernels on a GPU.\n"
            "On a CPU, `python -m yoso_cuda --check` and `pytest` check the CPU kernels; `--dry-run` shows the steps."
        )
        return 2
    out.mkdir(parents=True, exist_ok=True)
    record = load_record(out, names)
    record["machine"] = machine()
    print(
        f"GPU validation on {record['machine']['device']}, torch {torch.__version__}: steps {', '.join(s.name for s in steps)}",
        flush=True,
    )
    statuses = run_steps(steps, out, train_dir, record, names, args.budget, archive, started)
    print(f"wrote {out / (SUMMARY + '.md')}")
    return 0 if all(status in ("passed", "skipped") for status in statuses) else 1


if __name__ == "__main__":
    sys.exit(main())
