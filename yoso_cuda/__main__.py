"""``python -m yoso_cuda``: build YOSO's kernels and report what is available."""

import platform
import sys
import time

import torch

from .build import build, cuda_toolkit


def main() -> int:
    print(f"python {platform.python_version()}, torch {torch.__version__}, torch CUDA {torch.version.cuda}")
    print(f"CUDA toolkit: {cuda_toolkit() or 'not found'}; GPUs visible: {torch.cuda.device_count()}")
    start = time.perf_counter()
    report = build(verbose="-v" in sys.argv[1:])
    print(f"build or cache load took {time.perf_counter() - start:.1f} s")
    print(f"CPU kernels: {'loaded' if report.cpu else 'missing'}")
    print(f"CUDA kernels: {'loaded' if report.cuda else 'missing'}" + (f" (archs: {report.cuda_archs})" if report.cuda else ""))
    for note in report.notes:
        print(f"note: {note}")
    if report.library:
        print(f"library: {report.library}")
    if report.error:
        print(f"error: {report.error}")
        print("Without kernels YOSO runs on the pure-PyTorch reference (yoso_cuda/reference.py).")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
