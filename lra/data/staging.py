"""Writing a folder whole or not at all: into a temporary sibling that is renamed into place."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


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
