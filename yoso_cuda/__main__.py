"""``python -m yoso_cuda [--check] [-v]``: build YOSO's kernel libraries and report, per library,
what was built or why not; with ``--check``, compare every compiled op with the reference on every
available device (:mod:`yoso_cuda.check`). Exit status 1 if a library this machine should have is
missing or a check fails."""

from __future__ import annotations

import argparse
import logging
import platform
import sys
import time

import torch

from .build import KernelBuildError, build, cuda_toolkit
from .ops import kernels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m yoso_cuda", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare every compiled op with the reference")
    parser.add_argument("-v", "--verbose", action="store_true", help="show the compiler's output")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # "Building YOSO's ... kernels" on a first build
    print(f"python {platform.python_version()}, torch {torch.__version__}, torch CUDA {torch.version.cuda}")
    print(f"CUDA toolkit: {cuda_toolkit() or 'not found'}; GPUs visible: {torch.cuda.device_count()}")
    start = time.perf_counter()
    try:
        if args.verbose:
            build(verbose=True)  # with the compiler's output; kernels() then loads what it built
        report = kernels()
    except KernelBuildError as error:  # YOSO_KERNELS=require: still print what was built
        report = error.report
    print(f"build or cache load took {time.perf_counter() - start:.1f} s (YOSO_KERNELS={report.setting})")
    for library in report.libraries:
        print(library.describe())
        for note in library.notes:
            print(f"  note: {note}")
    if report.missing:
        print("Where a device's kernels are missing, YOSO runs there on the pure-PyTorch reference (yoso_cuda/reference.py).")
    if not args.check:
        return 1 if report.missing or report.unsafe else 0
    from .check import run_check

    start = time.perf_counter()
    lines, passed = run_check(report)
    print("\n".join(lines))
    print(f"check {'passed' if passed else 'FAILED'} in {time.perf_counter() - start:.1f} s")
    return 0 if passed and not report.missing and not report.unsafe else 1


if __name__ == "__main__":
    sys.exit(main())
