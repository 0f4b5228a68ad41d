"""Train and test one LRA cell: ``python -m lra.train [task=...] [attention=...] [overrides]``.

The run trains for the task's ``max_steps``, evaluates every ``val_check_interval`` steps on
``limit_val_batches`` shuffled validation batches, keeps the best-validation checkpoint, tests it on
the whole test set and writes ``results.json`` into the run's output folder. The folder is named by
the task, the attention and the command-line overrides, so re-running a finished cell with the same
settings is skipped, and re-running an interrupted one resumes it.

A run that fails, before training or during it, prints one message, records the error in
``results.json`` (status ``failed``) and exits with status 1; its traceback goes to the run's
``train.log`` (``HYDRA_FULL_ERROR=1`` prints it on the console instead). In a multirun sweep the
other cells go on and the sweep ends with a summary (``lra/sweep.py``).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import hydra
import pytorch_lightning as pl
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.callbacks import Callback, LearningRateMonitor, ModelCheckpoint

import attention_zoo

from . import results
from .datamodule import LRADataModule
from .data.tasks import get_spec
from .model import LRAClassifier, LRADualClassifier, LRAEncoder
from .module import LRAClassificationModule

log = logging.getLogger(__name__)
# Lines for train.log only (conf/hydra/job_logging/lra.yaml): each evaluation, a failure's traceback.
file_log = logging.getLogger("lra.train.file")

MAX_RUN_NAME = 120  # file names are limited to 255 bytes
# The protocol's fields and their types: anything else in task.protocol is an error, not ignored.
PROTOCOL_FIELDS = {
    "name": str, "batch_size": int, "max_steps": int, "warmup_steps": int, "val_check_interval": int,
    "limit_val_batches": int, "lr": float, "weight_decay": float,
}
WARMUP_SHARE_WHEN_SHORTENED = 0.1  # the warmup of a run shortened below its warmup: a tenth of its steps
# Where a result is recorded, the data paths are machine-specific and say nothing about the run.
DATA_PATH_KEYS = ("source_dir", "cache_dir", "generated_dir")


class RunFailed(Exception):
    """A run failed; its error is recorded in ``results.json``, the original exception is the cause."""

    def __init__(self, record: dict[str, Any]) -> None:
        super().__init__(record["error"])
        self.record = record


def run_name(overrides: str) -> str:
    """The run folder's name: the command-line overrides, "default" for none.

    A long list is cut and suffixed with a hash of the whole list, so the name stays unique and
    within file-name limits; the full list is in the run's ``.hydra/overrides.yaml``.
    """
    if not overrides:
        return "default"
    if len(overrides) <= MAX_RUN_NAME:
        return overrides
    digest = hashlib.sha256(overrides.encode()).hexdigest()[:12]
    return f"{overrides[: MAX_RUN_NAME - 13]}-{digest}"


OmegaConf.register_new_resolver("lra_run_name", run_name, replace=True)


def not_an_advertisement(record: logging.LogRecord) -> bool:
    return "litlogger" not in record.getMessage()


def quiet_library_noise() -> None:
    """Keep what the libraries print to what a user needs, and send Lightning's messages to train.log.

    Called once the run's logging is configured. Silenced: Lightning's advertisement for its cloud
    logger; a deprecation inside Lightning that torch announces on every run; torch's note that no
    CUDA runtime is found, printed when YOSO's kernels are loaded on a CPU-only machine (the kernels
    report what they built themselves); and Lightning's warnings about two deliberate choices of the
    protocol (no loader workers on a CPU, where they would compete with the model for the cores;
    shuffled validation batches, a fresh random subset at each evaluation like the original dev
    stream) and about the callbacks a single-process test does not need under DDP.
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
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=r".*sampler has shuffling enabled.*")
    warnings.filterwarnings("ignore", message=r".*callbacks used to create the checkpoint need to be provided.*")


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
        adjusted["warmup_steps"] = {"from": protocol.warmup_steps, "to": warmup,
                                    "why": f"must be below max_steps={steps}; a tenth of it"}
    if protocol.val_check_interval > steps:
        adjusted["val_check_interval"] = {"from": protocol.val_check_interval, "to": steps,
                                          "why": f"must not exceed max_steps={steps}, so the run is evaluated"}
    for key, change in adjusted.items():
        protocol[key] = change["to"]
        log.warning("Adjusted task.protocol.%s from %s to %s (%s)", key, change["from"], change["to"], change["why"])
    return adjusted


