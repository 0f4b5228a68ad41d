"""Run yoso_cuda's real CUDA kernels on the CPU: the project's test harness for a codebase whose CI has no GPU.

``build()`` rewrites ``csrc/cuda/yoso_cuda.cu`` mechanically (:mod:`.rewrite`), compiles it as C++
against the emulator's runtime (``runtime.h``, ``runtime.cpp``) and registers the kernels for CPU
tensors as ``torch.ops.<namespace>.*`` (default ``yoso_emu``), with the real ops' schemas. Each
CUDA thread runs as a fiber; ``__syncthreads`` and the warp collectives are scheduling points and
report divergence, mismatched masks, exited lanes and deadlocks; launches are checked against
sm_90's limits; fresh ``at::empty`` outputs and shared memory start as 0xFF bytes; CUB's radix
sort is a stable sort that rejects a too-small ``end_bit``. ``schedule()`` picks the order in which
blocks and threads run (forward, reverse, seeded random): the kernels use no atomics, so any
difference between schedules is a bug. ``sanitize=True`` builds with AddressSanitizer and
UndefinedBehaviorSanitizer (the process must preload their runtime: see :func:`sanitizer_preload`).

It cannot model the GPU's weak memory model, the real CUB, FMA contraction or the GPU's
transcendental-function rounding, register limits, or timing: it proves the kernels' logic, their
synchronisation and their memory accesses, not their speed.
"""

from __future__ import annotations

import contextlib
import hashlib
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from .rewrite import rewrite

HERE = Path(__file__).resolve().parent
CUDA_SOURCE = HERE.parent / "csrc" / "cuda" / "yoso_cuda.cu"
SCHEDULES = (("forward", 0), ("reverse", 0), ("random", 1))
SANITIZER_FLAGS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]


@dataclass(frozen=True)
class Emulator:
    namespace: str  # the ops are torch.ops.<namespace>.<op>
    library: str  # the compiled shared library
    rewrites: Counter  # how many times each rule of the rewrite applied
    op_names: tuple[str, ...]

    @property
    def ops(self):
        return getattr(torch.ops, self.namespace)

    @contextlib.contextmanager
    def schedule(self, order: str, seed: int = 0):
        """Run launches inside the block in this order of blocks and threads: forward, reverse or random."""
        self.ops.emulator_schedule(order, seed)
        try:
            yield
        finally:
            self.ops.emulator_schedule("forward", 0)

    def statistics(self) -> dict[str, int]:
        """Counters since the library loaded: ``launches`` of the source's kernels, ``sorts`` (CUB radix
        sorts, each several launches on a GPU), ``blocks``, ``threads``, ``switches``, ``barriers``,
        ``collectives`` and ``assertions`` (device-side assertions evaluated)."""
        names = ("launches", "blocks", "threads", "switches", "barriers", "collectives", "sorts", "assertions")
        return dict(zip(names, self.ops.emulator_statistics()))

    @contextlib.contextmanager
    def cuda_path(self):
        """Inside, yoso_cuda's Python glue treats CPU tensors as CUDA tensors: it takes the CUDA path
        (``ops.cuda_path``: randomness drawn on the device, no host synchronisation) and runs these
        emulated kernels as the compiled ops, so tests drive the CUDA path end to end without a GPU."""
        from .. import ops

        saved = {name: getattr(ops, name) for name in ("cuda_path", "compiled_ops", "has_kernel")}
        ops.cuda_path = lambda device: device.type in ("cpu", "cuda")
        ops.compiled_ops = lambda device: self.ops
        ops.has_kernel = lambda device: device.type in ("cpu", "cuda")
        try:
            yield self
        finally:
            for name, value in saved.items():
                setattr(ops, name, value)


def sanitizer_preload() -> str:
    """``LD_PRELOAD`` for a process running the sanitized build: libasan first, and libstdc++ so that
    ASan's ``__cxa_throw`` interceptor finds the real one (Python itself does not link libstdc++)."""
    libraries = ("libasan.so", "libstdc++.so.6")
    found = [
        subprocess.run(["c++", f"-print-file-name={name}"], capture_output=True, text=True, check=True).stdout.strip()
        for name in libraries
    ]
    return " ".join(str(Path(path).resolve()) for path in found)


