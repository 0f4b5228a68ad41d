"""The ``check`` step of ``python -m lra.bench gpu``: what ``python -m yoso_cuda --check`` does, its verdicts also as
JSON for the summary.

``python -m lra.bench.kernel_check --json PATH`` builds (or loads) YOSO's kernel libraries, compares every compiled op
with the reference on each device here (:func:`yoso_cuda.check.check_device`), prints a line per library and per
op, and writes to PATH whether the check passed, whether the CUDA kernels can be used, each library's state and each
verdict. Exit status 1 where a library this machine should have is missing or unsafe, or an op fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import yoso_cuda
from yoso_cuda.build import KernelBuildError
from yoso_cuda.check import check_device


def verdicts(report) -> list[dict]:
    """A verdict per op on each device here whose library loaded, and a failing one per library that is wanted and
    missing, or unsafe."""
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    found = []
    for library in report.libraries:
        problem = f"unsafe: {library.unsafe}" if library.unsafe else None
        if not library.loaded and (library.wanted or library.device in devices):
            problem = f"not built: {library.reason}"
        if problem:  # in yoso_cuda.check.Verdict's line: device, op, verdict, detail
            line = f"{library.device:<5} {'kernel library':<42} FAIL  {problem}"
            found.append({"device": library.device, "op": "kernel library", "passed": False, "line": line})
        elif library.loaded and library.device in devices:
            checked = check_device(library.device)
            found += [{"device": v.device, "op": v.op, "passed": v.passed, "line": v.line()} for v in checked]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lra.bench.kernel_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, required=True, metavar="PATH", help="where to write the verdicts")
    args = parser.parse_args(argv)
    try:
        report = yoso_cuda.kernels()
    except KernelBuildError as error:  # YOSO_KERNELS=require: still check what was built
        report = error.report
    for library in report.libraries:
        print(library.describe())
    found = verdicts(report)
    print("\n".join(verdict["line"] for verdict in found))
    passed = all(v["passed"] for v in found)
    check = {
        "passed": passed,
        "cuda_usable": report.cuda.loaded and not report.cuda.unsafe and torch.cuda.is_available(),  # built needs a GPU too
        "libraries": {library.device: library.describe() for library in report.libraries},
        "verdicts": found,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(check, indent=2) + "\n")
    print(f"check {'passed' if passed else 'FAILED'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
