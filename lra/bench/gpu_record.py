"""The record of ``python -m lra.bench gpu``: each step's result in ``gpu_validation_cuda.json``, the machine it ran
on, and the markdown summary rendered from them (``gpu_validation_cuda.md``).

A run of some steps replaces their results and keeps the others', so each result names the device and commit it ran
on; a skipped step keeps the result it had before (``earlier``).
"""

from __future__ import annotations

import json
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch

from lra.files import write_atomically
from lra.results import git_commit
from yoso_cuda.build import cuda_toolkit

SUMMARY = "gpu_validation_cuda"  # the record's name, and its folder of logs


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


def machine(sanitizer: str | None) -> dict[str, str]:
    """The device, driver, CUDA, torch and commit of this run; ``sanitizer``: compute-sanitizer's path, if any."""
    info = {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU visible",
        "torch": torch.__version__,
        "torch CUDA": str(torch.version.cuda),
        "python": platform.python_version(),
        "commit": git_commit(),
    }
    smi = shutil.which("nvidia-smi")
    if smi:
        query = [smi, "--query-gpu=driver_version,memory.total", "--format=csv,noheader"]
        info["driver, GPU memory"] = (output(query).splitlines() or ["unknown"])[0]
    toolkit = cuda_toolkit()
    if toolkit:
        info["nvcc"] = last_match(r"(release .*)$", output([str(Path(toolkit) / "bin" / "nvcc"), "--version"])) or "unknown"
    if sanitizer:
        info["compute-sanitizer"] = last_match(r"(Version .*)$", output([sanitizer, "--version"])) or sanitizer
    return info


def output(command: list[str]) -> str:
    """What ``command`` printed; "" where it failed."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    return done.stdout.strip() if done.returncode == 0 else ""


def last_match(pattern: str, text: str) -> str | None:
    found = re.findall(pattern, text, flags=re.MULTILINE)
    return found[-1].strip() if found else None


def ran_on(machine: dict[str, str]) -> str:
    """The device and the commit a step ran on, as the summary's table shows them."""
    commit = machine.get("commit") or "unknown commit"
    found = re.fullmatch(r"([0-9a-f]{40})(-dirty)?", commit)
    short = f"{found[1][:7]}{' with uncommitted changes' if found[2] else ''}" if found else commit
    return f"{machine.get('device', 'unknown device')}, {short}"


def render(record: dict) -> str:
    """The markdown summary of a record."""
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


def save(out: Path, record: dict) -> None:
    """The record and its summary, each written whole (a step killed at a time limit leaves the earlier ones)."""
    write_atomically(out / f"{SUMMARY}.json", (json.dumps(record, indent=2) + "\n").encode())
    write_atomically(out / f"{SUMMARY}.md", render(record).encode())


def load(out: Path, order: tuple[str, ...]) -> dict:
    """The record of earlier runs into ``out`` (their steps kept), in step order."""
    path = out / f"{SUMMARY}.json"
    record = json.loads(path.read_text()) if path.exists() else {"steps": {}}
    record["steps"] = {name: record["steps"][name] for name in order if name in record["steps"]}
    return record
