"""One process per run folder: the lock a run holds on its folder while it runs.

Two copies of one command (two shells, a scheduler requeueing a job whose first copy still runs,
overlapping sweeps) would otherwise train into the same folder, each appending to train.log and
metrics.csv and overwriting the other's results.json. A run takes an exclusive ``flock`` on
``<folder>/run.lock`` before it reads or writes anything there; a second process finds it held and
stops, naming the holder. The operating system drops the lock when its process ends, however it
ends (``kill -9``, a lost node's NFS lease), so a dead holder never blocks: the file's existence
means nothing, and it stays in the folder. The text in it (pid, host, start time) is there only to
name the holder in the message.

Only one process of a run takes the lock: a distributed run's other processes (Lightning's DDP
ranks, SLURM tasks) run the same command into the same folder as workers of the holder.
"""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from . import results

LOCK_FILE = "run.lock"
UNNAMED = "a process that has not yet written its name"  # the instant between taking the lock and writing the file
HELD: set[int] = set()  # the descriptors of the locks this process holds


def let_go_in_child() -> None:
    """In a process forked while a run holds its lock (a data loader's worker, a data generator's pool): close the
    inherited descriptor, which shares the lock and would keep the folder held after the run died."""
    for descriptor in HELD:
        os.close(descriptor)
    HELD.clear()


os.register_at_fork(after_in_child=let_go_in_child)


class RunFolderBusy(Exception):
    """The run folder cannot be taken: another live process holds it (the message names the folder and the holder),
    or its filesystem has no locks."""


def holder(folder: Path) -> str | None:
    """Who holds ``folder``'s lock ("pid N on HOST since TIME"), or None when no live process does. Takes the lock
    for an instant where it is free, so it also answers None while the folder is free but never used."""
    path = Path(folder) / LOCK_FILE
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return path.read_text().strip() or UNNAMED
        return None
    finally:
        os.close(descriptor)  # releases the shared lock, if taken


@contextmanager
def held(folder: Path) -> Iterator[None]:
    """Hold ``folder``'s lock for the block, or raise :class:`RunFolderBusy` at once, having written nothing, if a live
    process holds it. The folder is created if missing."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # No O_TRUNC: a process that finds the lock held must leave the holder's name in the file.
    descriptor = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            name = os.pread(descriptor, 4096, 0).decode(errors="replace").strip()
            raise RunFolderBusy(
                f"{folder} is in use by another run ({name or UNNAMED}); wait for it to end or stop it, then run it again"
            ) from None
        except OSError as error:  # a filesystem without locks (some network mounts): running unguarded could corrupt the run
            raise RunFolderBusy(
                f"{folder} cannot be locked ({error}); put the outputs (paths.output_dir) on a filesystem with flock"
            ) from None
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"pid {os.getpid()} on {socket.gethostname()} since {results.now()}\n".encode(), 0)
        HELD.add(descriptor)
        yield
    finally:
        HELD.discard(descriptor)
        os.close(descriptor)  # releases the lock
