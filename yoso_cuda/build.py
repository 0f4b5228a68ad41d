"""Just-in-time build of YOSO's two kernel libraries with ``torch.utils.cpp_extension.load`` and ninja.

* ``cpu``: ``csrc/yoso.cpp``, the ops' schemas (``TORCH_LIBRARY(yoso)``) and their CPU kernels, and
  ``csrc/softmax_dropout.cpp``, the softmax and Longformer baselines' fused dropout attention,
  ``csrc/sequence_conv.cpp``, YOSO-C's and Nystromformer's depthwise convolution of V, ``csrc/dropout.cpp``,
  the model's dropout with its residual sum, ``csrc/expectation.cpp``, YOSO-E's attention, and
  ``csrc/chunked_attention.cpp``, Reformer's chunked attention (all five CPU only). It is built wherever a C++
  compiler is found, first, since the CUDA library only adds kernels to it.
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

Libraries are cached in torch's extensions folder (``TORCH_EXTENSIONS_DIR``), each beside a stamp
(``<library>.stamp.json``) of what it was built for: torch and its CUDA version, the CUDA
architectures, the compiler (after the override below), Python's ABI, the compile flags and a hash
of every source and header. A library whose stamp matches this machine is loaded as it is, without
ninja, whatever the files' times say (a fresh checkout gives the sources newer times than a library
carried over from another machine). One whose stamp differs is rebuilt from scratch: ninja judges by
times and command lines, and misses a torch or compiler upgraded in place (torch's headers are
system headers to its dependency files). One without a stamp (built before stamps) goes through
ninja as before and is stamped. :func:`export_build` and :func:`import_build` (``python -m
yoso_cuda --export/--import FILE``) carry built libraries to the next machine, which takes only
those whose stamps match it.

Concurrent processes (DDP ranks, a joblib sweep) take an advisory lock (``filelock``'s, an OS
``flock``) on the library's build folder: the first builds, the others wait and load the result,
and the OS releases the lock of a process that dies. Older torch versions guard their build with a
``lock`` file whose mere existence blocks every later build forever; holding our lock, no other
build can be running, so such a file is a leftover of a killed build and is removed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from filelock import FileLock

log = logging.getLogger(__name__)
SOURCES = Path(__file__).resolve().parent / "csrc"
# A first build's time, for the message that says it is building: the CPU library took 17-40 s on the 2-core
# AMD EPYC VM and the CUDA library about 60 s on the 16-core host of an NVIDIA H100 (commit 5cc53d7, 2026-11-25);
# the CPU library took 49 s on a 2-core Intel Xeon VM busy with other jobs (`YOSO_KERNELS=require python -m
# yoso_cuda` after a change to csrc/checks.h, 2026-11-28).
BUILD_TIME = {"cpu": "about 20-40 s on 2 cores", "cuda": "about a minute"}
LIBRARY_NAMES = {"cpu": "yoso_kernels_cpu", "cuda": "yoso_kernels_cuda"}
HEADER_SUFFIXES = {".h", ".cuh", ".hpp"}
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


def extensions_root() -> Path:
    """The folder under which torch's extension builder keeps extensions: ``TORCH_EXTENSIONS_DIR``, else
    a folder per Python and torch build (``py311_cpu``, ``py311_cu130``) in its default build root, the
    folders ``cpp_extension.load`` itself picks, so libraries built before are found where they are."""
    from torch.utils import cpp_extension

    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(os.environ["TORCH_EXTENSIONS_DIR"])
    python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    accelerator = f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu"
    return Path(cpp_extension.get_default_build_root()) / f"{python}_{accelerator}"


def extension_directory(name: str) -> Path:
    """Where the extension ``name`` (a kernel library, an emulator build) is built and cached."""
    return extensions_root() / name


@contextmanager
def build_lock(build_directory: Path):
    """Hold the exclusive lock of the build folder, an OS ``flock`` released if this process dies."""
    build_directory.mkdir(parents=True, exist_ok=True)
    # preserve_lock_file: the file stays, and filelock never falls back to a lock file's mere existence (where the
    # filesystem has no flock), which a killed build would leave behind.
    with FileLock(build_directory / "yoso_build.flock", preserve_lock_file=True):
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


def library_sources(device: str) -> list[Path]:
    if device == "cpu":
        names = ("yoso.cpp", "softmax_dropout.cpp", "sequence_conv.cpp", "dropout.cpp", "expectation.cpp")
        names += ("chunked_attention.cpp",)
        return [SOURCES / name for name in names]
    return sorted((SOURCES / "cuda").glob("*.cu"))


def compile_flags(device: str) -> dict[str, list[str]]:
    """The extra flags ``cpp_extension.load`` gets for the ``device`` library, as its stamp records them."""
    openmp = _openmp_flags() if device == "cpu" else []
    return {"cflags": ["-O3", *openmp], "cuda_cflags": ["-O3"], "ldflags": openmp}


def _load(library: Library, verbose: bool) -> None:
    from torch.utils import cpp_extension

    name = LIBRARY_NAMES[library.device]
    build_directory = extension_directory(name)
    path = build_directory / f"{name}.so"
    sources, flags = library_sources(library.device), compile_flags(library.device)
    try:
        expected = current_stamp(library.device)
        if needs_compiling(path, sources, expected):
            log.info(
                "Building YOSO's %s kernels (once, until their sources change: %s)", library.device, BUILD_TIME[library.device]
            )
        with build_lock(build_directory):
            recorded = read_stamp(path)
            if recorded is not None and path.is_file() and stamp_mismatch(recorded, expected) is None:
                torch.ops.load_library(str(path))
            else:
                if recorded is not None:
                    # Built for something else: ninja would keep the objects whose inputs kept their times.
                    for output in [*build_directory.glob("*.o"), path, stamp_path(path)]:
                        output.unlink(missing_ok=True)
                path = Path(
                    cpp_extension.load(
                        name=name,
                        sources=[str(source) for source in sources],
                        extra_cflags=flags["cflags"],
                        extra_cuda_cflags=flags["cuda_cflags"],
                        extra_ldflags=flags["ldflags"],
                        build_directory=str(build_directory),
                        is_python_module=False,
                        verbose=verbose,
                    )
                )
                write_stamp(path, expected)
    except Exception as error:  # a missing compiler, a compile error: the report says why
        library.reason = f"{type(error).__name__}: {error}".strip()
        return
    library.loaded, library.path = True, str(path)
    library.unsafe = private_cpp_runtime(path)


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


def needs_compiling(library: Path, sources: list[Path], expected: dict | None = None) -> bool:
    """Whether loading ``library`` will compile it, so that a first use can say it is building instead
    of going silent: where it has a stamp, whether that differs from ``expected`` (this machine's,
    :func:`current_stamp`); without one, as ninja decides, whether a source or header is newer."""
    if not library.is_file():
        return True
    recorded = read_stamp(library)
    if recorded is not None and expected is not None:
        return stamp_mismatch(recorded, expected) is not None
    built = library.stat().st_mtime
    return any(path.stat().st_mtime > built for path in [*sources, *SOURCES.glob("*.h")])


# ---- stamps: what a library was built for, so that it is reused only where it is valid ---------------


@functools.cache
def _version_line(command: str) -> str:
    """The line of ``command --version`` that carries a version number (gcc and clang: the first; nvcc: its release)."""
    try:
        process = subprocess.run([*shlex.split(command), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as error:
        return f"no version: {error}"
    lines = [line.strip() for line in (process.stdout + process.stderr).splitlines() if line.strip()]
    return next((line for line in lines if re.search(r"\d+\.\d+", line)), lines[0] if lines else "no version")


def compiler_identity(device: str) -> str:
    """The compilers that build the ``device`` library here, as its stamp records them: ``CXX`` (as torch
    reads it, so after :func:`compiler_override`) resolved through symlinks, so that ``c++`` and
    ``/usr/bin/g++`` naming one g++ match while a wrapper script around it does not, with its version;
    for CUDA also nvcc's release and the host compiler ``CC`` where set (torch passes it as ``-ccbin``)."""
    words = shlex.split(os.environ.get("CXX", "c++")) or ["c++"]
    found = shutil.which(words[0])
    if found:
        words[0] = str(Path(found).resolve())
    identity = f"{shlex.join(words)} ({_version_line(shlex.join(words))})"
    if device == "cuda":
        toolkit = cuda_toolkit()
        identity += f", nvcc ({_version_line(str(Path(toolkit, 'bin', 'nvcc'))) if toolkit else 'not found'})"
        if os.environ.get("CC"):
            identity += f", host compiler {os.environ['CC']} ({_version_line(os.environ['CC'])})"
    return identity


