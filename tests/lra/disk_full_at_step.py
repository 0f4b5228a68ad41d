"""A Lightning callback that fills the disk at a known point: from the start of global step ``$DISK_FULL_AT_STEP``,
every file larger than ``$DISK_FULL_ABOVE_BYTES`` that is flushed to the disk (``os.fsync``) fails with ENOSPC, as a
disk with that much space left refuses a checkpoint while a small record still fits. Only where the variable is set.
A run adds it with ``+callbacks.disk_full._target_=disk_full_at_step.DiskFullAtStep``, this folder on PYTHONPATH.
"""

import errno
import os
from pathlib import Path

from pytorch_lightning.callbacks import Callback

DISK_FULL_AT_STEP = "DISK_FULL_AT_STEP"
DISK_FULL_ABOVE_BYTES = "DISK_FULL_ABOVE_BYTES"
OVERRIDE = "+callbacks.disk_full._target_=disk_full_at_step.DiskFullAtStep"


def environment(step: int | None = None, above_bytes: int = 0) -> dict[str, str]:
    """The variables a run with :data:`OVERRIDE` needs: this folder on PYTHONPATH and, where given, the step from which
    the disk is full, and the size of the files that still fit."""
    path = os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    full = {DISK_FULL_AT_STEP: str(step), DISK_FULL_ABOVE_BYTES: str(above_bytes)} if step is not None else {}
    return {"PYTHONPATH": path, **full}


class DiskFullAtStep(Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        step = os.environ.get(DISK_FULL_AT_STEP)
        if step is None or trainer.global_step != int(step) or getattr(os.fsync, "fills_the_disk", False):
            return
        room = int(os.environ[DISK_FULL_ABOVE_BYTES])
        fsync = os.fsync

        def full_disk_fsync(fd: int) -> None:
            if os.fstat(fd).st_size > room:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            fsync(fd)

        full_disk_fsync.fills_the_disk = True
        os.fsync = full_disk_fsync
