"""Train and test one LRA cell: ``python -m lra.train [task=...] [attention=...] [overrides]``.

The run trains for the task's ``max_steps``, evaluates every ``val_check_interval`` steps on
``limit_val_batches`` shuffled validation batches, keeps the best-validation checkpoint, tests it on
the whole test set and writes ``results.json`` into the run's output folder. The folder is named by
the task, the attention and the command-line overrides, so re-running a finished cell with the same
settings is skipped.
"""

from __future__ import annotations

import hashlib
import logging
import os
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
from pytorch_lightning.callbacks import LearningRateMonitor, ModelCheckpoint
from pytorch_lightning.loggers import CSVLogger

import attention_zoo

from . import results
from .datamodule import LRADataModule
from .data.tasks import get_spec
from .model import LRAClassifier, LRADualClassifier, LRAEncoder
from .module import LRAClassificationModule

log = logging.getLogger(__name__)

MAX_RUN_NAME = 120  # file names are limited to 255 bytes


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

# Deliberate choices of the protocol that Lightning would otherwise warn about on every run:
# zero loader workers on a CPU (workers would compete with the model for the cores) and shuffled
# validation batches (each evaluation sees a fresh random subset, like the original dev stream).
warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
warnings.filterwarnings("ignore", message=r".*sampler has shuffling enabled.*")
# Under DDP the best checkpoint is tested by a fresh single-process Trainer that does not need the
# training callbacks.
warnings.filterwarnings("ignore", message=r".*callbacks used to create the checkpoint need to be provided.*")


def defining_config(cfg: DictConfig) -> dict[str, Any]:
    """The settings that determine a run's result (not where it writes or on which device)."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    return {key: resolved[key] for key in ("task", "attention", "model", "seed")}


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


def fit_and_test(cfg: DictConfig, output_dir: Path, resume_from: Path | None = None) -> dict[str, Any]:
    """Train (from ``resume_from`` if given), test the best-validation checkpoint; return the measured part of the record."""
    protocol = cfg.task.protocol
    if protocol.val_check_interval > protocol.max_steps:
        raise ValueError(
            f"val_check_interval={protocol.val_check_interval} exceeds max_steps={protocol.max_steps}: "
            "the run would never evaluate and have no best checkpoint to test"
        )
    world_size = processes(cfg.trainer)
    if protocol.batch_size % world_size:
        raise ValueError(
            f"batch_size={protocol.batch_size} does not divide over {world_size} processes; "
            "the protocol's batch is the total over all devices"
        )
    pl.seed_everything(cfg.seed, workers=True)
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
    trainer = pl.Trainer(
        accelerator=cfg.trainer.accelerator,
        devices=cfg.trainer.devices,
        num_nodes=cfg.trainer.get("num_nodes", 1),
        strategy=cfg.trainer.get("strategy", "auto"),
        precision=cfg.trainer.precision,
        max_steps=protocol.max_steps,
        val_check_interval=protocol.val_check_interval,
        check_val_every_n_epoch=None,
        # Batches are global (each process reads its share of each, see LRADataModule), so a DDP
        # run evaluates on the samples the single-process run does.
        limit_val_batches=protocol.limit_val_batches,
        use_distributed_sampler=False,
        callbacks=[checkpoint, LearningRateMonitor(logging_interval="step")],
        logger=CSVLogger(output_dir, name="", version="metrics"),
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
    test_metrics = trainer.test(module, datamodule=datamodule, ckpt_path=checkpoint.best_model_path)[0]
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


def train(cfg: DictConfig, output_dir: Path, keep_going: bool = False, row: str | None = None) -> dict[str, Any]:
    """Run one cell unless ``output_dir`` already holds its finished result; return the record.

    An earlier interrupted or failed run of the same configuration resumes from its last
    checkpoint. With ``keep_going`` (a multirun sweep) an exception is recorded in
    ``results.json`` and returned instead of raised, so that the other cells still run. ``row``
    names the table row the run belongs to (the attention preset and any overrides of it).
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    results_path = output_dir / results.RESULTS_FILE
    defining = defining_config(cfg)
    config_hash = results.config_hash(defining)
    previous = results.read(results_path)
    same_config = previous is not None and previous.get("config_hash") == config_hash
    if same_config and previous.get("status") == "finished":
        log.info("Skipping: %s already holds a finished run of this configuration (%s)", results_path, config_hash)
        return previous
    last_checkpoint = output_dir / "checkpoints" / "last.ckpt"
    resume_from = last_checkpoint if same_config and last_checkpoint.is_file() else None
    if resume_from:
        log.info("Resuming the interrupted run from %s", resume_from)

    attention_config = attention_zoo.make_config(cfg.attention.name, **defining["attention"]["hparams"])
    record: dict[str, Any] = {
        "task": cfg.task.name,
        "attention": cfg.attention.name,
        "row": row or cfg.attention.name,
        "attention_hparams": dict(vars(attention_config)),
        "seed": cfg.seed,
        "protocol": defining["task"]["protocol"],
        "model": defining["model"],
        "config_hash": config_hash,
        "git_commit": results.git_commit(),
        "torch_version": torch.__version__,
        "lightning_version": pl.__version__,
        "started_at": results.now(),
        "status": "running",
    }
    if resume_from:
        record["resumed_from"] = str(resume_from)
    writer = is_rank_zero()
    if writer:
        results.write(results_path, record)
    start = time.perf_counter()
    try:
        record.update(fit_and_test(cfg, output_dir, resume_from))
        record["status"] = "finished"
    except Exception as error:
        record.update(status="failed", error=f"{type(error).__name__}: {error}")
        if not keep_going:
            raise
        log.exception("This cell failed; its error is recorded in %s and the sweep goes on", results_path)
        return record
    except BaseException as error:  # KeyboardInterrupt, SystemExit: stop the sweep, keep last.ckpt to resume
        record.update(status="interrupted", error=f"{type(error).__name__}: {error}")
        raise
    finally:
        record.update(wall_time_s=round(time.perf_counter() - start, 1), finished_at=results.now())
        if writer:
            results.write(results_path, record)
    if not writer:
        return record
    log.info(
        "%s / %s: best val acc %.4f at step %d, test acc %.4f. Results: %s",
        record["task"], record["attention"], record["best_val_acc"], record["best_val_step"], record["test_acc"],
        results_path,
    )
    return record


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    hydra_config = HydraConfig.get()
    # The table row: the preset (conf/attention/<preset>.yaml) plus any command-line change to it.
    changes = [o for o in hydra_config.overrides.task if o.split("=", 1)[0].lstrip("+~").startswith("attention.")]
    row = " ".join([hydra_config.runtime.choices["attention"], *sorted(changes)])
    keep_going = hydra_config.mode == RunMode.MULTIRUN
    record = train(cfg, Path(hydra_config.runtime.output_dir), keep_going=keep_going, row=row)
    return record.get("best_val_acc")


if __name__ == "__main__":
    main()
