"""What a data folder held when it was written, and whether it still does.

A generator records its files in ``generator.json`` (``"files"``) and ``python -m lra.data download`` in the
unpacked folder's download record; before the files are used they are checked against that record::

    "files": {
      "basic_train.tsv": {"num_bytes": 1234567, "sha256": "...", "num_samples": 96000},
      "imgs/0/":         {"num_files": 1000, "num_bytes": 312345, "sha256": "..."}
    }

A file is recorded on its own; a folder holding more than :data:`FILES_PER_ENTRY` files (Pathfinder's
``imgs/<k>``, IMDb's ``train/pos``) is recorded as one entry, named with a trailing ``/``, whose SHA-256 runs over
its files' names and contents in name order, so a record stays small whatever the number of files. Files the
record does not list are ignored (the record itself, notes a user left); a listed file or folder that is missing,
of another size or file count, or of other contents is a difference, named with what differed.

Checking first compares sizes and file counts (a stat per file), then hashes: a truncated file is found without
reading anything. Hashing reads every byte once; see README ("Generated data") for what that costs.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

#: A folder with more files than this is one entry of the record.
FILES_PER_ENTRY = 100
CHUNK_BYTES = 1 << 24


class DamagedData(RuntimeError):
    """A data folder's files no longer match what was recorded when they were written."""


def _sha256_file(path: str, digest: Any | None = None) -> Any:
    digest = digest or hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest


def _entries(folder: Path) -> dict[str, list[str]]:
    """Each entry's name and its files (absolute paths, in name order): a file is its own entry, a large folder one."""
    entries: dict[str, list[str]] = {}
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        relative = os.path.relpath(root, folder)
        paths = [os.path.join(root, name) for name in sorted(files)]
        if len(files) > FILES_PER_ENTRY:
            entries[f"{Path(relative).as_posix()}/"] = paths
        else:
            for path in paths:
                entries[Path(os.path.relpath(path, folder)).as_posix()] = [path]
    return entries


def _folder_digest(paths: list[str]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(f"{os.path.basename(path)}\0{os.path.getsize(path)}\0".encode())
        _sha256_file(path, digest)
    return digest.hexdigest()


def describe(folder: Path, *, counts: dict[str, int] | None = None, skip: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """The record of every file under ``folder`` except the names in ``skip`` (the record's own file).

    ``counts`` adds ``num_samples`` to the entries it names (a split file's samples), for people reading the record.
    """
    record: dict[str, dict[str, Any]] = {}
    for name, paths in _entries(Path(folder)).items():
        if name in skip:
            continue
        if name.endswith("/"):
            size = sum(os.path.getsize(path) for path in paths)
            record[name] = {"num_files": len(paths), "num_bytes": size, "sha256": _folder_digest(paths)}
        else:
            record[name] = {"num_bytes": os.path.getsize(paths[0]), "sha256": _sha256_file(paths[0]).hexdigest()}
        if counts and name in counts:
            record[name]["num_samples"] = counts[name]
    return record


def _what(entry: dict[str, Any]) -> str:
    samples = f", {entry['num_samples']} samples" if "num_samples" in entry else ""
    files = f"{entry['num_files']} files, " if "num_files" in entry else ""
    return f"{files}{entry['num_bytes']} bytes{samples}"


def difference(folder: Path, record: dict[str, dict[str, Any]], recorded_in: str) -> str | None:
    """The first way ``folder`` differs from ``record`` (written to ``recorded_in``), or None when it matches."""
    folder = Path(folder)
    for name, entry in record.items():  # sizes and counts first: a stat per file
        path = folder / name
        if name.endswith("/"):
            if not path.is_dir():
                return f"{name} is missing ({recorded_in} records {_what(entry)})"
            files = [child for child in path.iterdir() if child.is_file()]
            size = sum(child.stat().st_size for child in files)
            if (len(files), size) != (entry["num_files"], entry["num_bytes"]):
                return f"{name} holds {len(files)} files, {size} bytes ({recorded_in} records {_what(entry)})"
        elif not path.is_file():
            return f"{name} is missing ({recorded_in} records {_what(entry)})"
        elif path.stat().st_size != entry["num_bytes"]:
            return f"{name} has {path.stat().st_size} bytes ({recorded_in} records {_what(entry)})"
    for name, entry in record.items():
        path = folder / name
        if name.endswith("/"):
            actual = _folder_digest(sorted(str(child) for child in path.iterdir() if child.is_file()))
        else:
            actual = _sha256_file(str(path)).hexdigest()
        if actual != entry["sha256"]:
            recorded = entry["sha256"]
            return f"{name} has other contents than {recorded_in} records (SHA-256 {actual[:12]}..., recorded {recorded[:12]}...)"
    return None
