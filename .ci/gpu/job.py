#!/usr/bin/env python3
"""A short GPU job's run of ``python -m lra.bench gpu``: its steps one at a time within the job's time, and an archive
of what they wrote after each one.

    python .ci/gpu/job.py --budget S --archive FILE [--steps check,tests,...] [--out results] [--step-limit S]
        [-- OPTIONS OF python -m lra.bench gpu]

For a job whose command has a time limit (a queue's, a preemptible machine's) and whose files come back from one
folder. Run it with the project's interpreter (it runs the command with the same one):

- ``--budget S``: S seconds for the whole job, counted from this script's start. Each step runs as
  ``python -m lra.bench gpu --steps STEP --timeout STEP=T``, T the smaller of ``--step-limit`` (default 570 s: a step
  inside a 600-s command, with time left to record and archive it) and what is left of the budget. A step is not
  started while under ``--min-step`` (30 s) are left, and neither is any after it (time only goes down): the record
  keeps their earlier results, and this script says why they did not run.
- ``--archive FILE``: after every step, one .tar.gz of what the job wrote under ``--out``: the files new or changed
  since it started (the steps' logs, CSV, PNG and profiles) and the summary ``gpu_validation_cuda.{json,md}`` always,
  named relative to ``--out`` (``tar -xzf FILE -C results`` puts them where ``--out results`` would), written to a
  temporary file and renamed, so a job killed at its limit leaves the archive of the steps it finished. Never
  checkpoints (``.ckpt``, ``.pt``, ``.pth``). Over :data:`ARCHIVE_LIMIT` (what a job may commonly bring back in one
  file), it warns.

What each step found is in the record the command writes (``gpu_validation_cuda.md``) and in its printed lines. Exit
status 0 when every step that ran passed or was skipped by the command, 2 without a GPU, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from lra.bench.gpu import STEPS
from lra.bench.gpu_record import SUMMARY

RECORD = (f"{SUMMARY}.json", f"{SUMMARY}.md")  # archived after every step
ARCHIVE_SKIPS = (".ckpt", ".pt", ".pth", ".partial")  # never archived: checkpoints, unfinished archives
ARCHIVE_LIMIT = 16 * 2**20  # what one file brought back from a short GPU job may weigh (a common cap)
NO_GPU = 2  # python -m lra.bench gpu's exit status where no GPU is visible


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python .ci/gpu/job.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, required=True, metavar="S", help="seconds for the whole job")
    parser.add_argument("--archive", type=Path, default=None, metavar="FILE", help="a .tar.gz of what it wrote, after each step")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, run in this order: {','.join(STEPS)}")
    parser.add_argument("--out", type=Path, default=Path("results"), help="the command's --out (default: results)")
    parser.add_argument("--step-limit", type=float, default=570.0, metavar="S", help="a step's longest time (default 570)")
    parser.add_argument("--min-step", type=float, default=30.0, metavar="S", help="start a step only with this much left (30)")
    parser.add_argument("options", nargs="*", help="after --: options of python -m lra.bench gpu (-k, --official-yoso, ...)")
    args = parser.parse_args(argv)
    args.steps = [name.strip() for name in args.steps.split(",") if name.strip()]
    unknown = [name for name in args.steps if name not in STEPS]
    if unknown or not args.steps:
        parser.error(f"unknown step(s) {', '.join(unknown) or '(none given)'}; choose from {','.join(STEPS)}")
    for name in ("budget", "step_limit", "min_step"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')} is a positive number of seconds, got {getattr(args, name):g}")
    args.out = args.out.resolve()
    args.archive = args.archive.resolve() if args.archive else None
    return args


def gpu_command(step: str, limit_s: float, out: Path, options: list[str]) -> list[str]:
    """The command that runs one step under its time limit."""
    limit = ["--timeout", f"{step}={limit_s:.0f}"]
    return [sys.executable, "-m", "lra.bench", "gpu", "--steps", step, *limit, "--out", str(out), *options]


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
    names = {name for name, seen in now.items() if before.get(name) != seen} | {name for name in RECORD if name in now}
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


def archive_now(args: argparse.Namespace, before: dict[str, tuple[int, int]]) -> None:
    leave_out = {args.archive, args.archive.with_name(args.archive.name + ".partial")}
    members = written_since(args.out, before, leave_out)
    size = write_archive(args.archive, args.out, members)
    print(f"    {args.archive}: {len(members)} files, {size / 1024:.0f} KiB", flush=True)
    if size > ARCHIVE_LIMIT:
        print(f"    warning: over {ARCHIVE_LIMIT / 2**20:.0f} MiB, more than a short GPU job may bring back in one file")


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()  # --budget counts from here
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    before = snapshot(args.out) if args.archive else {}
    failed = False
    for index, step in enumerate(args.steps):
        left = args.budget - (time.monotonic() - started)
        if left < args.min_step:
            print(
                f"[job] not run: {', '.join(args.steps[index:])}: {max(left, 0):.0f} s left of --budget {args.budget:.0f} s, "
                f"a step starts only with {args.min_step:.0f} s (the record keeps their earlier results)"
            )
            break
        limit = min(args.step_limit, left)
        note = f", what is left of --budget {args.budget:.0f} s" if limit < args.step_limit else ""
        print(f"[job] {step}: at most {limit:.0f} s{note}", flush=True)
        exit_status = subprocess.run(gpu_command(step, limit, args.out, args.options)).returncode
        if args.archive:  # after every step: a job killed at its limit still brings back the steps it finished
            archive_now(args, before)
        if exit_status == NO_GPU:
            return NO_GPU
        failed |= exit_status != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
