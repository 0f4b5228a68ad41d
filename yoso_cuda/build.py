"""Just-in-time build of YOSO's kernels with ``torch.utils.cpp_extension.load`` and ninja.

The CPU kernels (``csrc/yoso.cpp``) build wherever a C++ compiler is found. The CUDA kernels
(``csrc/cuda/*.cu``) are added whenever torch is a CUDA build and a CUDA toolkit is found
(``CUDA_HOME``); on a machine without a GPU only when ``TORCH_CUDA_ARCH_LIST`` (e.g. ``9.0``) names
the architectures, since no GPU can be asked (CI does this so a kernel that does not compile never
lands). ``YOSO_KERNELS=cpu`` builds only the CPU kernels
and ``YOSO_KERNELS=0`` skips building (the pure-PyTorch reference runs).

The library is cached in torch's extensions folder (``TORCH_EXTENSIONS_DIR``) under a name that
says which kernels it holds; torch rebuilds it when a source changes. Concurrent processes (DDP
ranks, a joblib sweep) are safe: torch's build takes a file lock in the build folder, the first
process builds and the others wait and load the result.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

SOURCES = Path(__file__).resolve().parent / "csrc"
LIBRARY_NAME = "yoso_kernels"


@dataclass
class BuildReport:
    cpu: bool = False  # the CPU kernels are registered as torch.ops.yoso.*
    cuda: bool = False  # the CUDA kernels are registered too
    library: str | None = None  # path of the loaded shared library
    error: str | None = None  # why the kernels are missing, if they are
    cuda_archs: str | None = None
    notes: list[str] = field(default_factory=list)


def cuda_toolkit() -> str | None:
    """The CUDA toolkit that would compile the kernels (CUDA_HOME, else nvcc's own folder), or None."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home is None and Path("/usr/local/cuda/bin/nvcc").exists():
        home = "/usr/local/cuda"
    if home is None and shutil.which("nvcc"):
        home = str(Path(shutil.which("nvcc")).resolve().parent.parent)  # a symlinked nvcc names the real toolkit
    if torch.version.cuda is None or home is None or not (Path(home) / "bin" / "nvcc").exists():
        return None
    return home


def build(verbose: bool = False) -> BuildReport:
    """Compile (or load from the cache) and register the kernels; never raises."""
    report = BuildReport()
    choice = os.environ.get("YOSO_KERNELS", "auto").lower()
    if choice in {"0", "off", "none", "reference"}:
        report.error = "disabled by YOSO_KERNELS=" + choice
        return report
    sources = [SOURCES / "yoso.cpp"]
    toolkit = None if choice == "cpu" else cuda_toolkit()
    if toolkit is not None:
        os.environ.setdefault("CUDA_HOME", toolkit)  # before torch's cpp_extension reads (and guesses) it
    cuda_sources = sorted((SOURCES / "cuda").glob("*.cu"))
    if choice == "cpu":
        report.notes.append("YOSO_KERNELS=cpu: CPU kernels only")
    elif toolkit is None:
        report.notes.append("no CUDA toolkit (nvcc under CUDA_HOME) or a CPU-only torch: CPU kernels only")
    elif not cuda_sources:
        toolkit = None
        report.notes.append("no CUDA sources in csrc/cuda: CPU kernels only")
    elif not torch.cuda.is_available() and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        toolkit = None  # nothing to run them on, and no architecture to compile for
        report.notes.append("no GPU visible: CPU kernels only (set TORCH_CUDA_ARCH_LIST to compile the CUDA ones anyway)")
    if toolkit is not None:
        sources += cuda_sources
        report.cuda_archs = os.environ.get("TORCH_CUDA_ARCH_LIST", "detected from the visible GPUs")
    from torch.utils import cpp_extension

    if toolkit is not None:
        cpp_extension.CUDA_HOME = toolkit  # it may have been imported (and guessed) before we set CUDA_HOME
    try:
        library = cpp_extension.load(
            name=LIBRARY_NAME + ("_cuda" if toolkit else "_cpu"),
            sources=[str(source) for source in sources],
            extra_cflags=["-O3"],
            extra_cuda_cflags=["-O3"],
            is_python_module=False,
            verbose=verbose,
        )
    except Exception as error:  # a missing compiler, a compile error: fall back to the reference
        report.error = f"{type(error).__name__}: {error}".strip()
        return report
    report.library = str(library) if library is not None else None
    report.cpu = True
    report.cuda = toolkit is not None
    return report
