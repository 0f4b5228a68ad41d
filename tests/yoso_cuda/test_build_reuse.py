"""Reusing a built library on the next machine: every build stamps its library with what it was built
for; `python -m yoso_cuda --export` and `--import` carry it, and the importing machine loads it
without compiling where the stamp matches, whatever the files' times say, and names what differs
where it does not. A damaged or hostile archive is one clear error that writes nothing."""

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import torch
from torch.utils import cpp_extension

from yoso_cuda import build, ops
from yoso_cuda.__main__ import main

CPU = build.LIBRARY_NAMES["cpu"]
ANOTHER_TORCH = "2.11.0+cu130"

# Run in a fresh process: a second copy of the library cannot register the yoso ops in this one.
LOAD_WITHOUT_COMPILING = """
import torch
from torch.utils import cpp_extension

def compile(*args, **kwargs):
    raise AssertionError("cpp_extension.load ran: the imported library was compiled again")

cpp_extension.load = compile
from yoso_cuda import ops

report = ops.kernels()
print(report.cpu.describe())
x = torch.nn.functional.normalize(torch.randn(2, 64, 16), dim=-1)
torch.manual_seed(0)
compiled = ops.hash_queries_and_keys(x, x, 4, 8, backend="compiled")
torch.manual_seed(0)
reference = ops.hash_queries_and_keys(x, x, 4, 8, backend="reference")
print("same codes:", all(torch.equal(a, b) for a, b in zip(compiled, reference)))
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """An extensions folder holding a copy of the CPU library this test run loaded and the stamp its build wrote."""
    report = ops.kernels()
    if not report.cpu.loaded:
        pytest.skip(f"the CPU kernels are not built here: {report.cpu.reason}")
    folder = tmp_path_factory.mktemp("built")
    shutil.copytree(Path(report.cpu.path).parent, folder / CPU, ignore=shutil.ignore_patterns("yoso_build.flock"))
    return folder


@pytest.fixture
def exported(built, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(built))
    archive = tmp_path / "kernels.tar.gz"
    build.export_build(archive)
    return archive


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty extensions folder, as on a bare machine, where the build looks from now on."""
    folder = tmp_path / "fresh"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(folder))
    monkeypatch.setenv("YOSO_KERNELS", "cpu")
    return folder


@pytest.fixture
def sources(tmp_path, monkeypatch):
    """A copy of the kernels' sources that the build reads instead of the checkout's, to change or touch."""
    copy = tmp_path / "csrc"
    shutil.copytree(build.SOURCES, copy)
    monkeypatch.setattr(build, "SOURCES", copy)
    return copy


def touch_newer(folder: Path, seconds: float = 3600) -> None:
    """Give every file under ``folder`` a modification time ``seconds`` from now, as a fresh checkout does."""
    later = time.time() + seconds
    for path in folder.rglob("*"):
        os.utime(path, (later, later))


def rewrite_archive(archive: Path, members: dict[str, bytes], symlink: str | None = None) -> Path:
    with tarfile.open(archive, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if symlink:
            info = tarfile.TarInfo(symlink)
            info.type, info.linkname = tarfile.SYMTYPE, "../../elsewhere"
            tar.addfile(info)
    return archive


def archive_members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive, "r:gz") as tar:
        return {member.name: tar.extractfile(member).read() for member in tar}


def with_stamp(archive: Path, **facts) -> dict[str, bytes]:
    members = archive_members(archive)
    stamp = json.loads(members[f"{CPU}.stamp.json"])
    members[f"{CPU}.stamp.json"] = json.dumps({**stamp, **facts}).encode()
    return members


