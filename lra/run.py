"""A run's life from finding to recording: what ``python -m lra.train`` does with a configuration it was given.

A run is one stage (``classification``) or two (a ``pretraining`` stage first, where ``pretrain=mlm`` asks for
it, in a folder of its own keyed by its configuration, whose checkpoint the classification starts from). Each
stage, in :func:`run_stage`:

* holds its folder, one process per folder (:func:`one_process_per_folder`, :mod:`lra.run_lock`);
* checks its configuration (:func:`lra.config.checked`) and records it (:func:`lra.results.record_configuration`);
* finds a finished run of that configuration, here, in another folder under the output folder or committed,
  and is skipped for it (:func:`finished_run`); with ``rerun=true`` it moves the finished run here to
  ``history/`` instead, and puts it back where the new run fails before its first step (:class:`EarlierRun`);
* resumes an interrupted run of its configuration from its ``last.ckpt`` (:func:`prepare`, :func:`resumable`);
* trains and tests (:func:`lra.fit.fit_and_test`), its record kept in ``results.json`` throughout: a failure, a
  divergence or an interrupt is recorded as such (:func:`recorded`).

Nothing here imports Lightning, the model or the data until a stage trains, so that finding a run (the sweep's
summary, a campaign's plan) stays cheap.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from . import checkpoints, config, results, run_lock
from .data.cache import file_sha256
from .finished import finished_record, finished_runs, record_paths
from .results import CLASSIFICATION, PRETRAINING, RunRecord

log = logging.getLogger(__name__)
# Lines for train.log only (conf/hydra/job_logging/lra.yaml): each evaluation, a failure's traceback.
file_log = logging.getLogger("lra.train.file")

HISTORY = "history"  # a run folder's earlier finished runs, moved there by rerun=true
RUN_FILES = ("checkpoints", "metrics", "tensorboard", "wandb")  # what a run writes besides results.json and train.log
# Runs the pretraining stage of a checked configuration: what the fine-tuning records of it, and its checkpoint.
Pretrained = Callable[[DictConfig], tuple[dict[str, Any], Path]]


class RunFailed(Exception):
    """A run failed; its error is recorded in ``results.json``, the original exception is the cause."""

    def __init__(self, record: RunRecord) -> None:
        super().__init__(record.error)
        self.record = record


def finished_elsewhere(cfg: DictConfig, config_hash: str, output_dir: Path) -> Path | None:
    """The ``results.json`` of a finished run of this configuration in another folder under the output folder: one
    the same settings, written differently (``seed=0`` spelled out, another sweep's overrides), named otherwise."""
    own = (output_dir / results.RESULTS_FILE).resolve()
    others = [path for path in record_paths(Path(cfg.paths.output_dir)) if path.resolve() != own]
    return finished_runs([config_hash], others).get(config_hash)


def committed_run(cfg: DictConfig, config_hash: str) -> Path | None:
    """A finished run of this configuration among the committed records (``paths.runs_dir``, which
    ``lra.table --collect`` fills), so that a sweep resumed in a fresh checkout, whose outputs/ is
    gone, skips what earlier sittings finished and committed."""
    if not cfg.paths.get("runs_dir"):
        return None
    return finished_runs([config_hash], record_paths(Path(cfg.paths.runs_dir))).get(config_hash)


def archive_run(output_dir: Path, previous: RunRecord) -> Path:
    """Move an earlier run's record, checkpoints and logged metrics to ``history/<when it finished or started>/`` so
    that a new run starts afresh in the folder and nothing is lost: a finished run ``rerun=true`` replaces, or a run of
    another configuration. The record is kept as ``record.json`` (``lra.table`` collects every ``results.json``, and
    an earlier run must not count twice); train.log goes on, appended to."""
    stamp = str(previous.finished_at or previous.started_at or "unknown").replace(":", "").replace("+0000", "Z")
    target = output_dir / HISTORY / stamp
    target.mkdir(parents=True, exist_ok=True)
    shutil.move(output_dir / results.RESULTS_FILE, target / "record.json")
    for name in RUN_FILES:
        if (output_dir / name).exists():
            shutil.move(output_dir / name, target / name)
    return target


def keep_another_configurations_run(output_dir: Path, record: RunRecord) -> None:
    """Where the folder holds a run of another configuration (the same command after a default, an experiment's
    value or a preset changed), move it to ``history/`` (:func:`archive_run`) and say so in one line: this run starts
    from step 0 beside it, never over its checkpoints and metrics."""
    previous = results.read(output_dir / results.RESULTS_FILE)
    if previous is None or previous.config_hash in (None, record.config_hash):
        return
    kept = archive_run(output_dir, previous)
    log.warning(
        "%s held a run of another configuration (%s, %s at step %s): it is kept in %s; this configuration (%s) starts "
        "from step 0",
        output_dir,
        previous.config_hash,
        previous.status,
        previous.steps,
        kept,
        record.config_hash,
    )


def last_checkpoint(cfg: DictConfig) -> Path:
    """Where a run keeps its state after its latest evaluation (``callbacks.latest``) or at the step an interrupt
    stopped it (``callbacks.on_interrupt``): where the run resumes."""
    return Path(cfg.callbacks.checkpoint.dirpath) / "last.ckpt"


def checked_and_hashed(cfg: DictConfig) -> tuple[DictConfig, str]:
    """A composed classification run's configuration as a run checks it (a ValueError where it refuses it) and the hash
    its run records, by which a finished or committed run of it is recognised (the sweep's summary, a campaign's
    plan). The protocol adjustments are the run's to log, not logged here."""
    checked, _ = config.checked(cfg, CLASSIFICATION)
    return checked, results.config_hash(results.defining_config(checked))


def log_adjustments(adjusted: dict[str, dict[str, Any]]) -> None:
    """Say what :func:`lra.config.checked` adjusted in the protocols to fit a shortened run, and why."""
    for key, change in adjusted.items():
        section, _, setting = key.rpartition(".")  # "warmup_steps" (the task's) or "pretrain.warmup_steps"
        log.warning(
            "Adjusted %s.protocol.%s from %s to %s (%s)", section or "task", setting, change["from"], change["to"], change["why"]
        )


class EarlierRun:
    """The finished run that a ``rerun=true`` run replaces in its folder. Its files move to ``history/`` as the new
    run starts, so that the new run writes into a clean folder, and back where they were if the new run fails (or is
    interrupted) before training a step: a rerun that could not start must not cost the finished run."""

    def __init__(self, output_dir: Path, last: Path) -> None:
        self.output_dir = output_dir
        self.last = last  # the new run's last.ckpt: past step 0 once it has trained a step
        self.archive: Path | None = None  # where the earlier run's files are, once moved
        self.put_back = False

    def move_to_history(self, previous: RunRecord) -> Path:
        self.archive = archive_run(self.output_dir, previous)
        return self.archive

    def trained_a_step(self) -> bool:
        try:
            return self.last.is_file() and checkpoints.step(self.last) > 0
        except Exception:  # unreadable (a write cut short): keep what the new run left, the earlier run stays archived
            return True

    def put_back_unless_trained(self) -> bool:
        """Put the earlier run's files back where the new run has not trained a step (deleting what the new run wrote
        before it: a record of its failure, an untrained checkpoint, a metrics header); whether they were put back."""
        if self.archive is None or self.trained_a_step():
            return False
        for name in RUN_FILES:
            if (self.output_dir / name).is_dir():
                shutil.rmtree(self.output_dir / name)
            if (self.archive / name).exists():
                shutil.move(self.archive / name, self.output_dir / name)
        os.replace(self.archive / "record.json", self.output_dir / results.RESULTS_FILE)
        for emptied in (self.archive, self.archive.parent):
            if not any(emptied.iterdir()):
                emptied.rmdir()
        self.put_back = True
        return True


def finished_run(cfg: DictConfig, record: RunRecord, output_dir: Path, earlier: EarlierRun) -> RunRecord | None:
    """The finished run of ``record``'s configuration this run is skipped for, in ``output_dir``, in another folder
    under the output folder, or committed; or None to train (with ``rerun=true``, after moving a finished run in
    ``output_dir`` to ``history/``, through ``earlier``)."""
    previous = finished_record(output_dir / results.RESULTS_FILE, record.config_hash)
    if previous is not None:
        if cfg.rerun:
            log.info("Rerunning: the earlier run's files moved to %s", earlier.move_to_history(previous))
            return None
        log.info(
            "Skipping: %s already holds a finished run of this configuration (%s); add rerun=true to run it again "
            "(for example with another logger), which moves the earlier run's files to %s",
            output_dir / results.RESULTS_FILE,
            record.config_hash,
            output_dir / HISTORY,
        )
        return previous
    if cfg.rerun:
        return None
    if (elsewhere := finished_elsewhere(cfg, record.config_hash, output_dir)) is not None:
        log.info(
            "Skipping: %s holds a finished run of this configuration (%s), the same settings written otherwise; "
            "add rerun=true to run it again in %s",
            elsewhere,
            record.config_hash,
            output_dir,
        )
        return RunRecord.read(elsewhere)
    if (committed := committed_run(cfg, record.config_hash)) is not None:
        log.info(
            "Skipping: %s holds a finished run of this configuration (%s), committed; add rerun=true to run it again",
            committed,
            record.config_hash,
        )
        return RunRecord.read(committed)
    return None


def prepare(cfg: DictConfig, record: RunRecord, output_dir: Path) -> tuple[Path | None, int]:
    """What a run that trains checks and records first: the checkpoint an earlier interrupted run of its configuration
    left to resume from, and its process count."""
    keep_another_configurations_run(output_dir, record)
    resume_from = resumable(last_checkpoint(cfg), output_dir / results.RESULTS_FILE, record)
    if resume_from is not None:
        record.resumed_from = str(resume_from)
        goes_on(record, results.read(output_dir / results.RESULTS_FILE))
        log.info("Resuming the interrupted run from %s", resume_from)
    world_size = config.processes(cfg.trainer)
    if cfg.task.protocol.batch_size % world_size:
        raise ValueError(
            f"batch_size={cfg.task.protocol.batch_size} does not divide over {world_size} processes; "
            "the protocol's batch is the total over all devices"
        )
    return resume_from, world_size


def goes_on(record: RunRecord, previous: RunRecord | None) -> None:
    """A resumed run is one run in several pieces (a campaign carries one from machine to machine): its record keeps
    the first piece's ``started_at`` and counts in ``wall_time_s`` the time of the pieces before, which
    :func:`recorded` adds this piece's to. A piece killed before it could write its record (``kill -9``) is not
    counted."""
    if previous is not None:
        record.update(started_at=previous.started_at or record.started_at, wall_time_s=previous.wall_time_s)


def resumable(last: Path, record_path: Path, record: RunRecord) -> Path | None:
    """``last`` where the run of ``record`` resumes from it: the folder's record is of this configuration, or is
    missing or damaged and ``last`` carries this run's identity. A damaged ``last.ckpt``, one of another run, or one
    beside a damaged record that cannot tell is refused with one message naming it and the fix, never trained over
    from step 0 in silence (a run of another configuration was moved to history/ before: :func:`prepare`)."""
    previous = results.read(record_path)
    if not last.is_file() or (previous is not None and previous.config_hash != record.config_hash):
        return None  # nothing to resume, or another configuration's run in this folder: it starts afresh
    fix = "move it away or delete it to train this configuration from the start"
    contents = checkpoints.read_own(last, record.config_hash, record.seed, fix)
    if previous is None and checkpoints.identity(contents) is None:  # written before run identities: it cannot tell
        if record_path.is_file():
            raise ValueError(
                f"{record_path} cannot be read (it is damaged), so nothing tells whether {last} is this configuration's "
                f"to resume; {fix}"
            )
        return None
    if previous is None and record_path.is_file():
        log.warning("%s cannot be read (it is damaged); %s is this run's (its identity says so): resuming", record_path, last)
    return last


@contextmanager
def recorded(
    record: RunRecord, output_dir: Path, cell: str, cfg: DictConfig, earlier: EarlierRun
) -> Iterator[Callable[[], None]]:
    """Run a stage with its record kept in ``results.json``; yields the function that writes it.

    Any failure, from a bad setting to an error in training, is recorded (status ``failed``), logged (the
    message on the console, the traceback in train.log) and raised as :class:`RunFailed`; a loss that became
    non-finite likewise, as ``diverged`` (:class:`lra.module.Diverged`), with the step. An interrupt is
    recorded as such, and a record still ``running`` at the end (a skipped run) is not written. A rerun that
    fails or is interrupted before its first step puts the finished run it replaces back instead (``earlier``).
    """
    from pytorch_lightning.utilities.rank_zero import rank_zero_only  # Lightning: only for a run that trains

    from .module import Diverged

    results_path = output_dir / results.RESULTS_FILE
    write = rank_zero_only(lambda: record.write(results_path))  # one process of a distributed run writes it
    start = time.perf_counter()
    kept = f"the earlier finished run is back in {output_dir} as it was (rerun=true replaces it once the new run trains a step)"
    try:
        yield write
    except Diverged as error:  # a result of its settings, not an error of the harness: never a table's cell
        record.update(status="diverged", error=str(error), steps=error.step)
        file_log.error("%s diverged", cell, exc_info=error)
        log.error("error: %s %s", cell, error)
        if earlier.put_back_unless_trained():
            log.error("It diverged before its first step: %s", kept)
        else:
            log.error("Recorded as diverged in %s: the table lists it under its failed runs, not as a result", results_path)
        raise RunFailed(record) from error
    except Exception as error:
        record.update(status="failed", error=f"{type(error).__name__}: {error}")
        file_log.error("%s failed", cell, exc_info=error)
        log.error("error: %s failed: %s", cell, record.error)
        log.error(
            "The traceback is in %s (HYDRA_FULL_ERROR=1 prints it here); %s",
            output_dir / "train.log",
            kept if earlier.put_back_unless_trained() else f"the error is recorded in {results_path}",
        )
        raise RunFailed(record) from error
    except BaseException:  # KeyboardInterrupt (Lightning turns it into SystemExit): keep last.ckpt to resume
        # An interruption is not a failure: the record says where the run stopped, the step last.ckpt holds.
        try:
            steps = checkpoints.step(last_checkpoint(cfg))
        except checkpoints.UNREADABLE:  # interrupted before its first checkpoint, or while writing it
            steps = None
        record.update(status="interrupted", steps=steps)
        if earlier.put_back_unless_trained():
            log.error("Interrupted before the first step: %s", kept)
        else:
            log.error("Interrupted: running the same command again resumes from %s", last_checkpoint(cfg))
        raise
    finally:
        earlier_pieces = record.wall_time_s or 0.0  # a resumed run's time before this piece (goes_on)
        record.update(wall_time_s=round(earlier_pieces + time.perf_counter() - start, 1), finished_at=results.now())
        if record.status != "running" and not earlier.put_back:
            try:
                write()
            except OSError as error:  # a full disk can refuse the record of a failure too: the console says so
                if record.status == "finished":
                    raise
                log.error("%s could not be written either: %s", results_path, error)


@contextmanager
def one_process_per_folder(output_dir: Path) -> Iterator[None]:
    """Hold ``output_dir`` for the run (:mod:`lra.run_lock`): in the process that launches a run, not in the other
    processes of a distributed one, which Lightning (or SLURM) starts with a rank and which work in the folder the
    launching process holds."""
    from pytorch_lightning.utilities.rank_zero import rank_zero_only  # the rank from Lightning's and SLURM's variables

    if rank_zero_only.rank != 0:
        yield
        return
    with run_lock.held(output_dir):
        yield


def pretraining_stage(cfg: DictConfig, row: str | None) -> tuple[DictConfig, Path]:
    """The configuration and folder of the pretraining run that ``cfg``'s fine-tuning starts from.

    Its protocol is ``pretrain.protocol``; the folder, under ``<output_dir>/pretrain/<task>/``, is
    named by a hash of its defining settings (task data, model, attention, seed, pretraining), so
    fine-tuning runs that share them share one pretraining run. Every callback that writes
    checkpoints writes them there.
    """
    pretrain = OmegaConf.to_container(cfg.pretrain, resolve=True)
    pretraining = OmegaConf.merge(cfg, {"pretrain": pretrain, "task": {"protocol": pretrain["protocol"]}})
    digest = results.config_hash(results.defining_config(pretraining, PRETRAINING))
    name = f"{(row or cfg.attention.name).split(' ')[0]}-{cfg.pretrain.objective}-seed{cfg.seed}-{digest}"
    folder = Path(cfg.paths.output_dir).absolute() / "pretrain" / cfg.task.name / name
    writes_there = {key: {"dirpath": str(folder / "checkpoints")} for key, node in cfg.callbacks.items() if "dirpath" in node}
    there = {"callbacks": writes_there, "logger": {"save_dir": str(folder)} if "save_dir" in cfg.logger else {}}
    return OmegaConf.merge(pretraining, there), folder


def pretrained_start(cfg: DictConfig, row: str | None) -> tuple[dict[str, Any], Path]:
    """Run (or resume, or reuse) the pretraining stage of ``cfg``: what the fine-tuning records of it, and the
    checkpoint it starts from."""
    pretraining, folder = pretraining_stage(cfg, row)
    log.info("Pretraining first (%s), in %s", cfg.pretrain.objective, folder)
    record = run_stage(pretraining, folder, row, PRETRAINING)
    checkpoint = Path(record.best_checkpoint)
    if not checkpoint.is_file():
        raise FileNotFoundError(f"the pretraining run's checkpoint {checkpoint} is missing; delete {folder} to pretrain again")
    summary = {
        "objective": cfg.pretrain.objective,
        "steps": record.steps,
        "checkpoint_sha256": file_sha256(checkpoint),
        "config_hash": record.config_hash,
        "val_masked_acc": record.best_val_acc,
    }
    return summary, checkpoint


def run_stage(cfg: DictConfig, output_dir: Path, row: str | None, stage: str, pretrained: Pretrained | None = None) -> RunRecord:
    """Run one stage, ``classification`` or ``pretraining``, unless ``output_dir`` holds its finished result; return
    its record. An earlier interrupted or failed run of the same configuration resumes from its last checkpoint.
    ``pretrained`` runs the pretraining stage a classification starts from, once it is known to train."""
    from .fit import fit_and_test  # Lightning, the model and the data: only a run that trains pays for importing them

    record = results.new_record(cfg, row, stage)
    cell = f"{cfg.task.name} / {record.row} / seed {cfg.seed}"
    cell += f" / pretraining ({cfg.pretrain.objective})" if stage == PRETRAINING else ""
    earlier = EarlierRun(output_dir, last_checkpoint(cfg))
    with one_process_per_folder(output_dir), recorded(record, output_dir, cell, cfg, earlier) as write:
        cfg, adjusted = config.checked(cfg, stage)
        log_adjustments(adjusted)
        record.adjusted = adjusted or None
        results.record_configuration(record, cfg, stage)
        if (finished := finished_run(cfg, record, output_dir, earlier)) is not None:
            return finished
        resume_from, world_size = prepare(cfg, record, output_dir)
        write()
        init_from = None
        if pretrained is not None:
            record.pretrained, checkpoint = pretrained(cfg)
            write()
            init_from = None if resume_from else checkpoint  # a resumed run's own checkpoint holds the pretrained start
        protocol = cfg.task.protocol
        headline = f"{cell}: {protocol.max_steps} steps of batch {protocol.batch_size} (protocol {protocol.name}) -> {output_dir}"
        trained = fit_and_test(
            cfg,
            output_dir,
            resume_from,
            world_size,
            headline,
            stage=stage,
            init_from=init_from,
            config_hash=record.config_hash,
            row=record.row,
        )
        record.update(**trained)
        record.status = "finished"
    if record.test_acc is not None:  # rank 0's record; the other processes of a distributed run do not test
        log.info(
            "%s: best val acc %.4f at step %d, test acc %.4f. Results: %s",
            cell,
            record.best_val_acc,
            record.best_val_step,
            record.test_acc,
            output_dir / results.RESULTS_FILE,
        )
    return record


def train(cfg: DictConfig, output_dir: Path, row: str | None = None) -> RunRecord:
    """Run one cell unless ``output_dir`` already holds its finished result; return its record.

    A cell is one stage or two: where ``cfg.pretrain`` asks for it, a pretraining stage (``cfg.pretrain``'s
    objective on the task's inputs, in a folder of its own) whose checkpoint the classification stage starts
    from; then the classification stage, in ``output_dir``. ``row`` names the table row the run belongs to
    (the attention preset and any overrides of it).
    """
    if cfg.pretrain.objective == "none":
        return run_stage(cfg, Path(output_dir), row, CLASSIFICATION)
    return run_stage(cfg, Path(output_dir), row, CLASSIFICATION, pretrained=lambda checked: pretrained_start(checked, row))
