"""Just-in-time build of YOSO's two kernel libraries with ``torch.utils.cpp_extension.load`` and ninja.

* ``cpu``: ``csrc/yoso.cpp``, the ops' schemas (``TORCH_LIBRARY(yoso)``) and their CPU kernels, and
  ``csrc/softmax_dropout.cpp``, the softmax baseline's fused dropout attention (CPU only). It
  is built wherever a C++ compiler is found, first, since the CUDA library only adds kernels to it.
* ``cuda``: ``csrc/cuda/*.cu``, the CUDA kernels (``TORCH_LIBRARY_IMPL(yoso, CUDA)``), loaded after
  the CPU library. It is wanted when torch is a CUDA build and there is something to compile for:
  a visible GPU, or ``TORCH_CUDA_ARCH_LIST`` (e.g. ``9.0``; CI sets it to compile without a GPU, so a
  kernel that does not compile never lands). It needs a CUDA toolkit (``CUDA_HOME``, else
  ``/usr/local/cuda``, else ``nvcc`` on the PATH) whose major CUDA version is torch's; a mismatch is
  reported before compiling, with what to install or set.

A library that links its own copy of the C++ standard library (a compiler set up to link
``libstdc++`` statically, as some cluster toolchains are) loads and computes correctly, but its
iostreams' locale is not torch's: formatting a number into an error message (a bad argument, an
out-of-memory) crashed the process with a segmentation fault on an H100 machine whose ``CXX``
wrapper links this way, and cut the message short at its first number on this project's CPU
machine (``-static-libstdc++``). So before compiling, a ``CXX`` is probed (a one-function shared
library, well under a second): one that links ``libstdc++`` statically is replaced, for this build
only and with a note in the report, by the first system compiler that links it dynamically
(``/usr/bin/g++``, ``/usr/bin/c++``, ``/usr/bin/clang++``, ``g++`` or ``c++`` on the PATH), with its
C compiler as ``CC`` (nvcc's host compiler). Where none does, the library is built with ``CXX``,
reported as unsafe with the fix, and is an error under ``YOSO_KERNELS=require``.

A CUDA-side failure (no toolkit, a version mismatch, a compile error) never costs the CPU kernels:
each library is built and loaded on its own and the report says why one is missing.
``YOSO_KERNELS`` chooses what to build:

* ``auto`` (default): every wanted library; a missing one leaves its device on the reference;
* ``cpu``: the CPU library only;
* ``require``: as ``auto``, but a wanted library that fails to build is an error (CI, benchmarks);
* ``0`` / ``off`` / ``none`` / ``reference``: nothing is built, the pure-PyTorch reference runs.

Libraries are cached in torch's extensions folder (``TORCH_EXTENSIONS_DIR``); torch rebuilds one
when a source or a flag changes. Concurrent processes (DDP ranks, a joblib sweep) take an advisory
lock (``fcntl.flock``) on the library's build folder: the first builds, the others wait and load
the result, and the OS releases the lock of a process that dies. Older torch versions guard their
build with a ``lock`` file whose mere existence blocks every later build forever; holding our lock,
no other build can be running, so such a file is a leftover of a killed build and is removed.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

log = logging.getLogger(__name__)
SOURCES = Path(__file__).resolve().parent / "csrc"
# Measured: the CPU library in 17-40 s on the 2-core VM, the CUDA library in about 60 s on a 16-core H100 host.
BUILD_TIME = {"cpu": "about 20-40 s on 2 cores", "cuda": "about a minute"}
LIBRARY_NAMES = {"cpu": "yoso_kernels_cpu", "cuda": "yoso_kernels_cuda"}
SETTINGS = {"auto", "cpu", "require", "0", "off", "none", "reference"}
DISABLED = {"0", "off", "none", "reference"}


@dataclass
class Library:
    """What happened to one kernel library in this process."""

    device: str  # "cpu" or "cuda"
    wanted: bool = False  # it should exist here under the YOSO_KERNELS setting; not loading it is a failure
    loaded: bool = False  # its kernels are registered as torch.ops.yoso.*
    path: str | None = None  # the loaded shared library
    archs: str | None = None  # CUDA architectures it was compiled for
    reason: str | None = None  # why it is not loaded
    unsafe: str | None = None  # loaded, but why using it can crash the process
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        if self.loaded:
            archs = f", archs {self.archs}" if self.archs else ""
            unsafe = f"; UNSAFE: {self.unsafe}" if self.unsafe else ""
            return f"{self.device} kernels: loaded ({self.path}{archs}){unsafe}"
        status = "FAILED" if self.wanted else "not built"
        return f"{self.device} kernels: {status}: {self.reason}"


@dataclass
class BuildReport:
    setting: str  # the YOSO_KERNELS value
    cpu: Library = field(default_factory=lambda: Library("cpu"))
    cuda: Library = field(default_factory=lambda: Library("cuda"))

    @property
    def libraries(self) -> tuple[Library, Library]:
        return self.cpu, self.cuda

    @property
    def missing(self) -> list[Library]:
        """Wanted libraries that are not loaded."""
        return [library for library in self.libraries if library.wanted and not library.loaded]

    @property
    def unsafe(self) -> list[Library]:
        """Loaded libraries that crash the process when they raise an error."""
        return [library for library in self.libraries if library.loaded and library.unsafe]


class KernelBuildError(RuntimeError):
    """A wanted library failed under ``YOSO_KERNELS=require``; ``report`` says what was built."""

    def __init__(self, report: BuildReport) -> None:
        failures = [f"{library.device}: {library.reason}" for library in report.missing]
        failures += [f"{library.device}: {library.unsafe}" for library in report.unsafe]
        super().__init__(f"YOSO_KERNELS=require and YOSO's kernels failed to build: {'; '.join(failures)}")
        self.report = report


def kernel_setting() -> str:
    setting = os.environ.get("YOSO_KERNELS", "auto").strip().lower()
    if setting not in SETTINGS:
        raise ValueError(f"YOSO_KERNELS={setting!r} is not one of {', '.join(sorted(SETTINGS))}")
    return setting


def cuda_toolkit() -> str | None:
    """The CUDA toolkit that would compile the kernels (CUDA_HOME, /usr/local/cuda, nvcc's own folder), or None."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home is None and Path("/usr/local/cuda/bin/nvcc").exists():
        home = "/usr/local/cuda"
    if home is None and shutil.which("nvcc"):
        home = str(Path(shutil.which("nvcc")).resolve().parent.parent)  # a symlinked nvcc names the real toolkit
    if home is None or not (Path(home) / "bin" / "nvcc").exists():
        return None
    return home


class ToolkitMismatch(Exception):
    """The toolkit cannot build kernels for this torch; the message says what to install or set."""


def check_toolkit_version(toolkit: str) -> str | None:
    """Compare ``nvcc --version`` with ``torch.version.cuda``: raise on a different major version,
    return a note on a different minor version (torch itself only warns), else None."""
    nvcc = Path(toolkit) / "bin" / "nvcc"
    try:
        process = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ToolkitMismatch(f"{nvcc} --version could not run: {error}") from error
    found = re.search(r"release (\d+)\.(\d+)", process.stdout)
    if process.returncode != 0 or found is None:
        output = (process.stdout + process.stderr).strip()[-300:]
        raise ToolkitMismatch(f"{nvcc} --version failed (exit {process.returncode}) or printed no CUDA release: {output!r}")
    nvcc_major, nvcc_minor = found.groups()
    torch_cuda = torch.version.cuda
    torch_major = torch_cuda.split(".")[0]
    if nvcc_major != torch_major:
        raise ToolkitMismatch(
            f"{nvcc} is CUDA {nvcc_major}.{nvcc_minor} but torch {torch.__version__} was built for CUDA {torch_cuda}, "
            f"and the major versions must match. Either install a CUDA {torch_major}.x toolkit and set CUDA_HOME to it "
            f"(e.g. CUDA_HOME=/usr/local/cuda-{torch_cuda}), or install a torch built for CUDA {nvcc_major}.{nvcc_minor}: "
            f"pip install torch --index-url https://download.pytorch.org/whl/cu{nvcc_major}{nvcc_minor}"
        )
    if f"{nvcc_major}.{nvcc_minor}" != ".".join(torch_cuda.split(".")[:2]):
        return (
            f"nvcc is CUDA {nvcc_major}.{nvcc_minor}, torch was built for CUDA {torch_cuda}: same major version, so this is fine"
        )
    return None


@contextmanager
def build_lock(build_directory: Path):
    """Hold an exclusive ``flock`` on the build folder, released by the OS if this process dies."""
    build_directory.mkdir(parents=True, exist_ok=True)
    with open(build_directory / "yoso_build.flock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        # torch's own lock file: every build of this folder goes through our lock first, so no
        # build holds it now and a leftover is stale (older torch waits forever on one).
        (build_directory / "lock").unlink(missing_ok=True)
        yield


def _openmp_flags() -> list[str]:
    """``-fopenmp`` on Linux where torch's own threads are OpenMP's (its Linux wheels).

    ``at::parallel_for`` is a header template: compiled without OpenMP it silently runs its whole
    range on the calling thread (measured: 1.0x from 2 threads), so the kernels need the flag to use
    torch's intra-op threads. The library links against ``libgomp.so.1``, which resolves to the copy
    torch has already loaded, so there is one OpenMP runtime and one thread pool. Elsewhere (Apple's
    compiler has no ``-fopenmp``) the kernels build without it and run on one thread."""
    if not sys.platform.startswith("linux") or "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return []
    return ["-fopenmp"]


def _load(library: Library, sources: list[Path], verbose: bool, extra_flags: list[str] = ()) -> None:
    from torch.utils import cpp_extension

    name = LIBRARY_NAMES[library.device]
    build_directory = Path(cpp_extension._get_build_directory(name, verbose))
    if needs_compiling(build_directory / f"{name}.so", sources):
        log.info("Building YOSO's %s kernels (once, until their sources change: %s)", library.device, BUILD_TIME[library.device])
    try:
        with build_lock(build_directory):
            path = cpp_extension.load(
                name=name,
                sources=[str(source) for source in sources],
                extra_cflags=["-O3", *extra_flags],
                extra_cuda_cflags=["-O3"],
                extra_ldflags=list(extra_flags),
                build_directory=str(build_directory),
                is_python_module=False,
                verbose=verbose,
            )
    except Exception as error:  # a missing compiler, a compile error: the report says why
        library.reason = f"{type(error).__name__}: {error}".strip()
        return
    library.loaded, library.path = True, str(path)
    library.unsafe = private_cpp_runtime(Path(path))


def needed_libraries(path: Path) -> list[str] | None:
    """The shared libraries an ELF64 little-endian file depends on (its DT_NEEDED entries), or None
    for any other format (macOS's Mach-O)."""
    data = path.read_bytes()
    if data[:6] != b"\x7fELF\x02\x01":
        return None
    (section_offset,) = struct.unpack_from("<Q", data, 0x28)
    entry_size, count = struct.unpack_from("<HH", data, 0x3A)
    # (name, type, flags, addr, offset, size, link, info, addralign, entsize) per section
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, section_offset + i * entry_size) for i in range(count)]
    needed = []
    for section in sections:
        if section[1] != 6:  # SHT_DYNAMIC: (tag, value) pairs; its link is the string table
            continue
        strings = sections[section[6]][4]
        for offset in range(section[4], section[4] + section[5], 16):
            tag, value = struct.unpack_from("<qQ", data, offset)
            if tag == 0:  # DT_NULL ends the table
                break
            if tag == 1:  # DT_NEEDED: an offset into the string table
                end = data.index(b"\0", strings + value)
                needed.append(data[strings + value : end].decode())
    return needed