def _asan_is_loaded() -> bool:
    return "libasan" in Path("/proc/self/maps").read_text()


def build(
    source: Path = CUDA_SOURCE,
    *,
    sanitize: bool = False,
    namespace: str | None = None,
    schemas: tuple[str, ...] | None = None,
    verbose: bool = False,
) -> Emulator:
    """Rewrite ``source``, compile it with the runtime (cached by torch's extension builder), load it.

    The ops take the schemas of yoso_cuda's ops of the same names, unless ``schemas`` gives them
    (``"name(Tensor x) -> Tensor"``, for sources that are not yoso_cuda's kernels). One build per source,
    sanitizer, namespace and schemas in a process, however the call spells them: its ops can be
    registered only once.
    """
    key = (Path(source).resolve(), sanitize, namespace, schemas)
    if key not in _BUILDS:
        _BUILDS[key] = _build(*key, verbose=verbose)
    return _BUILDS[key]


_BUILDS: dict[tuple, Emulator] = {}


def _build(source: Path, sanitize: bool, namespace: str | None, schemas: tuple[str, ...] | None, *, verbose: bool) -> Emulator:
    from torch.utils import cpp_extension

    from .. import ops as yoso_ops
    from ..build import build_lock, extension_directory

    if sanitize and not _asan_is_loaded():
        raise RuntimeError(
            "the sanitized emulator must run in a process that preloads AddressSanitizer's runtime: "
            f"LD_PRELOAD='{sanitizer_preload()}' ASAN_OPTIONS=detect_leaks=0 python ..."
        )
    if schemas is None:
        report = yoso_ops.kernels()  # the CPU library defines the schemas the emulated kernels implement
        if not report.cpu.loaded:
            raise RuntimeError(f"the emulator needs yoso_cuda's CPU library for the op schemas: {report.cpu.reason}")
    source = Path(source).resolve()
    tag = hashlib.sha256(str(source).encode()).hexdigest()[:8]
    namespace = namespace or ("yoso_emu_asan" if sanitize else "yoso_emu") + ("" if source == CUDA_SOURCE else f"_{tag}")
    text, rewrites, op_names = rewrite(source.read_text(), namespace, str(source))
    build_directory = extension_directory(namespace)
    rewritten = build_directory / "kernels.cpp"
    # -g1: the line tables the sanitizers' reports name lines with, without -g's variable information, which took a
    # quarter of the sanitized build's compile (41 s against 57 on the 2-core VM)
    flags = ["-O1", "-g1"] + SANITIZER_FLAGS if sanitize else ["-O2"]
    flags += [
        f"-I{HERE}",
        f"-I{source.parent}",
        f"-I{CUDA_SOURCE.parent}",
        f"-DEMU_NAMESPACE={namespace}",
        "-Wno-unknown-pragmas",
    ]
    with build_lock(build_directory):  # processes building the same emulator (parallel tests) take turns
        if not rewritten.exists() or rewritten.read_text() != text:  # an unchanged file keeps ninja's cache valid
            rewritten.write_text(text)
        library = cpp_extension.load(
            name=namespace,
            sources=[str(rewritten), str(HERE / "runtime.cpp")],
            extra_cflags=flags,
            extra_ldflags=SANITIZER_FLAGS if sanitize else [],
            build_directory=str(build_directory),
            is_python_module=False,
            verbose=verbose,
        )
    definitions = torch.library.Library(namespace, "FRAGMENT")
    if schemas is None:
        schemas = tuple(str(getattr(torch.ops.yoso, name).default._schema).split("::", 1)[1] for name in op_names)
    for schema in schemas:
        definitions.define(schema)
    _LIBRARIES.append(definitions)  # registrations last as long as their Library object
    return Emulator(namespace, str(library), rewrites, tuple(op_names))


_LIBRARIES: list[torch.library.Library] = []