def defining_config(cfg: DictConfig) -> dict[str, Any]:
    """The settings that determine a run's result (not where it writes or on which device)."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    return {key: resolved[key] for key in ("task", "attention", "model", "seed")}


def recorded_data_settings(task: dict[str, Any]) -> dict[str, Any]:
    """What ``results.json`` records of ``task.data``: every setting but the machine's paths."""
    return {key: value for key, value in task["data"].items() if key not in DATA_PATH_KEYS}


def build_module(cfg: DictConfig) -> LRAClassificationModule:
    task, model, protocol = cfg.task, cfg.model, cfg.task.protocol
    encoder = LRAEncoder(
        vocab_size=task.vocab_size,
        seq_len=task.seq_len,
        attention=cfg.attention.name,
        attention_hparams=OmegaConf.to_container(cfg.attention.hparams, resolve=True),
        dim=model.dim,
        depth=model.depth,
        num_heads=model.num_heads,
        head_dim=model.head_dim,
        ffn_dim=model.ffn_dim,
        dropout=model.dropout,
        attention_in_fp32=model.attention_in_fp32,
    )
    dual = len(get_spec(task.name).inputs) == 2
    classifier = (LRADualClassifier if dual else LRAClassifier)(task.num_classes, encoder, hidden_dim=model.head_hidden_dim)
    return LRAClassificationModule(
        classifier,
        num_classes=task.num_classes,
        lr=protocol.lr,
        warmup_steps=protocol.warmup_steps,
        max_steps=protocol.max_steps,
        weight_decay=protocol.weight_decay,
    )


def is_rank_zero() -> bool:
    """Whether this process is rank 0 of a distributed run (or not distributed): only it writes
    ``results.json``. Read from the launchers' environment, since it is needed before the Trainer
    exists (Lightning's own launcher sets LOCAL_RANK / NODE_RANK, torchrun RANK, srun SLURM_PROCID)."""
    if "RANK" in os.environ:
        return int(os.environ["RANK"]) == 0
    if int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        return int(os.environ.get("SLURM_PROCID", "0")) == 0
    return int(os.environ.get("LOCAL_RANK", "0")) == 0 and int(os.environ.get("NODE_RANK", "0")) == 0


def processes(trainer_cfg: DictConfig) -> int:
    """How many training processes the trainer config asks for (devices x nodes)."""
    devices = trainer_cfg.devices
    if isinstance(devices, str) or (isinstance(devices, int) and devices < 1):
        raise ValueError(f"trainer.devices must be a device count or a list of devices, got {devices!r}")
    per_node = devices if isinstance(devices, int) else len(devices)
    return per_node * trainer_cfg.get("num_nodes", 1)


class EvaluationLog(Callback):
    """Each evaluation's result into train.log, as it happens (the console has the progress bar)."""

    def on_validation_epoch_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            metrics = {key: float(value) for key, value in trainer.callback_metrics.items() if key.startswith("val/")}
            file_log.info("step %d: %s", trainer.global_step, ", ".join(f"{k} {v:.4f}" for k, v in sorted(metrics.items())))


