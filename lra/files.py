"""Files written whole: a reader, a kill or a full disk at any moment finds a file's previous version or its new one,
never a part (:func:`write_atomically`), and a full disk is one message (:class:`DiskFull`)."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path


class DiskFull(OSError):
    """A file could not be written for want of space: one message naming it, the space it needed and the space free."""

    def __init__(self, path: Path, size: int) -> None:
        free = shutil.disk_usage(path.parent).free
        super().__init__(
            errno.ENOSPC,
            f"no space left (a full disk or quota): writing {path} needed {size / 2**20:.1f} MB and "
            f"{free / 2**20:.1f} MB are free there; its previous version is intact. Free some space (or move the "
            "outputs: LRA_OUTPUT_DIR) and run the same command again: it resumes from the run's last.ckpt",
        )
        self.path = path

    def __str__(self) -> str:
        return self.strerror


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader, a kill or a full disk at any moment finds either its previous
    version whole or the new one: into a temporary file beside it (on the same filesystem, so that the rename is
    atomic; one under $TMPDIR would be copied over, and a copy can be cut short), flushed to the disk, renamed over
    it. A full disk is :class:`DiskFull`."""
    path = Path(path)
    staging = path.with_name(f".{path.name}.tmp")  # hidden: never taken for a checkpoint or a record
    try:
        with open(staging, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(staging, path)
    except OSError as error:
        staging.unlink(missing_ok=True)
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFull(path, len(data)) from error
        raise
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself, on the disk
    finally:
        os.close(folder)