def _stamped_archs(device: str) -> str | None:
    if device != "cuda" or torch.version.cuda is None:
        return None
    if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
        return "none (no GPU visible, no TORCH_CUDA_ARCH_LIST)"
    return _cuda_archs()


def current_stamp(device: str) -> dict:
    """What the ``device`` library built here now would be stamped with: what a built one must match to be reused."""
    headers = [path for path in SOURCES.rglob("*") if path.suffix in HEADER_SUFFIXES]
    return {
        "library": LIBRARY_NAMES[device],
        "torch": str(torch.__version__),
        "torch_cuda": torch.version.cuda,
        "python_abi": sysconfig.get_config_var("SOABI") or sys.implementation.cache_tag,
        "cuda_archs": _stamped_archs(device),
        "compiler": compiler_identity(device),
        "flags": compile_flags(device),
        "sources": {
            path.relative_to(SOURCES).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted({*library_sources(device), *headers})
        },
    }


# A stamp's facts in the order they are compared, and how a difference reads ("cuda library: <this>: will be rebuilt").
MISMATCHES = {
    "library": "its stamp is for {}, not {}",
    "torch": "built for torch {}, this is {}",
    "torch_cuda": "built for torch CUDA {}, this torch's is {}",
    "python_abi": "built for Python {}, this is {}",
    "cuda_archs": "built for CUDA archs {}, this machine's are {}",
    "compiler": "built with {}, this machine builds with {}",
    "flags": "built with the flags {}, these are {}",
}