def fit_and_test(cfg: DictConfig, output_dir: Path, resume_from: Path | None = None) -> dict[str, Any]:
    """Train (from ``resume_from`` if given), test the best-validation checkpoint; return the measured part of the record."""
    protocol = cfg.task.protocol
    world_size = processes(cfg.trainer)
    if protocol.batch_size % world_size:
        raise ValueError(
            f"batch_size={protocol.batch_size} does not divide over {world_size} processes; "
            "the protocol's batch is the total over all devices"
        )
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule = LRADataModule(
        task=cfg.task.name,
        seq_len=cfg.task.seq_len,
        data=OmegaConf.to_container(cfg.task.data, resolve=True),
        batch_size=protocol.batch_size // world_size,
        num_workers=cfg.trainer.num_workers,
        seed=cfg.seed,
    )
    module = build_module(cfg)
    checkpoint = ModelCheckpoint(
        dirpath=output_dir / "checkpoints",
        filename="best-step{step}",
        monitor="val/acc",
        mode="max",
        save_top_k=1,
        save_last=True,  # checkpoints/last.ckpt: where an interrupted run resumes
        auto_insert_metric_name=False,
    )
    # A resumed run continues metrics.csv from the checkpoint's step (Lightning would start it afresh).
    resume_step = torch.load(resume_from, map_location="cpu", weights_only=False)["global_step"] if resume_from else None
    logger = hydra.utils.instantiate(cfg.logger, save_dir=str(output_dir), resume_step=resume_step)
    trainer = pl.Trainer(
        accelerator=cfg.trainer.accelerator,
        devices=cfg.trainer.devices,
        num_nodes=cfg.trainer.get("num_nodes", 1),
        strategy=cfg.trainer.get("strategy", "auto"),
        precision=cfg.trainer.precision,
        max_steps=protocol.max_steps,
        val_check_interval=protocol.val_check_interval,
        check_val_every_n_epoch=None,
        limit_val_batches=math.ceil(protocol.limit_val_batches / world_size),
        callbacks=[checkpoint, LearningRateMonitor(logging_interval="step"), EvaluationLog()],
        logger=logger,
        log_every_n_steps=min(50, protocol.val_check_interval),
        default_root_dir=output_dir,
        enable_progress_bar=cfg.trainer.progress_bar,
    )
    trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from)
    if not checkpoint.best_model_path:
        raise RuntimeError("training ended without a validation checkpoint; check val_check_interval and max_steps")
    best_val_step, best_val_acc = max(module.validation_history, key=lambda entry: entry[1])
    # What actually ran (the strategy may differ from what the config asked for).
    device, steps, world_size = trainer.strategy.root_device, trainer.global_step, trainer.world_size
    if trainer.world_size > 1:
        # The test runs once, on rank 0 alone: a distributed sampler would pad the test set with
        # repeated samples. The other ranks are done.
        if trainer.global_rank != 0:
            return {}
        torch.distributed.destroy_process_group()
        trainer = pl.Trainer(
            accelerator=cfg.trainer.accelerator, devices=[device.index] if device.type == "cuda" else 1,
            precision=cfg.trainer.precision, logger=False, enable_progress_bar=cfg.trainer.progress_bar,
        )
    test_metrics = trainer.test(module, datamodule=datamodule, ckpt_path=checkpoint.best_model_path, verbose=False)[0]
    peak_memory, peak_memory_kind = results.peak_memory_mb(device)
    return {
        "data_source": datamodule.task_data.data_source,
        "data_folder": str(datamodule.task_data.folder),
        "data_prepared_from": datamodule.task_data.manifest["source"]["path"],
        "num_samples": {split: len(data) for split, data in datamodule.task_data.splits.items()},
        "num_parameters": sum(p.numel() for p in module.model.parameters()),
        "steps": steps,
        "processes": world_size,
        "best_val_acc": best_val_acc,
        "best_val_step": best_val_step,
        "test_acc": test_metrics["test/acc"],
        "test_loss": test_metrics["test/loss"],
        "best_checkpoint": str(checkpoint.best_model_path),
        "peak_memory_mb": round(peak_memory, 1),
        "peak_memory_kind": peak_memory_kind,
        "device": results.device_name(device),
        "precision": str(cfg.trainer.precision),
    }


