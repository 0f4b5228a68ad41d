"""Lightning callbacks of ``python -m lra.train`` (``conf/callbacks``) that are this harness's own."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback, TQDMProgressBar
from pytorch_lightning.trainer.states import TrainerFn


class TrainingSpeed(Callback):
    """Training steps per second of this process, in the progress bar (``train/steps_per_s``) and in ``results.json``.

    The time counted is that of the training batches: from the end of one training batch to the end of the next,
    so each step's batch loading counts, or from the batch's start where the previous batch is not the one just
    before (the first batch of the process, of an epoch, the first after an evaluation), so validation, testing,
    the evaluation's checkpoint and the start-up never do. On a GPU each batch's end waits for the device
    (``synchronize``), so that the rate is the device's, not the rate at which work is queued. Only this process's
    steps count: after a resume the rate is that of the resumed part, never mixed with the interrupted one's.
    """

    def __init__(self) -> None:
        self.steps = 0
        self.seconds = 0.0
        self._since: float | None = None  # where the current batch's time starts
        self._previous_end: float | None = None  # the end of the training batch just before, if nothing came between

    @property
    def steps_per_second(self) -> float | None:
        """The rate so far; None before the first timed step."""
        return self.steps / self.seconds if self.seconds > 0 else None

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        self._since = self._previous_end if self._previous_end is not None else time.perf_counter()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        end = time.perf_counter()
        if self._since is not None:
            self.steps += 1
            self.seconds += end - self._since
        self._previous_end = end
        if self.steps_per_second is not None:
            pl_module.log("train/steps_per_s", self.steps_per_second, prog_bar=True, logger=False)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._previous_end = None  # the next training batch's time starts at its own start

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._previous_end = None  # the next epoch's first batch waits for a new loader


def steps_per_second(callbacks: Iterable[Callback]) -> float | None:
    """The training rate a run's :class:`TrainingSpeed` measured (rounded), None if it has none or took no step."""
    for callback in callbacks:
        if isinstance(callback, TrainingSpeed) and callback.steps_per_second is not None:
            return round(callback.steps_per_second, 4)
    return None


class CheckpointOnInterrupt(Callback):
    """Save ``<dirpath>/last.ckpt`` at the step reached when training stops on an exception: Ctrl+C,
    SIGTERM (which :func:`lra.fit.sigterm_as_ctrl_c` turns into Ctrl+C) or an error, so the resume
    loses no steps. Only while fitting: an error in testing must not overwrite last.ckpt with the
    best checkpoint's weights.

    Lightning's own ``OnExceptionCheckpoint`` does the same saving, but its presence makes every
    ``fit`` without a checkpoint resume from "last" on its own, which would bypass the run's own
    decision (lra.train resumes only a run of the same configuration)."""

    def __init__(self, dirpath: str, filename: str = "last") -> None:
        self.path = Path(dirpath) / f"{filename}.ckpt"

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if trainer.state.fn == TrainerFn.FITTING:
            trainer.save_checkpoint(self.path, weights_only=False)


class StepProgressBar(TQDMProgressBar):
    """One training bar over the run's steps (``max_steps``), where Lightning's bar restarts every epoch.

    A resumed run's bar starts at the step reached and its rate and time left count this process's steps
    only (Lightning's jumps from 0 to the resumed batch in its first update, so the rate it shows is that
    jump). The bar's rate is over wall time, evaluations included, which is what the time left needs;
    ``train/steps_per_s`` beside it is the training steps' own (:class:`TrainingSpeed`).
    """

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        bar = self.train_progress_bar
        bar.reset(total=trainer.max_steps if trainer.max_steps > 0 else None)
        bar.n = bar.last_print_n = bar.initial = trainer.global_step  # tqdm's rate is (n - initial) / elapsed
        bar.unit = "step"
        bar.set_description("Training")

    def on_train_epoch_start(self, trainer: pl.Trainer, *_: Any) -> None:
        pass  # one bar for the whole run: nothing restarts at an epoch's end

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        bar = self.train_progress_bar
        if self._should_update(trainer.global_step, bar.total) and not bar.disable:
            bar.n = trainer.global_step
            bar.set_postfix(self.get_metrics(trainer, pl_module))  # refreshes the bar

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.train_progress_bar.disable:
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))
