"""One process per run folder: the lock a run holds on its folder while it runs.

Two copies of one command (two shells, a scheduler requeueing a job whose first copy still runs,
overlapping sweeps) would otherwise train into the same folder, each appending to train.log and
metrics.csv and overwriting the other's results.json. A run takes an exclusive lock on
``<folder>/run.lock`` (:class:`filelock.FileLock`: ``flock`` on Unix) before it reads or writes anything
there; a second process finds it held and stops, naming the holder. The operating system drops the lock
when its process ends, however it ends (``kill -9``, a lost node's NFS lease), so a dead holder never
blocks: the file's existence means nothing, and it stays in the folder. The text in it (pid, host,
start time) is there only to name the holder in the message; filelock opens the file without emptying
it, so a process that finds the lock held leaves the holder's name in place.

A process forked while a run holds its lock (a data loader's worker, a data generator's pool) does not
keep the folder held after the run died: filelock closes the lock's descriptor in the child.

Only one process of a run takes the lock: a distributed run's other processes (Lightning's DDP
ranks, SLURM tasks) run the same command into the same folder as workers of the holder.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import filelock

from . import results

LOCK_FILE = "run.lock"
UNNAMED = "a process that has not yet written its name"  # the instant between taking the lock and writing the file


class RunFolderBusy(Exception):
    """The run folder cannot be taken: another live process holds it (the message names the folder and the holder),
    or its filesystem has no locks."""


def holder(folder: Path, lock_file: str = LOCK_FILE) -> str | None:
    """Who holds ``folder``'s lock ("pid N on HOST since TIME"), or None when no live process does. Takes the lock
    for an instant where it is free, so it also answers None while the folder is free but never used. ``lock_file``:
    another lock of the folder than the run's (a campaign's start, :mod:`lra.campaign`)."""
    path = Path(folder) / lock_file
    try:
        descriptor = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        if filelock.lock_descriptor(descriptor, blocking=False):
            return None  # free; closing the descriptor lets go of the lock just taken
        return os.pread(descriptor, 4096, 0).decode(errors="replace").strip() or UNNAMED
    finally:
        os.close(descriptor)


def write_holder_name(descriptor: int) -> None:
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, f"pid {os.getpid()} on {socket.gethostname()} since {results.now()}\n".encode(), 0)


@contextmanager
def held(folder: Path, lock_file: str = LOCK_FILE) -> Iterator[None]:
    """Hold ``folder``'s lock for the block, or raise :class:`RunFolderBusy` at once, having written nothing, if a live
    process holds it. The folder is created if missing. ``lock_file``: as for :func:`holder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # preserve_lock_file: the file stays, so a waiter never locks a name another process has just unlinked; it also
    # keeps filelock from falling back to a lock file's mere existence where the filesystem has no flock.
    lock = filelock.FileLock(folder / lock_file, blocking=False, preserve_lock_file=True, on_acquired=write_holder_name)
    try:
        lock.acquire()
    except filelock.Timeout:
        name = holder(folder, lock_file) or UNNAMED
        raise RunFolderBusy(
            f"{folder} is in use by another run ({name}); wait for it to end or stop it, then run it again"
        ) from None
    except OSError as error:  # a filesystem without locks (some network mounts): running unguarded could corrupt the run
        raise RunFolderBusy(
            f"{folder} cannot be locked ({error}); put the outputs (paths.output_dir) on a filesystem with flock"
        ) from None
    try:
        yield
    finally:
        lock.release()
