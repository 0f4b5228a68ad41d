"""The official mlpen/YOSO kernels beside ours: ``python -m lra.bench kernels --official-yoso PATH``.

PATH is a checkout of https://github.com/mlpen/YOSO made beforehand, outside this project (a ``git archive`` of it
carried to the GPU machine in an ignored folder; nothing of it is copied or committed). Their attention is imported
from PATH and called as their LRA model calls it (``encoders/backbones/efficient_attention.py``): Q, K, V of shape
(batch, heads, n, d) cast to float32 with autocast off, a float mask of ones, their module in training mode (so it
l2-normalises Q and K, as ours does). The row ``yoso_32/official`` is their yoso_v2 (``YOSOAttention``: the fast
Hadamard hash, the counting-sort cumulations, the lower-bound backward as weighted LSH cumulations; the code path
of their ``LRA/models/yoso-v2-16`` config) with 32 hashes (``num_hash_f``) and tau = ceil(log2 n) bits
(``hashcode_len``), as our ``yoso_32`` row; ``--official-yoso-version v1`` adds ``yoso_32/official-v1``, their
yoso_v1 as their ``LRA/models/yoso-v1-32`` config runs it (32 hashes, ``use_fast_hash``, ``n2_backward: false``).

Their kernel.py files build their CUDA extensions at import with ``torch.utils.cpp_extension.load(name, sources)``
and then ``import name``, which torch 1.x allowed (``load`` registered the module); current torch does not, so the
import here wraps ``load`` to register what it returns, and undoes that, their ``sys.path`` entries and their
modules (``kernel``, ...) afterwards. Their kernels are CUDA-only and float32-only; every failure (their build,
their asserts, a shape they refuse) becomes the row's error.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.utils.cpp_extension

YOSO_DIR = Path("encoders/backbones/efficient_attentions/yoso")
DEVICES = ("cuda",)  # their kernels' devices (tests widen it to run a pure-PyTorch stand-in on the CPU)
NUM_HASHES = 32  # as our yoso_32 row


@dataclass(frozen=True)
class Version:
    method: str  # the CSV's method
    folder: str  # under YOSO_DIR
    config: object  # (tau) -> their YOSOAttention's config
    needs: tuple[str, ...]  # names their kernel module must define once its extensions are built


VERSIONS = {
    "v2": Version(
        "yoso_32/official",
        "yoso_v2",
        lambda tau: {"hashcode_len": tau, "num_hash_f": NUM_HASHES, "num_head": 2},
        ("generate_Dmat", "fast_hash", "lsh_cumulation_query", "count_sort", "weighted_lsh_cumulation_sorted_key"),
    ),
    "v1": Version(
        "yoso_32/official-v1",
        "yoso_v1",
        lambda tau: {"hash_code_len": tau, "num_hash": NUM_HASHES, "use_fast_hash": True, "n2_backward": False, "num_head": 2},
        ("LSHCumulation", "lsh_cumulation"),
    ),
}


class OfficialYOSOError(RuntimeError):
    """Their code could not be imported, built or run: the row's error."""


def cpp_extension_load(*args, **kwargs):
    """``torch.utils.cpp_extension.load`` as their kernel.py calls it (a seam: the tests put a stand-in here)."""
    return REAL_LOAD(*args, **kwargs)


REAL_LOAD = torch.utils.cpp_extension.load


def checkout_commit(path: Path, given: str | None) -> str:
    """``given``, else the commit of the git checkout at ``path`` (its top level, not a repository around it)."""
    if given:
        return given
    try:
        top = subprocess.run(["git", "-C", str(path), "rev-parse", "--show-toplevel", "HEAD"], capture_output=True, text=True)
    except OSError:
        top = None
    lines = top.stdout.split() if top is not None and top.returncode == 0 else []
    if len(lines) == 2 and Path(lines[0]).resolve() == path.resolve():
        return lines[1]
    raise OfficialYOSOError(
        f"{path} is not a git checkout of its own (e.g. a `git archive` of mlpen/YOSO): "
        "give its commit with --official-yoso-commit"
    )


def check_checkout(path: Path, versions: list[str]) -> None:
    """A clear error for a path that is not a checkout of mlpen/YOSO."""
    for name in versions:
        yoso = path / YOSO_DIR / VERSIONS[name].folder / "yoso.py"
        if not yoso.is_file():
            raise OfficialYOSOError(f"{path} is not a checkout of mlpen/YOSO: {yoso} is missing")


