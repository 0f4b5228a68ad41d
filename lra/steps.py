"""What is due after a training step: a metrics row, an evaluation. Read by the module (when to check for divergence,
when to log) and the callbacks (when a requested stop may happen, when a window of timed steps ends)."""

from __future__ import annotations

import pytorch_lightning as pl


def metrics_row_due(trainer: pl.Trainer | None) -> bool:
    """Whether the training step under way writes a metrics row (every ``trainer.log_every_n_steps`` steps, and at a
    stop), where Lightning reads the logged values from the device; True without a Trainer."""
    return trainer is None or trainer._logger_connector.should_update_logs


def something_due_after(trainer: pl.Trainer) -> bool:
    """Whether the training batch just ended is followed by an evaluation (every ``val_check_interval``
    batches, counted over the run or, with ``check_val_every_n_epoch``, within the epoch; and at an
    epoch's end) or writes a metrics row (every ``log_every_n_steps`` steps). Where in doubt it says
    yes: that only delays a stop by a step."""
    loop = trainer.fit_loop.epoch_loop
    batches = loop.total_batch_idx + 1 if trainer.check_val_every_n_epoch is None else loop.batch_idx + 1
    every = trainer.val_check_batch
    evaluates = trainer.enable_validation and (
        loop.batch_progress.is_last_batch or (every != float("inf") and batches % every == 0)
    )
    return evaluates or trainer.global_step % trainer.log_every_n_steps == 0
