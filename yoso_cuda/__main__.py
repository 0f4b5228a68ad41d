"""``python -m yoso_cuda [--check | --export FILE | --import FILE] [-v]``: build YOSO's kernel libraries and report, per library,
what was built or why not; with ``--check``, compare every compiled op with the reference on every
available device (:mod:`yoso_cuda.check`). Exit status 1 if a library this machine should have is
missing or a check fails.

``python -m yoso_cuda --export FILE`` writes the built libraries and their stamps to FILE (.tar.gz);
``--import FILE`` on the next machine puts those whose stamps match it where the build looks, so
they load without compiling, and names each one that will be rebuilt instead. Exit status 2 when
there is nothing to export or FILE is not such an archive."""

from __future__ import annotations

import argparse
import logging
import platform
import sys
import time
from pathlib import Path

import torch

from .build import BuildArchiveError, KernelBuildError, build, cuda_toolkit, export_build, import_build
from .ops import kernels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m yoso_cuda", description=__doc__.split("\n\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="show the compiler's output")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--check", action="store_true", help="compare every compiled op with the reference")
    action.add_argument("--export", type=Path, metavar="FILE", help="write the built libraries to FILE (.tar.gz) and exit")
    action.add_argument(
        "--import",
        dest="import_from",
        type=Path,
        metavar="FILE",
        help="take the libraries in FILE (from --export) that were built for this machine, and exit",
    )
    args = parser.parse_args(argv)
    if args.export or args.import_from:
        try:
            lines = export_build(args.export) if args.export else import_build(args.import_from)
        except BuildArchiveError as error:
            print(f"python -m yoso_cuda: error: {error}", file=sys.stderr)
            return 2
        print("\n".join(lines))
        return 0
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