def test_an_imported_build_loads_without_compiling(built, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(built))
    archive = tmp_path / "kernels.tar.gz"
    assert main(["--export", str(archive)]) == 0
    assert f"cpu library: exported (torch {torch.__version__}, Python " in capsys.readouterr().out
    assert sorted(archive_members(archive)) == [f"{CPU}.so", f"{CPU}.stamp.json"]

    fresh = tmp_path / "fresh"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(fresh))
    assert main(["--import", str(archive)]) == 0
    out = capsys.readouterr().out
    assert f"cpu library: imported into {fresh / CPU} (torch {torch.__version__}" in out
    assert "cuda library: not in kernels.tar.gz" in out
    left = {path.name for path in (fresh / CPU).iterdir()}
    assert left == {f"{CPU}.so", f"{CPU}.stamp.json", "yoso_build.flock"}, "the library and its stamp, no temporary file"

    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(fresh), "YOSO_KERNELS": "cpu"}
    process = subprocess.run([sys.executable, "-c", LOAD_WITHOUT_COMPILING], env=env, capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stderr[-3000:]
    assert f"cpu kernels: loaded ({fresh / CPU / CPU}.so)" in process.stdout, process.stdout
    assert "same codes: True" in process.stdout


@pytest.fixture
def no_compiling(monkeypatch):
    """``cpp_extension.load`` fails, recording each call; ``torch.ops.load_library`` records its paths
    without loading a second copy of the ops into this process."""
    calls = {"compiled": [], "loaded": []}

    def compile(*args, **kwargs):
        calls["compiled"].append(kwargs["name"])
        raise RuntimeError("compiling")

    monkeypatch.setattr(cpp_extension, "load", compile)
    monkeypatch.setattr(torch.ops, "load_library", calls["loaded"].append)
    return calls


def test_sources_newer_than_the_library_do_not_force_a_rebuild(exported, fresh, sources, no_compiling):
    build.import_build(exported)
    library = fresh / CPU / f"{CPU}.so"
    touch_newer(sources)
    assert not build.needs_compiling(library, build.library_sources("cpu"), build.current_stamp("cpu"))
    report = build.build()
    assert report.cpu.loaded and report.cpu.path == str(library), report.cpu.reason
    assert no_compiling == {"compiled": [], "loaded": [str(library)]}


def change_a_source(sources: Path, archive: Path) -> tuple[dict[str, bytes], str]:
    with open(sources / "yoso.cpp", "a") as source:
        source.write("// another version\n")
    return archive_members(archive), "built from another version of yoso.cpp"


def claim_another_torch(sources: Path, archive: Path) -> tuple[dict[str, bytes], str]:
    return with_stamp(archive, torch=ANOTHER_TORCH), f"built for torch {ANOTHER_TORCH}, this is {torch.__version__}"


@pytest.mark.parametrize("make_stale", [change_a_source, claim_another_torch])
def test_a_library_built_for_something_else_is_refused_and_rebuilt(make_stale, exported, fresh, sources, no_compiling, capsys):
    members, reason = make_stale(sources, exported)
    archive = rewrite_archive(exported, members)
    assert main(["--import", str(archive)]) == 0, "a mismatch is not an error"
    assert f"cpu library: {reason}: will be rebuilt\n" in capsys.readouterr().out
    assert not (fresh / CPU / f"{CPU}.so").exists()

    # The same library already in the build folder, newer than its sources and with its objects:
    # ninja would keep it; the stamp makes the build compile it from scratch.
    (fresh / CPU).mkdir(parents=True)
    for name, data in members.items():
        (fresh / CPU / name).write_bytes(data)
    (fresh / CPU / "yoso.o").write_bytes(b"an object of the other build")
    touch_newer(fresh, 7200)
    assert build.needs_compiling(fresh / CPU / f"{CPU}.so", build.library_sources("cpu"), build.current_stamp("cpu"))
    report = build.build()
    assert no_compiling == {"compiled": [CPU], "loaded": []}
    assert not report.cpu.loaded and "compiling" in report.cpu.reason
    assert not any((fresh / CPU).glob("*.o")) and not (fresh / CPU / f"{CPU}.stamp.json").exists()


def test_each_library_is_judged_on_its_own(exported, fresh, capsys):
    cuda = build.LIBRARY_NAMES["cuda"]
    stamp = {**build.current_stamp("cuda"), "torch": ANOTHER_TORCH}
    members = {**archive_members(exported), f"{cuda}.so": b"a CUDA library", f"{cuda}.stamp.json": json.dumps(stamp).encode()}
    assert main(["--import", str(rewrite_archive(exported, members))]) == 0
    out = capsys.readouterr().out
    assert f"cpu library: imported into {fresh / CPU}" in out
    assert f"cuda library: built for torch {ANOTHER_TORCH}, this is {torch.__version__}: will be rebuilt\n" in out
    assert not list(fresh.rglob(f"{cuda}*"))


def damaged_archives(archive: Path) -> dict[str, tuple[bytes, str]]:
    """Archives that must not be imported, and what the error says about each."""
    members = archive_members(archive)
    library, stamp = members[f"{CPU}.so"], members[f"{CPU}.stamp.json"]
    good = archive.read_bytes()

    def tar(**kwargs):
        return rewrite_archive(archive.with_name("hostile.tar.gz"), **kwargs).read_bytes()

    not_ours = "is not an archive of YOSO's built kernels: its member"
    return {
        "not gzip": (b"PK\x03\x04 a zip file", "cannot read"),
        "truncated": (good[: len(good) // 2], "cannot read"),
        "parent folder": (tar(members={f"../{CPU}.so": library, f"{CPU}.stamp.json": stamp}), f"{not_ours} '../{CPU}.so'"),
        "absolute path": (tar(members={f"/{CPU}.so": library, f"{CPU}.stamp.json": stamp}), f"{not_ours} '/{CPU}.so'"),
        "symlink": (tar(members={f"{CPU}.stamp.json": stamp}, symlink=f"{CPU}.so"), f"{not_ours} '{CPU}.so'"),
        "unknown file": (tar(members={**members, "run.sh": b"#!/bin/sh\n"}), f"{not_ours} 'run.sh'"),
        "no stamp": (tar(members={f"{CPU}.so": library}), f"is damaged: it lacks {CPU}'s library or a readable stamp"),
        "stamp not JSON": (tar(members={f"{CPU}.so": library, f"{CPU}.stamp.json": b"{"}), "is damaged"),
    }


def test_a_damaged_or_hostile_archive_is_one_clear_error_and_writes_nothing(exported, fresh, capsys):
    for case, (data, message) in damaged_archives(exported).items():
        archive = fresh.parent / "damaged.tar.gz"
        archive.write_bytes(data)
        with pytest.raises(build.BuildArchiveError, match="write it"):
            build.import_build(archive)
        assert main(["--import", str(archive)]) == 2, case
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and err.startswith("python -m yoso_cuda: error: "), (case, err)
        assert message in err, (case, err)
        assert not list(fresh.rglob("*.so")) and not list(fresh.parent.glob(f"*{CPU}*")), case


def test_exporting_with_nothing_built_is_one_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "empty"))
    archive = tmp_path / "kernels.tar.gz"
    assert main(["--export", str(archive)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("python -m yoso_cuda: error: no built YOSO kernels with a stamp under ")
    assert "build them first with `python -m yoso_cuda`" in err
    assert list(tmp_path.iterdir()) == [], "no archive, and looking for the libraries creates no folder"