def carries_cpp_runtime(path: Path) -> bool | None:
    """Whether the shared library at ``path`` carries its own C++ standard library: it depends on
    neither the shared ``libstdc++`` nor ``libc++`` (which it would share with torch); None where it is
    not ELF."""
    needed = needed_libraries(path)
    return None if needed is None else not any(name.startswith(("libstdc++", "libc++")) for name in needed)


def private_cpp_runtime(path: Path) -> str | None:
    """Why the errors that the library at ``path`` raises are broken, or None.

    A library with its own static copy of the C++ standard library has iostreams that do not share
    torch's locale, so formatting a number into an error message (``TORCH_CHECK``) crashes or truncates it."""
    if not carries_cpp_runtime(path):
        return None
    if os.environ.get("CXX"):
        compiler = (
            f"the compiler {os.environ['CXX']} (from CXX) links libstdc++ statically, and none of the system compilers "
            f"tried ({', '.join(SYSTEM_COMPILERS)}) links it dynamically"
        )
    else:
        compiler = "the default compiler (c++, CXX is unset) links libstdc++ statically"
    return (
        f"it links its own static copy of the C++ standard library (no libstdc++.so among its dependencies), so its "
        f"errors crash the process or lose their message; {compiler}: set CXX to a compiler that links it "
        "dynamically and rebuild with `python -m yoso_cuda`"
    )