def train(cfg: DictConfig, output_dir: Path, row: str | None = None) -> dict[str, Any]:
    """Run one cell unless ``output_dir`` already holds its finished result; return the record.

    An earlier interrupted or failed run of the same configuration resumes from its last
    checkpoint. Any failure, from a bad setting to an error in training, is recorded in
    ``results.json`` (status ``failed``), logged (the message on the console, the traceback in
    train.log) and raised as :class:`RunFailed`. ``row`` names the table row the run belongs to
    (the attention preset and any overrides of it).
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    results_path = output_dir / results.RESULTS_FILE
    cell = f"{cfg.task.name} / {row or cfg.attention.name} / seed {cfg.seed}"
    record: dict[str, Any] = {
        "task": cfg.task.name,
        "attention": cfg.attention.name,
        "row": row or cfg.attention.name,
        "seed": cfg.seed,
        "git_commit": results.git_commit(),
        "torch_version": torch.__version__,
        "lightning_version": pl.__version__,
        "started_at": results.now(),
        "status": "running",
    }
    writer = is_rank_zero()
    start = time.perf_counter()
    try:
        adjusted = check_protocol(cfg.task.protocol)
        defining = defining_config(cfg)
        record.update(
            protocol=defining["task"]["protocol"],
            model=defining["model"],
            seq_len=defining["task"]["seq_len"],
            data=recorded_data_settings(defining["task"]),
            config_hash=results.config_hash(defining),
            **({"adjusted": adjusted} if adjusted else {}),
        )
        previous = results.read(results_path)
        same_config = previous is not None and previous.get("config_hash") == record["config_hash"]
        if same_config and previous.get("status") == "finished":
            log.info("Skipping: %s already holds a finished run of this configuration (%s)", results_path, record["config_hash"])
            return previous
        last_checkpoint = output_dir / "checkpoints" / "last.ckpt"
        resume_from = last_checkpoint if same_config and last_checkpoint.is_file() else None
        attention_config = attention_zoo.make_config(cfg.attention.name, **defining["attention"]["hparams"])
        record["attention_hparams"] = dict(vars(attention_config))
        if resume_from:
            record["resumed_from"] = str(resume_from)
            log.info("Resuming the interrupted run from %s", resume_from)
        if writer:
            results.write(results_path, record)
        log.info("%s: %d steps of batch %d (protocol %s) -> %s", cell, cfg.task.protocol.max_steps,
                 cfg.task.protocol.batch_size, cfg.task.protocol.name, output_dir)
        record.update(fit_and_test(cfg, output_dir, resume_from))
        record["status"] = "finished"
    except Exception as error:
        record.update(status="failed", error=f"{type(error).__name__}: {error}")
        file_log.error("%s failed", cell, exc_info=error)
        log.error("error: %s failed: %s", cell, record["error"])
        log.error("The traceback is in %s (HYDRA_FULL_ERROR=1 prints it here); the error is recorded in %s",
                  output_dir / "train.log", results_path)
        raise RunFailed(record) from error
    except BaseException as error:  # KeyboardInterrupt (Lightning turns it into SystemExit): keep last.ckpt to resume
        record.update(status="interrupted", error=f"{type(error).__name__}: {error}")
        log.error("Interrupted: running the same command again resumes from %s", output_dir / "checkpoints" / "last.ckpt")
        raise
    finally:
        record.update(wall_time_s=round(time.perf_counter() - start, 1), finished_at=results.now())
        if writer and record["status"] != "running":  # "running": skipped, nothing to write
            results.write(results_path, record)
    if not writer:
        return record
    log.info(
        "%s: best val acc %.4f at step %d, test acc %.4f. Results: %s",
        cell, record["best_val_acc"], record["best_val_step"], record["test_acc"], results_path,
    )
    return record


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
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
    return record.get("best_val_acc")


if __name__ == "__main__":
    main()