def stamp_mismatch(recorded: dict, expected: dict) -> str | None:
    """The first fact in which a library's stamp ``recorded`` differs from ``expected`` (this machine's), worded
    for a person; None where they all match, and the library can be loaded as it is."""
    if set(recorded) != set(expected) or not isinstance(recorded["sources"], dict):
        return "its stamp is damaged or from another version of yoso_cuda"
    for key, wording in MISMATCHES.items():
        if recorded[key] != expected[key]:
            return wording.format(recorded[key], expected[key])
    old, new = recorded["sources"], expected["sources"]
    changed = sorted(name for name in {*old, *new} if old.get(name) != new.get(name))
    return f"built from another version of {', '.join(changed)}" if changed else None


def stamp_path(library: Path) -> Path:
    return library.with_suffix(".stamp.json")


def read_stamp(library: Path) -> dict | None:
    """The stamp beside ``library``; None where there is none; an empty one (which matches nothing) where it is unreadable."""
    try:
        recorded = json.loads(stamp_path(library).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


@contextmanager
def replaced_atomically(target: Path, mode: int = 0o644):
    """A file to write ``target``'s new content into; it replaces ``target`` by a rename once written whole,
    so that a reader, or a process killed midway, sees the old file or the new one, never a part."""
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            yield file
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_stamp(library: Path, stamp: dict) -> None:
    with replaced_atomically(stamp_path(library)) as file:
        file.write(json.dumps(stamp, indent=1).encode())


def _describe_stamp(stamp: dict) -> str:
    archs = f", CUDA archs {stamp['cuda_archs']}" if stamp.get("cuda_archs") else ""
    return f"torch {stamp.get('torch')}, Python {stamp.get('python_abi')}{archs}"


# ---- carrying built libraries to the next machine ------------------------------------------------


class BuildArchiveError(Exception):
    """An archive of built libraries that cannot be written or read; the message says why and what to do."""


def build_directory(device: str) -> Path:
    """Where :func:`build` builds and looks for the ``device`` library (under ``TORCH_EXTENSIONS_DIR``)."""
    return extension_directory(LIBRARY_NAMES[device])


def export_build(archive: Path) -> list[str]:
    """Write every built library with its stamp to ``archive`` (a .tar.gz, replaced atomically), for
    :func:`import_build` on another machine; returns a line per library saying what was written."""
    archive = Path(archive)
    lines, found = [], []
    for device, name in LIBRARY_NAMES.items():
        library = build_directory(device) / f"{name}.so"
        recorded = read_stamp(library) if library.is_file() else None
        if recorded:
            found.append((device, library))
            lines.append(f"{device} library: exported ({_describe_stamp(recorded)})")
        elif library.is_file():
            lines.append(f"{device} library: not exported, it has no stamp: run `python -m yoso_cuda` to stamp it")
    if not found:
        raise BuildArchiveError(
            f"no built YOSO kernels with a stamp under {build_directory('cpu').parent} to export: build them first with "
            "`python -m yoso_cuda` (with the same TORCH_EXTENSIONS_DIR)"
        )
    try:
        with replaced_atomically(archive) as file, tarfile.open(fileobj=file, mode="w:gz") as tar:
            for _, library in found:
                with build_lock(library.parent):  # not while a build rewrites it
                    tar.add(library, arcname=library.name)
                    tar.add(stamp_path(library), arcname=stamp_path(library).name)
    except OSError as error:
        raise BuildArchiveError(f"cannot write {archive}: {error}") from error
    return lines


def _read_archive(archive: Path) -> dict[str, bytes]:
    """The members of a kernels archive by name, after checking that each is one of the files
    :func:`export_build` writes (so no absolute path, ``..``, link or device), each once."""
    allowed = {f"{name}{suffix}" for name in LIBRARY_NAMES.values() for suffix in (".so", ".stamp.json")}
    contents = {}
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                if member.name not in allowed or not member.isfile() or member.name in contents:
                    raise BuildArchiveError(
                        f"{archive} is not an archive of YOSO's built kernels: its member {member.name!r} is not one "
                        f"regular file among {', '.join(sorted(allowed))}; write it with `python -m yoso_cuda --export`"
                    )
                contents[member.name] = tar.extractfile(member).read()
    except (OSError, EOFError, tarfile.TarError, zlib.error) as error:
        raise BuildArchiveError(
            f"cannot read {archive} as a .tar.gz ({error}): write it again with `python -m yoso_cuda --export`"
        ) from error
    return contents


def import_build(archive: Path) -> list[str]:
    """Put each library in ``archive`` (from :func:`export_build`) whose stamp matches this machine where
    :func:`build` looks for it, atomically, so that it is loaded without compiling; the others are left
    out, to be rebuilt. Returns a line per library: imported, or why not. A damaged or foreign archive
    raises :class:`BuildArchiveError` before anything is written."""
    archive = Path(archive)
    contents = _read_archive(archive)
    pairs = {}
    for device, name in LIBRARY_NAMES.items():
        library, stamp = contents.get(f"{name}.so"), contents.get(f"{name}.stamp.json")
        if library is None and stamp is None:
            continue
        try:
            recorded = json.loads(stamp) if library is not None and stamp is not None else None
        except ValueError:
            recorded = None
        if not isinstance(recorded, dict):
            raise BuildArchiveError(
                f"{archive} is damaged: it lacks {name}'s library or a readable stamp for it; write it again with --export"
            )
        pairs[device] = (library, stamp, recorded)
    lines = []
    overrides, _ = compiler_override()
    for device in LIBRARY_NAMES:
        if device not in pairs:
            lines.append(f"{device} library: not in {archive.name}: built here where wanted")
            continue
        library, stamp, recorded = pairs[device]
        with environment(overrides):
            mismatch = stamp_mismatch(recorded, current_stamp(device))
        if mismatch:
            lines.append(f"{device} library: {mismatch}: will be rebuilt")
            continue
        target = build_directory(device) / f"{LIBRARY_NAMES[device]}.so"
        with build_lock(target.parent):
            # Killed between the two writes, this leaves a library without a stamp, never one under another's stamp.
            stamp_path(target).unlink(missing_ok=True)
            with replaced_atomically(target, 0o755) as file:
                file.write(library)
            with replaced_atomically(stamp_path(target)) as file:
                file.write(stamp)
        lines.append(f"{device} library: imported into {target.parent} ({_describe_stamp(recorded)})")
    return lines


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
    if not library_sources("cuda"):
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
    _load(library, verbose)


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
        _load(report.cpu, verbose)
        _build_cuda(report, verbose)
    for library in report.libraries:
        if note and library.loaded:
            library.notes.append(note)
    if report.setting == "require" and (report.missing or report.unsafe):
        raise KernelBuildError(report)
    return report