# Tried in order when CXX links libstdc++ statically; the distribution's compilers link it dynamically.
SYSTEM_COMPILERS = ("/usr/bin/g++", "/usr/bin/c++", "/usr/bin/clang++", "g++", "c++")
# The probe uses iostreams, what the library's error messages go through (TORCH_CHECK formats with them).
PROBE_SOURCE = """#include <sstream>
#include <string>
std::string probe(int x) { std::ostringstream s; s << x; return s.str(); }
"""


@functools.cache
def links_cpp_runtime_statically(compiler: str) -> bool | None:
    """Whether the shared libraries ``compiler`` (a command line, as ``CXX`` holds) builds carry their
    own copy of the C++ standard library; None where it cannot tell (it fails, or the platform's
    libraries are not ELF)."""
    with tempfile.TemporaryDirectory() as folder:
        source, library = Path(folder, "probe.cpp"), Path(folder, "probe.so")
        source.write_text(PROBE_SOURCE)
        try:
            subprocess.run(
                [*shlex.split(compiler), "-shared", "-fPIC", str(source), "-o", str(library)],
                capture_output=True,
                timeout=120,
                check=True,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return carries_cpp_runtime(library)


def c_compiler_beside(cxx: str) -> str | None:
    """The C compiler that goes with the C++ compiler at ``cxx`` (``g++-13`` -> ``gcc-13``), if it exists."""
    path = Path(cxx)
    for cpp, c in (("clang++", "clang"), ("g++", "gcc"), ("c++", "cc")):
        if cpp in path.name:
            sibling = path.with_name(path.name.replace(cpp, c, 1))
            return str(sibling) if sibling.is_file() else None
    return None


def compiler_override() -> tuple[dict[str, str], str | None]:
    """The ``CXX`` (and ``CC``) to build with in place of a ``CXX`` that links libstdc++ statically, and
    the note saying so; nothing when ``CXX`` is unset or safe, or when no system compiler is."""
    configured = os.environ.get("CXX")
    if not configured or not links_cpp_runtime_statically(configured):
        return {}, None
    for candidate in SYSTEM_COMPILERS:
        found = shutil.which(candidate)
        if found and links_cpp_runtime_statically(found) is False:
            environment = {"CXX": found}
            cc = c_compiler_beside(found)
            if cc:
                environment["CC"] = cc
            note = (
                f"CXX={configured} links libstdc++ statically (the kernels' errors would crash the process), so they "
                f"were built with {' '.join(f'{k}={v}' for k, v in environment.items())}; set CXX to another compiler "
                "that links libstdc++ dynamically to choose it"
            )
            return environment, note
    return {}, None


@contextmanager
def environment(overrides: dict[str, str]):
    """``os.environ`` with ``overrides`` (torch's extension builder reads ``CXX`` and ``CC`` from it) while inside."""
    saved = {key: os.environ.get(key) for key in overrides}
    os.environ.update(overrides)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def needs_compiling(library: Path, sources: list[Path]) -> bool:
    """Whether ``library`` is missing or older than a source or header it is built from (what makes
    ninja compile), so that a first use can say it is building instead of going silent."""
    if not library.is_file():
        return True
    built = library.stat().st_mtime
    return any(path.stat().st_mtime > built for path in [*sources, *SOURCES.glob("*.h")])


def _cuda_archs() -> str:
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return os.environ["TORCH_CUDA_ARCH_LIST"]
    capabilities = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    return ";".join(f"{major}.{minor}" for major, minor in capabilities) + " (the visible GPUs)"


def _build_cuda(report: BuildReport, verbose: bool) -> None:
    library = report.cuda
    if report.setting == "cpu":
        library.reason = "YOSO_KERNELS=cpu"
        return
    if torch.version.cuda is None:
        library.reason = f"torch {torch.__version__} is not a CUDA build"
        return
    if not torch.cuda.is_available() and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        library.reason = "no GPU visible (set TORCH_CUDA_ARCH_LIST, e.g. 9.0, to compile the CUDA kernels anyway)"
        return
    library.wanted = True
    if not report.cpu.loaded:
        library.reason = "the CPU library, which defines the ops, did not build"
        return
    toolkit = cuda_toolkit()
    if toolkit is None:
        library.reason = (
            f"no CUDA toolkit (no bin/nvcc under CUDA_HOME, /usr/local/cuda or on the PATH): install CUDA "
            f"{torch.version.cuda.split('.')[0]}.x (torch's is {torch.version.cuda}) and set CUDA_HOME to it"
        )
        return
    sources = sorted((SOURCES / "cuda").glob("*.cu"))
    if not sources:
        library.reason = f"no CUDA sources in {SOURCES / 'cuda'}"
        return
    try:
        note = check_toolkit_version(toolkit)
    except ToolkitMismatch as mismatch:
        library.reason = str(mismatch)
        return
    if note:
        library.notes.append(note)
    if not torch.cuda.is_available():
        library.notes.append("no GPU visible: compiled for TORCH_CUDA_ARCH_LIST, nothing here runs them")
    os.environ.setdefault("CUDA_HOME", toolkit)
    from torch.utils import cpp_extension

    cpp_extension.CUDA_HOME = toolkit  # it may have been imported (and guessed) before CUDA_HOME was set
    library.archs = _cuda_archs()
    _load(library, sources, verbose)


def build(verbose: bool = False) -> BuildReport:
    """Compile (or load from the cache) and register the kernel libraries that ``YOSO_KERNELS`` asks for.

    Returns what happened to each library; raises :class:`KernelBuildError` only under
    ``YOSO_KERNELS=require`` when a wanted library is missing.
    """
    report = BuildReport(kernel_setting())
    if report.setting in DISABLED:
        report.cpu.reason = report.cuda.reason = f"disabled by YOSO_KERNELS={report.setting}"
        return report
    report.cpu.wanted = True
    overrides, note = compiler_override()
    with environment(overrides):
        _load(report.cpu, [SOURCES / "yoso.cpp", SOURCES / "softmax_dropout.cpp"], verbose, _openmp_flags())
        _build_cuda(report, verbose)
    for library in report.libraries:
        if note and library.loaded:
            library.notes.append(note)
    if report.setting == "require" and (report.missing or report.unsafe):
        raise KernelBuildError(report)
    return report
