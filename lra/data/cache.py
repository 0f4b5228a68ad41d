"""The prepared-data cache: one folder of fixed-length token arrays per task and source.

A reader (:mod:`lra.data.formats`) turns the official files into arrays once; this module stores
them as ``.npy`` files that training memory-maps, with a ``manifest.json`` recording what was
prepared from what::

    <cache_dir>/<task>/<kind>-<key hash>/
        manifest.json              task, key (source kind + reader options), source folder and its
                                   fingerprint, splits with sample counts, per file its dtype, shape,
                                   size and SHA-256, and (``python -m lra.data download``) the archive
                                   the source was unpacked from: URL, size, checksums, how verified
        train.input_ids.npy        (num_samples, max_length) uint8/uint16 token ids, 0 = padding
        train.label.npy            (num_samples,) int64
        val.* test.*               (a split identical to another, IMDb's val = test, is stored once)

The folder is written under a temporary name and renamed into place, so an interrupted
preparation never leaves a half-written cache; runs that start at once take the folder's lock
(an OS lock beside it) in turn, so one prepares and the others find its cache and check it.
Preparing again is a no-op when the key, the source's fingerprint and every file's checksum
match; a changed source is prepared again, and a corrupt or partial cache is reported with the
file at fault and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .formats import SPLITS, Prepared
from .staging import folder_lock, staged_folder

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
#: In a source folder unpacked by ``python -m lra.data download``: the archive it came from (URL,
#: size, checksums, how it was verified). Part of the folder, so of its fingerprint too.
DOWNLOAD_RECORD = ".lra_download.json"


class CacheError(RuntimeError):
    """A prepared cache folder is missing files, truncated or does not match its manifest."""


def key_hash(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def cache_folder(cache_dir: Path, task: str, key: dict[str, Any]) -> Path:
    """Where the cache of ``task`` prepared with ``key`` (source kind, reader options) lives."""
    return Path(cache_dir) / task / f"{key['kind']}-{key_hash(key)}"


def source_fingerprint(source: Path) -> dict[str, Any]:
    """Names, sizes and modification times of every file under ``source``, hashed.

    Cheap enough to take on every run (a stat per file), and it changes when a file is added,
    removed, replaced or rewritten, which is when the cache must be prepared again.
    """
    digest = hashlib.sha256()
    num_files = total_bytes = 0
    for root, dirs, files in os.walk(source):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            stat = os.stat(path)
            digest.update(f"{os.path.relpath(path, source)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
            num_files += 1
            total_bytes += stat.st_size
    return {"sha256": digest.hexdigest(), "num_files": num_files, "num_bytes": total_bytes}


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_download_record(source: Path) -> dict[str, Any] | None:
    """The download record of a source folder (see :data:`DOWNLOAD_RECORD`), or None."""
    path = Path(source) / DOWNLOAD_RECORD
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise CacheError(f"{path} is not valid JSON ({error}): delete {source} and download it again") from None


def _save_array(folder: Path, file_name: str, array: np.ndarray) -> dict[str, Any]:
    path = folder / file_name
    np.save(path, np.ascontiguousarray(array))
    return {
        "file": file_name,
        "dtype": str(array.dtype),
        "shape": list(array.shape),
        "num_bytes": path.stat().st_size,
        "sha256": file_sha256(path),
    }


def write(
    folder: Path,
    task: str,
    key: dict[str, Any],
    prepared: Prepared,
    source: Path,
    fingerprint: dict[str, Any],
    download: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Store ``prepared`` as the cache ``folder`` (atomically) and return its manifest.

    ``download`` describes the archive ``source`` was unpacked from (:mod:`lra.data.download`).
    """
    # An outdated or corrupt cache is replaced; a concurrent preparation's complete one is as good as ours.
    with staged_folder(folder, complete=lambda done: (done / MANIFEST).is_file(), replace=True) as staging:
        splits: dict[str, Any] = {}
        written: dict[int, str] = {}  # id(Split) -> the split it was stored as
        for split_name, split in prepared.splits.items():
            if id(split) in written:
                splits[split_name] = {"same_as": written[id(split)], "num_samples": len(split)}
                continue
            written[id(split)] = split_name
            files = {name: _save_array(staging, f"{split_name}.{name}.npy", array) for name, array in split.arrays.items()}
            files["label"] = _save_array(staging, f"{split_name}.label.npy", split.labels.astype(np.int64))
            splits[split_name] = {"num_samples": len(split), "files": files}
        manifest = {
            "format_version": FORMAT_VERSION,
            "task": task,
            "key": key,
            "source": {"path": str(source), **fingerprint},
            "splits": splits,
            "notes": prepared.notes,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        if download is not None:
            manifest["download"] = download
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def read_manifest(folder: Path) -> dict[str, Any]:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise CacheError(f"{path} is missing: the cache folder {folder} is incomplete")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise CacheError(f"{path} is not valid JSON ({error}): the cache is corrupt") from None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CacheError(f"{path} has cache format {manifest.get('format_version')!r}, this version reads {FORMAT_VERSION}")
    return manifest


def stored_files(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    return [entry for split in manifest["splits"].values() for entry in split.get("files", {}).values()]


def verify(folder: Path, manifest: dict[str, Any], checksums: bool) -> None:
    """Raise :class:`CacheError` naming the first file that is missing, truncated or altered.

    Sizes are checked always (a stat per file); ``checksums`` also re-hashes the contents.
    """
    for entry in stored_files(manifest):
        path = Path(folder) / entry["file"]
        if not path.is_file():
            raise CacheError(f"{path} is missing from the cache (listed in its manifest)")
        size = path.stat().st_size
        if size != entry["num_bytes"]:
            raise CacheError(f"{path} has {size} bytes, its manifest says {entry['num_bytes']}: the file is truncated or altered")
        if checksums and file_sha256(path) != entry["sha256"]:
            raise CacheError(f"{path} does not match the SHA-256 in its manifest: the file is corrupt")


@dataclass
class CachedSplit:
    """One split's memory-mapped token arrays (``name -> (num, max_length)``) and labels."""

    arrays: dict[str, np.ndarray]
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)


def _open_array(folder: Path, entry: dict[str, Any]) -> np.ndarray:
    path = Path(folder) / entry["file"]
    try:
        array = np.load(path, mmap_mode="r")
    except (ValueError, OSError) as error:
        raise CacheError(f"{path} cannot be read as a .npy array ({error}): the cache is corrupt") from None
    if list(array.shape) != entry["shape"] or str(array.dtype) != entry["dtype"]:
        raise CacheError(f"{path} holds {array.dtype} {list(array.shape)}, its manifest says {entry['dtype']} {entry['shape']}")
    return array


def load(folder: Path) -> tuple[dict[str, CachedSplit], dict[str, Any]]:
    """Memory-map every split of a cache folder; return the splits and the manifest."""
    manifest = read_manifest(folder)
    verify(folder, manifest, checksums=False)
    splits: dict[str, CachedSplit] = {}
    for split_name in SPLITS:
        entry = manifest["splits"][split_name]
        if "same_as" in entry:
            splits[split_name] = splits[entry["same_as"]]
            continue
        files = {name: _open_array(folder, file_entry) for name, file_entry in entry["files"].items()}
        labels = np.asarray(files.pop("label"))
        splits[split_name] = CachedSplit(arrays=files, labels=labels)
    return splits, manifest


def prepare(
    folder: Path,
    task: str,
    key: dict[str, Any],
    source: Path,
    read: Callable[[], Prepared],
    *,
    force: bool = False,
) -> dict[str, Any]:
    """Make ``folder`` hold the cache of ``source`` read by ``read``; return its manifest.

    A no-op when the folder already holds this key prepared from an unchanged source and every
    file matches its checksum; otherwise (``force``, no cache, changed source, corrupt cache) the
    source is read again and the folder replaced. A source unpacked by ``python -m lra.data download``
    holds the record of its archive (:data:`DOWNLOAD_RECORD`), which the manifest copies.
    """
    # One process prepares, the others wait for it and then find its cache intact (an OS lock: see folder_lock).
    with folder_lock(folder, f"the {task} cache"):
        fingerprint = source_fingerprint(source)
        if not force and folder.exists():
            try:
                manifest = read_manifest(folder)
                verify(folder, manifest, checksums=True)
            except CacheError as error:
                log.info(f"Preparing {task} again: {error}")
            else:
                same_source = {k: manifest["source"].get(k) for k in fingerprint} == fingerprint
                if manifest["key"] == key and same_source:
                    return manifest
                log.info(f"Preparing {task} again: the files in {source} changed since {folder} was prepared")
        log.info(f"Preparing {task} from {source} into {folder}")
        start = time.perf_counter()
        manifest = write(folder, task, key, read(), source, fingerprint, read_download_record(source))
        sizes = ", ".join(f"{name} {entry['num_samples']}" for name, entry in manifest["splits"].items())
        log.info(f"Prepared {task} ({sizes}) in {time.perf_counter() - start:.1f} s")
        return manifest


def list_prepared(cache_dir: Path) -> list[tuple[Path, dict[str, Any] | None, str | None]]:
    """Every cache folder under ``cache_dir``: (folder, manifest or None, problem or None)."""
    found = []
    for manifest_dir in sorted(Path(cache_dir).glob("*/*")):
        if not manifest_dir.is_dir() or ".tmp-" in manifest_dir.name:
            continue
        try:
            found.append((manifest_dir, read_manifest(manifest_dir), None))
        except CacheError as error:
            found.append((manifest_dir, None, str(error)))
    return found
