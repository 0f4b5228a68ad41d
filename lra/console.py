"""What reaches the console of a run (the Hydra job logging of ``lra/conf/hydra/job_logging/lra.yaml``).

Lightning's informational messages (the model summary table, the GPU/TPU/HPU lines, "Detected
KeyboardInterrupt", "Received SIGTERM", checkpoint notes) go to the run's train.log only; its
warnings and errors, and every message of this project, reach the console too.
"""

from __future__ import annotations

import logging

LIBRARIES_KEPT_OFF_THE_CONSOLE = ("pytorch_lightning", "lightning_fabric", "lightning")


class ConsoleFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not record.name.startswith(LIBRARIES_KEPT_OFF_THE_CONSOLE)
