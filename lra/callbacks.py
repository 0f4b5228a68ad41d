"""Lightning callbacks of ``python -m lra.train`` (``conf/callbacks``) that are this harness's own."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from lightning_fabric.plugins import TorchCheckpointIO
from pytorch_lightning.callbacks import Callback, ModelCheckpoint, TQDMProgressBar
from pytorch_lightning.trainer.states import TrainerFn

from . import checkpoints, signals
from .files import DiskFull
from .steps import metrics_row_due, something_due_after

# Lines for train.log only (conf/hydra/job_logging/lra.yaml): each evaluation.
file_log = logging.getLogger("lra.train.file")


class TrainingSpeed(Callback):
    """Training steps per second of this process, in the progress bar (``train/steps_per_s``, shown by
    :class:`StepProgressBar`) and in ``results.json``.

    The time counted is that of the training batches, in windows of consecutive ones: a window ends at the step that
    writes a metrics row (every ``trainer.log_every_n_steps``), before an evaluation, at an epoch's end and at the end
    of training, and the next one starts where it ended (so each step's batch loading counts) or, after an
    evaluation, an epoch's end or at the start, at its first batch's start (so validation, testing, the evaluation's
    checkpoint and the start-up never count). On a GPU a window's end, and a window's start that does not continue
    the previous one, wait for the device (``synchronize``): the rate is that of the device finishing the steps, not
    of the host queueing them, and no other step waits, so the measurement does not slow what it measures (a wait
    per step left the device idle while the host prepared the next). Only this process's steps count: after a resume
    the rate is that of the resumed part, never mixed with the interrupted one's.

    The rate depends on what else the machine runs: the machine's load is sampled (:func:`machine_load`) where the
    first window starts and where the last one ends, and recorded beside the rate (``lra.table --speed`` marks a
    rate measured under load).
    """

    def __init__(self) -> None:
        self.steps = 0
        self.seconds = 0.0
        self._since: float | None = None  # where the open window's time starts; None when no window is open
        self._window_steps = 0  # training steps in the open window
        self._previous_end: float | None = None  # the end of the window just before, if nothing came between
        self._load_at_start: dict[str, float] | None = None  # machine_load() where the first window started
        self._load_at_end: dict[str, float] | None = None  # and where the latest one ended

    @property
    def steps_per_second(self) -> float | None:
        """The rate over the windows ended so far; None before the first one ends."""
        return self.steps / self.seconds if self.seconds > 0 else None

    @property
    def load(self) -> dict[str, float] | None:
        """The machine's load while the rate was timed: the CPUs, this run's threads, and the load average where the
        timing started and where it ended; None before the first window ends."""
        if self._load_at_start is None or self._load_at_end is None:
            return None
        start, end = self._load_at_start, self._load_at_end
        return {"cpus": end["cpus"], "threads": end["threads"], "load_at_start": start["load"], "load_at_end": end["load"]}

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        if self._since is None:
            if self._previous_end is None:
                wait_for_device(pl_module.device)  # what was queued before (an evaluation, the start-up) is not counted
            self._since = self._previous_end if self._previous_end is not None else time.perf_counter()
            self._load_at_start = self._load_at_start or machine_load()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._window_steps += 1
        if metrics_row_due(trainer):  # Lightning reads the device here anyway
            self._end_window(pl_module, continued=True)

    def _end_window(self, pl_module: pl.LightningModule, continued: bool) -> None:
        if self._since is None:
            return
        wait_for_device(pl_module.device)
        end = time.perf_counter()
        self.steps += self._window_steps
        self.seconds += end - self._since
        self._since, self._window_steps = None, 0
        self._previous_end = end if continued else None
        self._load_at_end = machine_load()

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._end_window(pl_module, continued=False)  # the next training batch's time starts at its own start

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._end_window(pl_module, continued=False)  # the next epoch's first batch waits for a new loader

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._end_window(pl_module, continued=False)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._end_window(pl_module, continued=False)


def wait_for_device(device: torch.device) -> None:
    """Wait until ``device`` has done the work queued on it (a GPU's; a CPU computes as it is asked)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def machine_load() -> dict[str, float] | None:
    """The machine's load now: the load average over the last minute (the threads running or waiting to run, this
    run's own among them), the machine's CPUs and the threads torch computes with in this process; None on a system
    without a load average. A cheap read of ``/proc/loadavg``."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return None
    return {"load": round(load, 2), "cpus": os.cpu_count() or 1, "threads": torch.get_num_threads()}


def steps_per_second(callbacks: Iterable[Callback]) -> float | None:
    """The training rate a run's :class:`TrainingSpeed` measured (rounded), None if it has none or took no step."""
    for callback in callbacks:
        if isinstance(callback, TrainingSpeed) and callback.steps_per_second is not None:
            return round(callback.steps_per_second, 4)
    return None


def timed_machine_load(callbacks: Iterable[Callback]) -> dict[str, float] | None:
    """The machine's load while a run's :class:`TrainingSpeed` timed its steps (:attr:`TrainingSpeed.load`)."""
    return next((callback.load for callback in callbacks if isinstance(callback, TrainingSpeed)), None)


class EvaluationLog(Callback):
    """Each evaluation's result into train.log, as it happens (the console has the progress bar); ``lra.campaign
    status`` reads a running cell's pace from these lines (:data:`lra.campaign.state.EVALUATION_LINE`)."""

    def on_validation_epoch_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            metrics = {key: float(value) for key, value in trainer.callback_metrics.items() if key.startswith("val/")}
            file_log.info("step %d: %s", trainer.global_step, ", ".join(f"{k} {v:.4f}" for k, v in sorted(metrics.items())))


class CheckpointOnInterrupt(Callback):
    """Save ``<dirpath>/last.ckpt`` at the step reached when training stops on an exception: Ctrl+C,
    SIGTERM (a preempted or cancelled job) or an error, so the resume loses no steps. Only while
    fitting: an error in testing must not overwrite last.ckpt with the best checkpoint's weights.

    Under :meth:`stop_between_steps`, a first Ctrl+C or SIGTERM during training lets training go on
    to the end of the first step after which nothing is due (no evaluation, no metrics row) and stops
    there, in ``on_train_batch_end``: the state Lightning's own step checkpoints are taken in, from
    which its resume is exact. A second signal, or one outside training, stops at once. A bare
    KeyboardInterrupt lands anywhere in a step, possibly between the optimizer's update and the
    step's bookkeeping: a run resumed from there repeated a batch index and evaluated one step late
    (at 50, 75, 100 instead of 49, 74, 99); and a stop at the end of a step that evaluates or logs
    loses that evaluation or metrics row (Lightning's resume skips what was due at the saved step).

    Lightning's own ``OnExceptionCheckpoint`` does the same saving, but its presence makes every
    ``fit`` without a checkpoint resume from "last" on its own, which would bypass the run's own
    decision (lra.run resumes only a run of the same configuration)."""

    def __init__(self, dirpath: str, filename: str = "last") -> None:
        self.path = Path(dirpath) / f"{filename}.ckpt"
        self.stop_requested: str | None = None  # the signal that asked to stop, until training stops
        self._training = False  # between on_train_start and the end of training
        self._handling = False  # within stop_between_steps, in the main thread

    @contextmanager
    def stop_between_steps(self) -> Iterator[None]:
        """Handle Ctrl+C and SIGTERM as the class docstring says while the block (a ``trainer.fit``) runs.
        Outside the main thread signals cannot be handled, and nothing changes."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signals.take(self._on_signal)  # processes forked during fit keep the handlers of before
        self._handling = True
        try:
            yield
        finally:
            signals.give_back(self._on_signal, previous)
            self._handling = False
            self.stop_requested = None

    def _on_signal(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.stop_requested or not self._training:
            raise KeyboardInterrupt(f"signal {name}")
        self.stop_requested = f"signal {name}"
        print(
            f"\n{name}: stopping after this training step (or the next where an evaluation or a metrics row is due) "
            "and saving last.ckpt; send it again to stop at once",
            file=sys.stderr,
            flush=True,
        )

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._training = True
        # Lightning has by now put its own SIGTERM handler before this one; it stops at the end of a
        # step's evaluation, or in the middle of one. In one process this handler alone decides; with
        # several, Lightning's must stay (it tells the other processes).
        if self._handling and trainer.world_size == 1:
            signal.signal(signal.SIGTERM, self._on_signal)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._training = False

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.stop_requested and not something_due_after(trainer):
            raise KeyboardInterrupt(self.stop_requested)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._training = False
        # A full disk would refuse this save too (and its error would replace the first's): the last.ckpt of the
        # latest evaluation stays, whole (AtomicCheckpointIO).
        if trainer.state.fn == TrainerFn.FITTING and not diverged(pl_module) and not isinstance(exception, DiskFull):
            trainer.save_checkpoint(self.path, weights_only=False)


def diverged(module: pl.LightningModule) -> bool:
    """Whether the module's loss has been non-finite since its last check: its state must not be saved then (the
    last.ckpt of the latest evaluation stays, the last finite state)."""
    from .module import Diverged

    try:
        check = getattr(module, "check_divergence", None)
        if check is not None:
            check()
    except Diverged:
        return True
    return False


class RunIdentity(Callback):
    """Stamps every checkpoint with the run it belongs to (its configuration hash and seed, under the callbacks' state
    ``RunIdentity``), so that a resume, a test or a carried folder can tell a foreign checkpoint from its own
    (:func:`lra.checkpoints.identity`). Lightning would resume any checkpoint whose shapes fit."""

    def __init__(self, config_hash: str, seed: int) -> None:
        self.identity = {"config_hash": config_hash, "seed": seed}

    @property
    def state_key(self) -> str:
        return checkpoints.IDENTITY

    def state_dict(self) -> dict[str, Any]:
        return dict(self.identity)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint reader and writer through :mod:`lra.checkpoints`: every checkpoint written whole beside its
    target with its digest recorded, and read with ``weights_only=True`` against that digest.

    Lightning's own writer goes through fsspec, which stages a file under $TMPDIR and moves it: with the outputs on
    another filesystem (a cluster's scratch or NFS), the move is a copy, and a kill or a full disk during it left a
    0-byte ``last.ckpt`` or a truncated best checkpoint that every rerun failed on. Here a kill or a full disk at any
    moment leaves the previous version whole, and a full disk is one message (:class:`lra.files.DiskFull`). Lightning's
    reader unpickles with torch's default, which before torch 2.6 runs whatever a file holds."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__}.save_checkpoint takes no storage_options, got {storage_options!r}")
        checkpoints.write(Path(path), checkpoint)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        if weights_only is False:
            raise ValueError("checkpoints are read with weights_only=True only (lra.checkpoints): nothing in one may run code")
        return checkpoints.read(Path(path))

    def remove_checkpoint(self, path: Any) -> None:
        checkpoints.remove(Path(path))


class RunFolderCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` whose state follows the run folder when the folder moves.

    A run interrupted on one machine is resumed on another from its ``last.ckpt``, often in a folder at
    another absolute path (a cluster's per-job scratch folder, a copy brought back from a preempted
    instance). Lightning takes a changed ``dirpath`` for a different folder: it drops the best score, the
    top-k and the last checkpoint's path and keeps ``best_model_path`` at the old, absent path. The
    resumed run then took its first evaluation for the best whatever its score, left the real best
    file undeleted beside it and recorded (and tested) the wrong step. Here ``dirpath`` is always the
    run folder's ``checkpoints``, and a run resumes only in its own folder: a changed ``dirpath`` is that
    folder moved. So every saved path inside the old ``dirpath`` is rebased onto the current one and
    Lightning restores the state as if the folder had never moved; a path outside it is kept as saved.
    """

    @property
    def state_key(self) -> str:
        # Lightning's own key ("ModelCheckpoint{...}"), so that a last.ckpt saved before this class restores here.
        return super().state_key.replace(type(self).__qualname__, ModelCheckpoint.__qualname__, 1)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved, current = state_dict.get("dirpath"), self.dirpath
        if saved and current and saved != current:
            state_dict = {**state_dict, "dirpath": current}
            for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
                if key in state_dict:
                    state_dict[key] = rebased(state_dict[key], saved, current)
            if "best_k_models" in state_dict:
                state_dict["best_k_models"] = {rebased(p, saved, current): v for p, v in state_dict["best_k_models"].items()}
        super().load_state_dict(state_dict)


def rebased(path: Any, old: str, new: str) -> Any:
    """``path`` at the same place under folder ``new`` as it was under ``old``; any other path (or none) unchanged."""
    if not isinstance(path, str) or not path:
        return path
    try:
        inside = Path(path).relative_to(old)
    except ValueError:
        return path
    return os.path.join(new, inside)


class StepProgressBar(TQDMProgressBar):
    """One training bar over the run's steps (``max_steps``), where Lightning's bar restarts every epoch.

    A resumed run's bar starts at the step reached and its rate and time left count this process's steps
    only (Lightning's jumps from 0 to the resumed batch in its first update, so the rate it shows is that
    jump). The bar's rate is over wall time, evaluations included, which is what the time left needs;
    ``train/steps_per_s`` beside it is the training steps' own (:class:`TrainingSpeed`). The logged values beside the
    bar (loss, accuracy, rate) change at the steps that write a metrics row (``trainer.log_every_n_steps``): reading
    them is a wait for a GPU, which the steps between never make.
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

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        """Lightning's bar values (the evaluations') with the training step's loss and accuracy as last logged, and the
        training rate (:class:`TrainingSpeed`). The training values are not prog_bar values: Lightning would read those
        from the device at every batch's end."""
        metrics = super().get_metrics(trainer, pl_module)
        logged = trainer.callback_metrics
        training = {name: float(logged[name]) for name in ("train/loss", "train/acc") if name in logged}
        speed = next((c.steps_per_second for c in trainer.callbacks if isinstance(c, TrainingSpeed)), None)
        return {**training, **({"train/steps_per_s": speed} if speed is not None else {}), **metrics}

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        bar = self.train_progress_bar
        if bar.disable:
            return
        if metrics_row_due(trainer):
            # The logged values are read from the device (a wait for it) only where a metrics row reads them anyway.
            bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)
        if self._should_update(trainer.global_step, bar.total):
            bar.update(trainer.global_step - bar.n)  # redraws at most every tqdm mininterval (0.1 s)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.train_progress_bar.disable:
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))
