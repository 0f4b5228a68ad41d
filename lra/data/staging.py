"""Writing a folder whole or not at all (into a temporary sibling that is renamed into place), by one process at a time."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

log = logging.getLogger(__name__)


def lock_path(folder: Path) -> Path:
    """The lock file of ``folder``: a hidden sibling, so it outlives the folder being replaced."""
    folder = Path(folder)
    return folder.parent / f".{folder.name}.lock"


@contextmanager
def folder_lock(folder: Path, what: str = "") -> Iterator[None]:
    """Hold the exclusive lock of ``folder`` (shared data: generated files, a prepared cache) for the block.

    The lock is filelock's OS lock (``flock`` on :func:`lock_path`), so it is released when its process ends,
    however it ends: a killed writer never leaves a stale lock. A second process waits (one log line says for
    whom: the holder names itself in the lock file) until the first has finished writing, then checks and uses
    what it wrote. The lock file stays: deleting it would let a late process lock a file that a waiting one no
    longer sees.
    """
    path = lock_path(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    # preserve_lock_file keeps the file (above), and keeps filelock from falling back, where the filesystem has no
    # flock, to a lock file's mere existence, which a killed writer would leave behind.
    lock = FileLock(path, preserve_lock_file=True, on_acquired=_name_the_holder)
    try:
        lock.acquire(blocking=False)
    except Timeout:
        holder = path.read_text().strip() or "another process"
        log.info(f"Waiting for {holder} to finish writing {what or folder} (lock {path})")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _name_the_holder(descriptor: int) -> None:
    """Write ``process <pid>`` into the lock file just locked (``descriptor``), for the log line of a waiter."""
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, f"process {os.getpid()}\n".encode(), 0)


@contextmanager
def staged_folder(folder: Path, *, complete: Callable[[Path], bool], replace: bool = False) -> Iterator[Path]:
    """Yield a new temporary folder beside ``folder``; rename it to ``folder`` when the block ends without an error.

    An interrupted or failing writer never leaves a partial ``folder``: the temporary folder is removed
    whatever happens. Concurrent writers (a sweep's cells preparing the same data) each write their own
    copy; the first rename wins, and a writer that finds ``folder`` already there when it renames keeps
    the winner's if ``complete(folder)`` says it is whole, and raises the rename's error otherwise.
    ``replace`` deletes an existing ``folder`` (an outdated or corrupt one) just before the rename.
    """
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    try:
        yield staging
        if replace and folder.exists():
            shutil.rmtree(folder)
        try:
            os.rename(staging, folder)
        except OSError:
            if not complete(folder):  # not a lost race with a concurrent writer: a real failure
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