@contextlib.contextmanager
def scoped_import(folder: Path, errors: list[str]):
    """Their imports inside: ``folder`` first on sys.path, ``load`` registering what it builds; all undone after."""
    saved_path, saved_modules = list(sys.path), dict(sys.modules)
    registered: list[str] = []

    def load(name, *args, **kwargs):
        try:
            module = cpp_extension_load(name, *args, **kwargs)
        except Exception as error:  # their build: kept, as their kernel.py may swallow it
            errors.append(f"building their extension {name}: {type(error).__name__}: {str(error).splitlines()[0][:160]}")
            raise
        sys.modules[name] = module  # what torch 1.x's load did, and their `import name` expects
        registered.append(name)
        return module

    sys.path.insert(0, str(folder))
    torch.utils.cpp_extension.load = load
    try:
        yield
    finally:
        torch.utils.cpp_extension.load = REAL_LOAD
        sys.path[:] = saved_path
        checkout = folder.resolve().parents[len(YOSO_DIR.parts)]
        for name in set(sys.modules) - set(saved_modules):  # theirs (`kernel`, ...) and their extensions
            source = getattr(sys.modules[name], "__file__", None)
            if name in registered or (source and Path(source).resolve().is_relative_to(checkout)):
                del sys.modules[name]
        sys.modules.update(saved_modules)


def import_their_yoso(checkout: Path, version: str):
    """Their ``yoso.py`` module of ``version``, its CUDA extensions built the way their kernel.py builds them."""
    spec_version = VERSIONS[version]
    folder = checkout / YOSO_DIR / spec_version.folder
    errors: list[str] = []
    with scoped_import(folder, errors):
        try:
            spec = importlib.util.spec_from_file_location(f"official_yoso_{version}", folder / "yoso.py")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except Exception as error:
            raise OfficialYOSOError(
                errors[0] if errors else f"importing their {version}: {type(error).__name__}: {error}"
            ) from error
    missing = [name for name in spec_version.needs if not hasattr(module.kernel, name)]
    if missing:  # their yoso_v2/kernel.py prints a failed import and goes on
        raise OfficialYOSOError(errors[0] if errors else f"their {version} kernel module lacks {', '.join(missing)}")
    return module


@dataclass
class Official:
    """mlpen/YOSO's attention from one checkout, imported (and built) once per version."""

    checkout: Path
    commit: str
    versions: list[str] = field(default_factory=lambda: ["v2"])
    _modules: dict = field(default_factory=dict)

    @property
    def methods(self) -> dict[str, str]:
        return {VERSIONS[name].method: name for name in self.versions}

    def module(self, version: str):
        """Their yoso.py module, or the error of the first try again (a failed build is not retried per row)."""
        if version not in self._modules:
            try:
                self._modules[version] = import_their_yoso(self.checkout, version)
            except OfficialYOSOError as error:
                self._modules[version] = error
        found = self._modules[version]
        if isinstance(found, Exception):
            raise found
        return found

    def call(self, method: str, length: int, head_dim: int, dtype: torch.dtype, device: torch.device, backward: bool):
        """A closure running their attention (and its backward) on fresh random q, k, v, as kernels.attention_call."""
        if device.type not in DEVICES:
            raise OfficialYOSOError(f"mlpen/YOSO's kernels are CUDA-only, not for {device.type}")
        version = self.methods[method]
        tau = max(1, math.ceil(math.log2(length)))  # our yoso_32's hash_bits=None rule
        attention = self.module(version).YOSOAttention(VERSIONS[version].config(tau)).to(device).train()
        q, k, v = (torch.randn(1, 2, length, head_dim, device=device, dtype=dtype, requires_grad=backward) for _ in range(3))
        mask = torch.ones(1, length, device=device, dtype=dtype)

        def run():
            try:
                with torch.autocast(device.type, enabled=False):  # their efficient_attention.py's call
                    out = attention(q.float(), k.float(), v.float(), mask.float())
                if backward:
                    out.backward(torch.ones_like(out))
            except RuntimeError:
                raise
            except Exception as error:  # their asserts and the like: the row's error, as a RuntimeError
                raise OfficialYOSOError(f"their {version}: {type(error).__name__}: {error}") from error

        return run
