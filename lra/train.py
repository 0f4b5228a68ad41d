"""Train and test one LRA cell: ``python -m lra.train [task=...] [attention=...] [overrides]``.

The run trains for the task's ``max_steps``, evaluates every ``val_check_interval`` steps on
``limit_val_batches`` shuffled validation batches, keeps the best-validation checkpoint, tests it on
the whole test set and writes ``results.json`` into the run's output folder. The folder is named by
the task, the attention and the command-line overrides, so re-running a finished cell with the same
settings is skipped, and re-running an interrupted one resumes it.

With ``pretrain=mlm`` the run first self-pretrains its encoder (masked prediction of the task's
own inputs) in a pretraining run of its own, an ordinary run in its own folder keyed by its
configuration, which is resumed or reused like any cell, and then fine-tunes from its checkpoint.

A run that fails, before training or during it, prints one message, records the error in
``results.json`` (status ``failed``) and exits with status 1; its traceback goes to the run's
``train.log`` (``HYDRA_FULL_ERROR=1`` prints it on the console instead). In a multirun sweep the
other cells go on and the sweep ends with a summary (``lra/sweep.py``).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import shutil
import sys
import time
import warnings
from importlib.metadata import version
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict

import attention_zoo

from . import config, results
from .data.cache import file_sha256
from .results import RunRecord

log = logging.getLogger(__name__)
# Lines for train.log only (conf/hydra/job_logging/lra.yaml): each evaluation, a failure's traceback.
file_log = logging.getLogger("lra.train.file")

# The protocol's fields and their types: anything else in task.protocol is an error, not ignored.
PROTOCOL_FIELDS = {
    "name": str,
    "batch_size": int,
    "max_steps": int,
    "warmup_steps": int,
    "val_check_interval": int,
    "limit_val_batches": int,
    "lr": float,
    "weight_decay": float,
}
WARMUP_SHARE_WHEN_SHORTENED = 0.1  # the warmup of a run shortened below its warmup: a tenth of its steps
PRETRAINING_OBJECTIVES = ("none", "mlm")  # conf/pretrain/<objective>.yaml
PRETRAINING = "pretraining"  # the stage of a pretraining run (its record's "stage")
HISTORY = "history"  # a run folder's earlier finished runs, moved there by rerun=true
RUN_FILES = ("checkpoints", "metrics", "tensorboard", "wandb")  # what a run writes besides results.json and train.log

config.register()  # before @hydra.main composes: the attention_zoo group and the resolvers


class RunFailed(Exception):
    """A run failed; its error is recorded in ``results.json``, the original exception is the cause."""

    def __init__(self, record: RunRecord) -> None:
        super().__init__(record.error)
        self.record = record


def not_an_advertisement(record: logging.LogRecord) -> bool:
    return "litlogger" not in record.getMessage()


def quiet_library_noise() -> None:
    """Keep what the libraries log to what a user needs, and send Lightning's messages to train.log.

    Called once the run's logging is configured. Silenced: Lightning's advertisement for its cloud
    logger, and torch's note that no CUDA runtime is found, printed when YOSO's kernels are loaded
    on a CPU-only machine (the kernels report what they built themselves), and, where SLURM is
    installed, Lightning's hint (twice per run) to start training with srun: runs reach SLURM through
    Hydra's submitit launcher, whose jobs use srun. Lightning's warnings about the protocol's
    deliberate choices are silenced around training only (:mod:`lra.fit`).
    """
    for name in ("pytorch_lightning", "lightning_fabric"):
        # Lightning gives itself a console handler when imported before logging is configured;
        # through the root logger its messages reach the console and train.log alike.
        library_logger = logging.getLogger(name)
        for handler in list(library_logger.handlers):
            library_logger.removeHandler(handler)
        library_logger.propagate = True
    logging.getLogger("pytorch_lightning.utilities.rank_zero").addFilter(not_an_advertisement)
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=r"The `srun` command is available on your system but is not used")


def check_protocol(protocol: DictConfig) -> dict[str, dict[str, Any]]:
    """Validate ``task.protocol`` and fit it to a shortened run; return what was adjusted.

    A run shortened with ``task.protocol.max_steps=N`` alone keeps the experiment's warmup and
    evaluation interval, which may not fit: a warmup of at least N steps becomes a tenth of N (0 below
    20 steps, since the schedule needs 0 or at least 2), an evaluation interval above N becomes N.
    Each adjustment is logged and returned (``results.json`` records it under ``adjusted``).
    """
    unknown = sorted(set(protocol) - set(PROTOCOL_FIELDS))
    if unknown:
        raise ValueError(f"unknown task.protocol field(s) {unknown}; the protocol has {', '.join(PROTOCOL_FIELDS)}")
    for key, kind in PROTOCOL_FIELDS.items():
        value = protocol.get(key)
        valid = isinstance(value, kind) or (kind is float and isinstance(value, int))
        if not valid or isinstance(value, bool):
            raise TypeError(f"task.protocol.{key} must be {kind.__name__}, got {value!r}")
    for key in ("batch_size", "max_steps", "val_check_interval", "limit_val_batches"):
        if protocol[key] < 1:
            raise ValueError(f"task.protocol.{key} must be at least 1, got {protocol[key]}")
    if protocol.warmup_steps < 0 or protocol.lr <= 0 or protocol.weight_decay < 0:
        raise ValueError(
            f"need warmup_steps >= 0, lr > 0 and weight_decay >= 0; got warmup_steps={protocol.warmup_steps}, "
            f"lr={protocol.lr}, weight_decay={protocol.weight_decay}"
        )
    if protocol.warmup_steps == 1:
        raise ValueError("task.protocol.warmup_steps must be 0 or at least 2 (OneCycleLR divides by warmup_steps - 1)")
    adjusted = {}
    steps = protocol.max_steps
    if protocol.warmup_steps >= steps:
        warmup = int(WARMUP_SHARE_WHEN_SHORTENED * steps)
        warmup = warmup if warmup >= 2 else 0
        adjusted["warmup_steps"] = {
            "from": protocol.warmup_steps,
            "to": warmup,
            "why": f"must be below max_steps={steps}; a tenth of it",
        }
    if protocol.val_check_interval > steps:
        adjusted["val_check_interval"] = {
            "from": protocol.val_check_interval,
            "to": steps,
            "why": f"must not exceed max_steps={steps}, so the run is evaluated",
        }
    for key, change in adjusted.items():
        protocol[key] = change["to"]
        log.warning("Adjusted task.protocol.%s from %s to %s (%s)", key, change["from"], change["to"], change["why"])
    return adjusted


def check_task(task: DictConfig) -> None:
    """Validate the task's lengths before any data is read: the model's ``seq_len`` and the tokens
    ``data.max_length`` keeps per sequence, which must fit in it (nothing is cut silently)."""
    for key in ("seq_len", "data.max_length"):
        value = OmegaConf.select(task, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"task.{key} must be a positive whole number of tokens, got {value!r}")
    if task.data.max_length > task.seq_len:
        raise ValueError(
            f"task.seq_len={task.seq_len} is shorter than task.data.max_length={task.data.max_length}, so the model "
            f"would not see the end of the longer sequences; set task.seq_len to at least {task.data.max_length} "
            f"or task.data.max_length to at most {task.seq_len}"
        )


def unknown_hparam_overrides(overrides: list[str]) -> str | None:
    """The error for ``attention.hparams.KEY=VALUE`` overrides whose KEY the chosen attention(s) lack.

    Hydra would refuse them with "Key 'KEY' is not in struct" and no list of what is valid; this
    names the attention and its hyperparameters with their defaults (attention_zoo's message)."""
    plain = [o.split("=", 1)[0] for o in overrides if o.startswith("attention.hparams.") and "=" in o]
    if not plain:
        return None
    choices = [o.split("=", 1)[1] for o in overrides if o.startswith("attention=")]
    for choice in choices[-1].split(",") if choices else [None]:
        try:
            cfg = config.compose([f"attention={choice}"] if choice else [])
        except Exception:  # an unknown attention, say: Hydra's own run reports it
            return None
        unknown = sorted({key.removeprefix("attention.hparams.").split(".")[0] for key in plain} - set(cfg.attention.hparams))
        if unknown:
            preset = choice or cfg.attention.name
            try:
                attention_zoo.make_config(cfg.attention.name, **dict.fromkeys(unknown))
            except ValueError as error:
                return f"attention={preset}: {error}"
    return None


def committed_run(cfg: DictConfig, config_hash: str) -> Path | None:
    """A finished run of this configuration among the committed records (``paths.runs_dir``, which
    ``lra.table --collect`` fills), so that a sweep resumed in a fresh checkout, whose outputs/ is
    gone, skips what earlier sittings finished and committed."""
    runs_dir = Path(cfg.paths.get("runs_dir") or "")
    if not cfg.paths.get("runs_dir") or not runs_dir.is_dir():
        return None
    for path in sorted(runs_dir.glob(f"{cfg.task.name}__*.json")):
        record = results.read(path)
        if record and record.config_hash == config_hash and record.status == "finished":
            return path
    return None


def archive_finished_run(output_dir: Path, previous: RunRecord) -> Path:
    """Move a finished run's record, checkpoints and logged metrics to ``history/<finished_at>/`` so
    that ``rerun=true`` starts afresh and nothing is lost. The record is kept as ``record.json``
    (``lra.table`` collects every ``results.json``, and an earlier run must not count twice);
    train.log goes on, appended to."""
    stamp = str(previous.finished_at or "unknown").replace(":", "").replace("+0000", "Z")
    target = output_dir / HISTORY / stamp
    target.mkdir(parents=True, exist_ok=True)
    shutil.move(output_dir / results.RESULTS_FILE, target / "record.json")
    for name in RUN_FILES:
        if (output_dir / name).exists():
            shutil.move(output_dir / name, target / name)
    return target


def defining_config(cfg: DictConfig, stage: str = "classification") -> dict[str, Any]:
    """The settings that determine a run's result (not where it writes or on which device)."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    defining = {key: resolved[key] for key in ("task", "attention", "model", "seed", "pretrain")}
    return {**defining, "stage": stage} if stage == PRETRAINING else defining


def pretraining_run(cfg: DictConfig, row: str | None = None) -> tuple[DictConfig, Path]:
    """The configuration and folder of the pretraining run that ``cfg``'s fine-tuning starts from.

    Its protocol is ``pretrain.protocol``; the folder, under ``<output_dir>/pretrain/<task>/``, is
    named by a hash of its defining settings (task data, model, attention, seed, pretraining), so
    fine-tuning runs that share them share one pretraining run.
    """
    objective = cfg.pretrain.objective
    pretraining = copy.deepcopy(cfg)
    with open_dict(pretraining):
        pretraining.pretrain = OmegaConf.to_container(cfg.pretrain, resolve=True)
        pretraining.task.protocol = pretraining.pretrain.protocol
        digest = results.config_hash(defining_config(pretraining, PRETRAINING))
        preset = (row or cfg.attention.name).split(" ")[0]
        name = f"{preset}-{objective}-seed{cfg.seed}-{digest}"
        folder = Path(cfg.paths.output_dir).absolute() / "pretrain" / cfg.task.name / name
        pretraining.callbacks.checkpoint.dirpath = str(folder / "checkpoints")
        if "save_dir" in pretraining.logger:
            pretraining.logger.save_dir = str(folder)
    return pretraining, folder


def pretrain_first(cfg: DictConfig, row: str | None) -> dict[str, Any]:
    """Run (or resume, or reuse) the pretraining run of ``cfg``; what the fine-tuning records of it."""
    pretraining, folder = pretraining_run(cfg, row)
    log.info("Pretraining first (%s), in %s", cfg.pretrain.objective, folder)
    record = train(pretraining, folder, row, stage=PRETRAINING)
    checkpoint = Path(record.best_checkpoint)
    if not checkpoint.is_file():
        raise FileNotFoundError(f"the pretraining run's checkpoint {checkpoint} is missing; delete {folder} to pretrain again")
    return {
        "objective": cfg.pretrain.objective,
        "steps": record.steps,
        "checkpoint": str(checkpoint),
        "checkpoint_sha256": file_sha256(checkpoint),
        "config_hash": record.config_hash,
        "val_masked_acc": record.best_val_acc,
    }


def processes(trainer_cfg: DictConfig) -> int:
    """How many training processes the trainer config asks for (devices x nodes)."""
    devices = trainer_cfg.devices
    if isinstance(devices, str) or (isinstance(devices, int) and devices < 1):
        raise ValueError(f"trainer.devices must be a device count or a list of devices, got {devices!r}")
    per_node = devices if isinstance(devices, int) else len(devices)
    return per_node * trainer_cfg.get("num_nodes", 1)


def train(cfg: DictConfig, output_dir: Path, row: str | None = None, stage: str = "classification") -> RunRecord:
    """Run one cell unless ``output_dir`` already holds its finished result; return the record.

    ``stage`` is ``classification`` (the task; after pretraining when ``cfg.pretrain`` asks for it)
    or ``pretraining`` (the objective of ``cfg.pretrain`` on the task's inputs, see :func:`pretrain_first`).

    An earlier interrupted or failed run of the same configuration resumes from its last
    checkpoint. Any failure, from a bad setting to an error in training, is recorded in
    ``results.json`` (status ``failed``), logged (the message on the console, the traceback in
    train.log) and raised as :class:`RunFailed`. ``row`` names the table row the run belongs to
    (the attention preset and any overrides of it).
    """
    # Lightning, the model and the data: only a run that trains pays for importing them.
    from pytorch_lightning.utilities.rank_zero import rank_zero_only

    from .fit import fit_and_test

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    results_path = output_dir / results.RESULTS_FILE
    write = rank_zero_only(RunRecord.write)  # one process of a distributed run writes results.json
    cell = f"{cfg.task.name} / {row or cfg.attention.name} / seed {cfg.seed}"
    if stage == PRETRAINING:
        cell = f"{cell} / pretraining ({cfg.pretrain.objective})"
    record = RunRecord(
        task=cfg.task.name,
        attention=cfg.attention.name,
        row=row or cfg.attention.name,
        seed=cfg.seed,
        git_commit=results.git_commit(),
        torch_version=torch.__version__,
        lightning_version=version("pytorch-lightning"),
        started_at=results.now(),
        status="running",
        stage=stage if stage == PRETRAINING else None,
    )
    start = time.perf_counter()
    try:
        check_task(cfg.task)
        adjusted = check_protocol(cfg.task.protocol)
        if cfg.pretrain.objective not in PRETRAINING_OBJECTIVES:
            raise ValueError(
                f"pretrain.objective must be one of {', '.join(PRETRAINING_OBJECTIVES)}, got {cfg.pretrain.objective!r}"
            )
        if stage != PRETRAINING and cfg.pretrain.objective != "none":
            adjusted.update({f"pretrain.{key}": change for key, change in check_protocol(cfg.pretrain.protocol).items()})
        defining = defining_config(cfg, stage)
        record.update(
            protocol=defining["task"]["protocol"],
            model=defining["model"],
            pretrain=defining["pretrain"],
            seq_len=defining["task"]["seq_len"],
            data=results.recorded_data(defining["task"]["data"]),
            config_hash=results.config_hash(defining),
        )
        record.adjusted = adjusted or None
        previous = results.read(results_path)
        same_config = previous is not None and previous.config_hash == record.config_hash
        committed = None if same_config or cfg.get("rerun", False) else committed_run(cfg, record.config_hash)
        if committed is not None:
            log.info(
                "Skipping: %s holds a finished run of this configuration (%s), committed; add rerun=true to run it again",
                committed,
                record.config_hash,
            )
            return RunRecord.read(committed)
        if same_config and previous.status == "finished":
            if not cfg.get("rerun", False):
                log.info(
                    "Skipping: %s already holds a finished run of this configuration (%s); add rerun=true to run it "
                    "again (for example with another logger), which moves the earlier run's files to %s",
                    results_path,
                    record.config_hash,
                    output_dir / HISTORY,
                )
                return previous
            log.info("Rerunning: the earlier run's files moved to %s", archive_finished_run(output_dir, previous))
        last_checkpoint = Path(cfg.callbacks.checkpoint.dirpath) / "last.ckpt"
        resume_from = last_checkpoint if same_config and last_checkpoint.is_file() else None
        attention_config = attention_zoo.make_config(cfg.attention.name, **defining["attention"]["hparams"])
        record.attention_hparams = dataclasses.asdict(attention_config)
        if resume_from:
            record.resumed_from = str(resume_from)
            log.info("Resuming the interrupted run from %s", resume_from)
        world_size = processes(cfg.trainer)
        if cfg.task.protocol.batch_size % world_size:
            raise ValueError(
                f"batch_size={cfg.task.protocol.batch_size} does not divide over {world_size} processes; "
                "the protocol's batch is the total over all devices"
            )
        write(record, results_path)
        protocol = cfg.task.protocol
        headline = f"{cell}: {protocol.max_steps} steps of batch {protocol.batch_size} (protocol {protocol.name}) -> {output_dir}"
        pretrained = None
        if stage != PRETRAINING and cfg.pretrain.objective != "none":
            pretrained = pretrain_first(cfg, row)
            record.pretrained = {key: value for key, value in pretrained.items() if key != "checkpoint"}
            write(record, results_path)
        # A resumed fine-tuning run continues from its own checkpoint, which holds the pretrained start.
        init_from = Path(pretrained["checkpoint"]) if pretrained and not resume_from else None
        record.update(**fit_and_test(cfg, output_dir, resume_from, world_size, headline, stage=stage, init_from=init_from))
        record.status = "finished"
    except Exception as error:
        record.update(status="failed", error=f"{type(error).__name__}: {error}")
        file_log.error("%s failed", cell, exc_info=error)
        log.error("error: %s failed: %s", cell, record.error)
        log.error(
            "The traceback is in %s (HYDRA_FULL_ERROR=1 prints it here); the error is recorded in %s",
            output_dir / "train.log",
            results_path,
        )
        raise RunFailed(record) from error
    except BaseException as error:  # KeyboardInterrupt (Lightning turns it into SystemExit): keep last.ckpt to resume
        record.update(status="interrupted", error=f"{type(error).__name__}: {error}")
        log.error(
            "Interrupted: running the same command again resumes from %s", Path(cfg.callbacks.checkpoint.dirpath) / "last.ckpt"
        )
        raise
    finally:
        record.update(wall_time_s=round(time.perf_counter() - start, 1), finished_at=results.now())
        if record.status != "running":  # "running": skipped, nothing to write
            write(record, results_path)
    if rank_zero_only.rank != 0:
        return record
    log.info(
        "%s: best val acc %.4f at step %d, test acc %.4f. Results: %s",
        cell,
        record.best_val_acc,
        record.best_val_step,
        record.test_acc,
        results_path,
    )
    return record


@hydra.main(version_base="1.3", config_path="conf", config_name=config.CONFIG_NAME)
def main(cfg: DictConfig) -> float | None:
    quiet_library_noise()
    hydra_config = HydraConfig.get()
    # The table row: the preset (conf/attention/<preset>.yaml) plus any command-line change to it.
    changes = [o for o in hydra_config.overrides.task if o.split("=", 1)[0].lstrip("+~").startswith("attention.")]
    row = " ".join([hydra_config.runtime.choices["attention"], *sorted(changes)])
    try:
        record = train(cfg, Path(hydra_config.runtime.output_dir), row=row)
    except RunFailed as failure:
        if hydra_config.mode == RunMode.MULTIRUN:
            return None  # recorded; the other cells go on and the sweep's summary reports it
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise failure.__cause__ from None
        sys.exit(1)
    return record.best_val_acc


if __name__ == "__main__":
    if problem := unknown_hparam_overrides(sys.argv[1:]):
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    main()
