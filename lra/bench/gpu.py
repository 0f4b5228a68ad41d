"""One command for a GPU machine: validate YOSO's CUDA kernels and measure the GPU benchmarks.

``python -m lra.bench gpu [--steps check,tests,...] [--timeout [STEP=]S ...] [--out results] [-k EXPR]
[--official-yoso PATH [--official-yoso-commit C]] [--authors-code PATH [--performer-pytorch PATH]] [--dry-run]``
runs these steps in order from the repository root, each as its own process under its own time limit
(``--timeout``, default :data:`DEFAULT_TIMEOUT_S` s each), and goes on past a step that fails:

==============  ================================================================================
``check``       ``python -m lra.bench.kernel_check``: builds the kernels (``YOSO_KERNELS=require``) and
                compares every compiled op with the reference on the CPU and the GPU, as
                ``python -m yoso_cuda --check`` does, its verdicts also as JSON for the summary
``tests``       ``pytest -m cuda tests/yoso_cuda tests/attention_zoo``: the CUDA kernel tests, and the
                attentions' GPU paths: ``softmax_unpadded``'s fused nested kernels against ``softmax``,
                ``yoso_e_flex``'s compiled FlexAttention against ``yoso_e``
``memcheck``    the kernel tests under ``compute-sanitizer --tool memcheck`` (no caching allocator,
                so an out-of-bounds access lands outside an allocation)
``racecheck``   the kernel tests under ``compute-sanitizer --tool racecheck`` (shared-memory hazards)
``kernels``     ``python -m lra.bench kernels`` (YOSO-32 against every SDPA backend, 1K..64K tokens;
                with ``--official-yoso PATH``, also the official mlpen/YOSO kernels and the ratio
                official / ours per shape at forward+backward)
``efficiency``  ``python -m lra.bench efficiency`` at n = 512, 2048, 8192: the paper's efficiency
                profile on this GPU (every attention, the largest batch that fits)
``train``       ``python -m lra.train -m trainer=gpu attention=<every preset>``: a short run of each
                preset on the smoke ListOps (generated), outputs in a fresh folder: every row trains
                end to end on this GPU under bf16 before a campaign spends hours on it
``cells``       ``python -m lra.campaign measure``: cells per hour against the cells run at once on
                the GPU (K = 1..16), each K > 1 without and with CUDA MPS (``--mps off,on``; without
                only where ``nvidia-cuda-mps-control`` is not on PATH, as its figures say), 200-step
                copies of Table 3's softmax ListOps cell: how many cells ``lra.campaign start`` should
                run at once here
``step``        ``python -m lra.bench step`` of ListOps (n = 2048, batch 32, bf16) for the twelve rows
                of Table 3 with ``softmax_unpadded`` and ``yoso_e_flex`` (softmax and YOSO-E without
                the padding's work) each right after its row, compiled (``reduce-overhead``: CUDA
                graphs) and then eager (``--eager-too``), ``--profile``: step and evaluation ms, device
                busy ms and kernels per step, and a profile per cell (``step_cuda_profile/``); the
                figures check the none step against 3 ms and the twelve compiled steps' sum against
                60 ms, and give each candidate's step as a ratio to its row's
``authors``     ``python -m lra.bench authors`` on this GPU, with ``--authors-code PATH`` (a checkout of
                mlpen/Nystromformer's ``LRA/code``; skipped without it) and ``--performer-pytorch PATH``
==============  ================================================================================

It writes into ``--out`` (default ``results/`` of the current folder) each benchmark's ``*_cuda.{csv,png}``
(``kernels``, ``efficiency``, ``train_presets``, ``cells_per_hour_<device>``, ``step`` with ``step_cuda_profile/``,
``authors``), each step's full output in ``gpu_validation_cuda/<step>.log`` (with the check's ``check.json`` and the
test steps' JUnit XML beside it), and the summary ``gpu_validation_cuda.md`` (machine, driver, CUDA, torch; each
step's command, status, duration and key figures, read from what the step wrote: :mod:`lra.bench.gpu_figures`)
rendered from ``gpu_validation_cuda.json`` (:mod:`lra.bench.gpu_record`). A later run of some steps replaces theirs
in that record and keeps the others, so the steps can be run a few at a time; each names the machine and commit it
ran on. When the check finds the CUDA kernels unbuilt or unsafe, ``tests``, ``memcheck``, ``racecheck`` and
``kernels`` are skipped until a check on the same machine and commit passes (each would rebuild and fail the same
way). Commands and logs name files relative to the checkout and the interpreter as ``python``, so a record reads the
same on any machine.

It needs only what the project's training needs (torch, Lightning, Hydra, pandas, matplotlib,
ninja, pytest) plus, for the sanitizer steps, ``compute-sanitizer`` from the CUDA toolkit; without
it those steps are recorded as skipped. ``--dry-run`` prints the commands and their time limits without running them.
A short GPU job with a time limit runs the steps one at a time through ``.ci/gpu/job.py`` (its budget and archive).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from lra import config
from lra.bench import gpu_figures, gpu_record
from lra.bench.gpu_figures import SANITIZER_ERRORS, STEP_CANDIDATES, STEP_ROWS
from lra.bench.gpu_record import SUMMARY, StepResult
from lra.bench.output import RESULTS
from lra.campaign import MPS_CONTROL
from lra.paper import TABLES
from yoso_cuda.build import cuda_toolkit

ROOT = Path(__file__).resolve().parents[2]  # the checkout whose tests the steps run
STEPS = ("check", "tests", "memcheck", "racecheck", "kernels", "efficiency", "train", "cells", "step", "authors")
DEFAULT_TIMEOUT_S = 3600.0  # a step that runs longer has hung, or needs --timeout STEP=S
KERNEL_STEPS = ("tests", "memcheck", "racecheck", "kernels")  # nothing to do without YOSO's CUDA kernels
TRAIN_OVERRIDES = [  # the smoke experiment's generated ListOps, shortened to a few steps
    "trainer=gpu",
    "trainer.enable_progress_bar=false",
    "task.protocol.max_steps=60",
    "task.protocol.warmup_steps=6",
    "task.protocol.val_check_interval=30",
    "task.protocol.limit_val_batches=4",
]
CELLS_CELL = ["experiment=table3", "task=listops", "attention=softmax", "trainer=gpu"]  # the cell the cells step copies


@dataclass
class Step:
    name: str
    command: list[str]
    timeout_s: float = DEFAULT_TIMEOUT_S
    env: dict[str, str] = field(default_factory=dict)
    skip_reason: str | None = None  # set when the step cannot run on this machine, or has nothing to run


def compute_sanitizer() -> str | None:
    toolkit = cuda_toolkit()
    candidates = [shutil.which("compute-sanitizer")] + ([str(Path(toolkit) / "bin" / "compute-sanitizer")] if toolkit else [])
    return next((path for path in candidates if path and Path(path).exists()), None)


def preset_names() -> list[str]:
    return config.attention_rows()


def step_attentions() -> list[str]:
    """The step's attentions in order: Table 3's twelve rows, each followed by its candidates, so that a step its time
    limit cuts short has timed each candidate it reached beside its row."""
    rows = TABLES[STEP_ROWS].presets
    return [name for row in rows for name in [row, *(path for path, of in STEP_CANDIDATES.items() if of == row)]]


def plan(out: Path, train_dir: Path, args: argparse.Namespace | None = None) -> dict[str, Step]:
    """Every step, in order, with its command; ``args`` are the command's options (none: its defaults)."""
    args = args or parse([])
    python, logs = sys.executable, out / SUMMARY
    tests = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda", "tests/yoso_cuda"]
    tests += ["-k", args.pytest_filter] if args.pytest_filter else []

    def junit(name: str) -> str:
        return f"--junitxml={logs / f'{name}.xml'}"

    def bench(name: str, *options: str) -> list[str]:
        return [python, "-m", "lra.bench", name, "--device", "cuda", "--out", str(out), *options]

    sanitizer = compute_sanitizer()
    no_sanitizer = None if sanitizer else "compute-sanitizer not found (it ships with the CUDA toolkit, in <CUDA_HOME>/bin)"
    sanitize = [sanitizer or "compute-sanitizer", "--error-exitcode", str(SANITIZER_ERRORS), "--tool"]
    # Each tensor its own allocation, so that an overrun is caught.
    unpooled = {"env": {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, "skip_reason": no_sanitizer}
    outputs = {"LRA_OUTPUT_DIR": str(train_dir)}
    official = ["--official-yoso", str(args.official_yoso)] if args.official_yoso else []
    official += ["--official-yoso-commit", args.official_yoso_commit] if args.official_yoso and args.official_yoso_commit else []
    authors = ["--authors-code", str(args.authors_code)] if args.authors_code else []
    authors += ["--performer-pytorch", str(args.performer_pytorch)] if args.performer_pytorch else []
    no_authors = None if args.authors_code else "needs --authors-code PATH, a checkout of mlpen/Nystromformer's LRA/code"
    step_grid = ["--tasks", "listops", "--attentions", ",".join(step_attentions()), "--warmup", "5", "--profile", "--quiet"]
    cells = ["measure", "--parallel", "1,2,4,8,16", "--mps", mps(), "--steps", "200", "--out", str(out), *CELLS_CELL]
    steps = [
        Step("check", [python, "-m", "lra.bench.kernel_check", "--json", str(logs / "check.json")]),
        Step("tests", [python, *tests, "tests/attention_zoo", junit("tests")]),  # Triton's kernels: no sanitizer below
        # API errors that torch provokes and handles itself (probing features) are not the kernels' bugs.
        Step("memcheck", [*sanitize, "memcheck", "--report-api-errors", "no", python, *tests, junit("memcheck")], **unpooled),
        Step("racecheck", [*sanitize, "racecheck", python, *tests, junit("racecheck")], **unpooled),
        Step("kernels", bench("kernels", "--lengths", "1024", "4096", "16384", "65536", *official)),
        Step("efficiency", bench("efficiency", "--lengths", "512", "2048", "8192", "--max-batch-tokens", str(2**18), "--quiet")),
        Step("train", [python, "-m", "lra.train", "-m", f"attention={','.join(preset_names())}", *TRAIN_OVERRIDES], env=outputs),
        Step("cells", [python, "-m", "lra.campaign", *cells]),
        Step("step", bench("step", *step_grid, "--compile", "--compile-mode", "reduce-overhead", "--eager-too")),
        Step("authors", bench("authors", *authors), skip_reason=no_authors),
    ]
    for step in steps:
        step.env = {"YOSO_KERNELS": "require", "PYTHONUNBUFFERED": "1", **step.env}
        step.timeout_s = args.timeout.get(step.name, DEFAULT_TIMEOUT_S)
    return {step.name: step for step in steps}


def mps() -> str:
    """The cells step's ``--mps``: with and without MPS where its control daemon is installed."""
    return "off,on" if shutil.which(MPS_CONTROL) else "off"


def portable(text: str) -> str:
    """``text`` with this checkout's absolute paths made relative to it and the interpreter called ``python``."""
    return text.replace(sys.executable, "python").replace(f"{ROOT}{os.sep}", "").replace(str(ROOT), ".")


def run_step(step: Step, log_path: Path) -> tuple[str, float, int | None]:
    """Run ``step`` with its output into ``log_path``; its status, duration and exit status (None: stopped)."""
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
            exit_status = process.wait(timeout=step.timeout_s)
            status = "passed" if exit_status == 0 else "failed"
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            log.write(f"\n# stopped after the step's time limit of {step.timeout_s:.0f} s\n")
            status, exit_status = "timeout", None
    log_path.write_text(portable(log_path.read_text(errors="replace")))
    return status, time.perf_counter() - start, exit_status


def run_steps(steps: list[Step], out: Path, record: dict, train_dir: Path) -> list[str]:
    """Run ``steps`` in turn, saving ``record`` after each one; their statuses. A skipped step keeps its earlier result
    beside the reason."""
    statuses = []
    for step in steps:
        here = gpu_record.ran_on(record["machine"])
        if step.name in KERNEL_STEPS and not step.skip_reason:
            step.skip_reason = gpu_figures.kernels_unusable(out, record, here)
        if step.skip_reason:
            kept = record["steps"].get(step.name)
            earlier = kept.get("earlier") if kept and kept["status"] == "skipped" else kept
            result = StepResult(step.name, portable(" ".join(step.command)), "skipped", 0.0, [step.skip_reason])
            result.earlier = earlier
        else:
            print(f"[{step.name}] {' '.join(step.command)}", flush=True)
            since, log_path = time.time(), out / SUMMARY / f"{step.name}.log"
            status, duration, exit_status = run_step(step, log_path)
            figures, holds = gpu_figures.figures_for(step.name, out, since, exit_status, train_dir)
            figures = [portable(figure) for figure in figures]  # a kernel library's path, say
            status = "failed" if status == "passed" and not holds else status
            command = portable(" ".join(step.command))
            result = StepResult(step.name, command, status, round(duration, 1), figures, str(log_path.relative_to(out)))
            result.ran_on = here
        result.finished_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        record["steps"][step.name] = asdict(result)
        record["steps"] = {name: record["steps"][name] for name in STEPS if name in record["steps"]}
        gpu_record.save(out, record)  # after every step, so an interrupted run keeps what it measured
        statuses.append(result.status)
        print(f"[{step.name}] {result.status} in {result.duration_s:.0f} s" + "".join(f"\n    {f}" for f in result.figures[:12]))
        if result.status in ("failed", "timeout"):
            lines = (out / result.log).read_text(errors="replace").splitlines()[-25:]
            print("    last lines of the log:\n" + "\n".join("      " + line for line in lines), flush=True)
    return statuses


def time_limits(values: list[str]) -> dict[str, float]:
    """``--timeout``'s values, ``S`` (every step) or ``STEP=S``, in order (a later one wins), as seconds per step."""
    limits = {}
    for value in values:
        name, _, seconds = value.rpartition("=")
        if name and name not in STEPS:
            raise ValueError(f"--timeout {value}: no step {name!r}; the steps: {','.join(STEPS)}")
        try:
            limit = float(seconds)
        except ValueError:
            limit = -1.0
        if not limit > 0:
            example = f"--timeout {name or 'racecheck'}=1800"
            raise ValueError(f"--timeout {value}: a time limit is a positive number of seconds, e.g. {example}")
        limits.update({step: limit for step in ([name] if name else STEPS)})
    return limits


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lra.bench gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--steps", default=",".join(STEPS), help=f"comma-separated, in any order (run in this order): {','.join(STEPS)}"
    )
    parser.add_argument(
        "--timeout",
        action="append",
        default=[],
        metavar="[STEP=]S",
        help=f"a step's time limit in seconds (STEP=S), or every step's (S); repeatable, a later one wins "
        f"(default: {DEFAULT_TIMEOUT_S:.0f} each), e.g. --timeout 1800 --timeout racecheck=7200",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of the results and summary (default: results/ here)")
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
    parser.add_argument(
        "--authors-code", type=Path, default=None, metavar="PATH", help="mlpen/Nystromformer's LRA/code, for the authors step"
    )
    parser.add_argument(
        "--performer-pytorch", type=Path, default=None, metavar="PATH", help="lucidrains/performer-pytorch, for the authors step"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the commands and their time limits, and exit")
    return parser


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The options, checked: the steps known, each time limit positive, each folder there (made absolute, as the steps
    run from the repository root); ``timeout`` as seconds per step."""
    options = parser()
    args = options.parse_args(argv)
    args.steps = [name.strip() for name in args.steps.split(",") if name.strip()]
    unknown = [name for name in args.steps if name not in STEPS]
    if unknown or not args.steps:
        options.error(f"unknown step(s) {', '.join(unknown) or '(none given)'}; choose from {','.join(STEPS)}")
    try:
        args.timeout = time_limits(args.timeout)
    except ValueError as error:
        options.error(str(error))
    for name in ("official_yoso", "authors_code", "performer_pytorch"):
        folder = getattr(args, name)
        if folder and not folder.is_dir():
            options.error(f"--{name.replace('_', '-')} {folder}: no such folder")
        setattr(args, name, folder.resolve() if folder else None)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    out = args.out.resolve()
    train_dir = Path("outputs", "gpu_validation", datetime.now().strftime("%Y%m%d-%H%M%S")).resolve()
    steps = [step for name, step in plan(out, train_dir, args).items() if name in args.steps]
    if args.dry_run:
        for step in steps:
            note = f"  # skipped: {step.skip_reason}" if step.skip_reason else ""
            env = " ".join(f"{key}={value}" for key, value in step.env.items())
            print(f"[{step.name}] limit {step.timeout_s:.0f} s: {env} {' '.join(step.command)}{note}")
        return 0
    if not torch.cuda.is_available():
        print(
            "No CUDA GPU is visible (torch.cuda.is_available() is False): this command validates YOSO's CUDA kernels on a GPU.\n"
            "On a CPU, `python -m yoso_cuda --check` and `pytest` check the CPU kernels; `--dry-run` shows the steps."
        )
        return 2
    out.mkdir(parents=True, exist_ok=True)
    record = {**gpu_record.load(out, STEPS), "machine": gpu_record.machine(compute_sanitizer())}
    print(f"GPU validation on {record['machine']['device']}, torch {torch.__version__}: {', '.join(args.steps)}", flush=True)
    statuses = run_steps(steps, out, record, train_dir)
    print(f"wrote {out / (SUMMARY + '.md')}")
    return 0 if all(status in ("passed", "skipped") for status in statuses) else 1


if __name__ == "__main__":
    sys.exit(main())
