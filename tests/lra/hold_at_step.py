"""A Lightning callback that holds its run at a known step until it is told to stop: at the start of global step
``$HOLD_AT_STEP`` it waits (up to ten minutes) until the run's ``CheckpointOnInterrupt`` has a stop requested (a
SIGTERM or Ctrl+C), then lets the step run, so the run stops at a step that does not depend on the machine's speed.
Only where the variable is set, so the same command resumes without it. A run adds it with
``+callbacks.hold._target_=hold_at_step.HoldAtStep``, this folder on PYTHONPATH (callbacks are not part of a run's
configuration hash, so the held run and one without it are the same cell).
"""

import os
import time
from pathlib import Path

from pytorch_lightning.callbacks import Callback

from lra.callbacks import CheckpointOnInterrupt

HOLD_AT_STEP = "HOLD_AT_STEP"
OVERRIDE = "+callbacks.hold._target_=hold_at_step.HoldAtStep"


def environment(hold_at_step: int | None = None) -> dict[str, str]:
    """The variables a run with :data:`OVERRIDE` needs: this folder on PYTHONPATH and, where given, the step."""
    path = os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, **({HOLD_AT_STEP: str(hold_at_step)} if hold_at_step is not None else {})}


class HoldAtStep(Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        step = os.environ.get(HOLD_AT_STEP)
        if step is None or trainer.global_step != int(step):
            return
        interrupt = next(c for c in trainer.callbacks if isinstance(c, CheckpointOnInterrupt))
        give_up = time.monotonic() + 600
        while not interrupt.stop_requested and time.monotonic() < give_up:
            time.sleep(0.05)
