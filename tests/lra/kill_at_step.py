"""A Lightning callback that kills its own run with SIGKILL (no clean-up, as ``kill -9`` or a lost node) at a known
point: the start of the first training step after global step ``$KILL_AT_STEP``, so after that step's evaluation and
its checkpoints. Only where the variable is set, so the same command (its folder is named by its overrides) resumes
without it. A run adds it with ``+callbacks.kill._target_=kill_at_step.KillAtStep``, this folder on PYTHONPATH.
"""

import os
import signal
from pathlib import Path

from pytorch_lightning.callbacks import Callback

KILL_AT_STEP = "KILL_AT_STEP"
OVERRIDE = "+callbacks.kill._target_=kill_at_step.KillAtStep"


def environment(kill_at_step: int | None = None) -> dict[str, str]:
    """The variables a run with :data:`OVERRIDE` needs: this folder on PYTHONPATH and, where given, the step."""
    path = os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, **({KILL_AT_STEP: str(kill_at_step)} if kill_at_step is not None else {})}


class KillAtStep(Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        step = os.environ.get(KILL_AT_STEP)
        if step is not None and trainer.global_step == int(step):
            os.kill(os.getpid(), signal.SIGKILL)
