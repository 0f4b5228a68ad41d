"""Train and test one configured run with Lightning: the part of ``python -m lra.train`` that needs the model.

:mod:`lra.train` imports this module only when a run actually trains, so that composing a
configuration (``--cfg job``, ``--help``) does not pay for Lightning, the model and the data.
The Trainer's arguments come from ``conf/trainer``, its callbacks from ``conf/callbacks`` and its
logger from ``conf/logger``; the protocol adds the number of steps and the evaluation schedule.
"""

from __future__ import annotations

import importlib
import logging
import warnings
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import hydra
import pytorch_lightning as pl
import torch
from hydra.errors import InstantiationException
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.callbacks import Callback, ModelCheckpoint, ProgressBar

from . import results
from .callbacks import CheckpointOnInterrupt, steps_per_second
from .datamodule import LRADataModule
from .module import (
    LRAClassificationModule,
    LRAMaskedLMModule,
    compile_backend,
    compile_model,
    load_pretrained_encoder,
    read_checkpoint,
)

log = logging.getLogger(__name__)
# Lines for train.log only (conf/hydra/job_logging/lra.yaml): each evaluation.
file_log = logging.getLogger("lra.train.file")


class EvaluationLog(Callback):
    """Each evaluation's result into train.log, as it happens (the console has the progress bar)."""

    def on_validation_epoch_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            metrics = {key: float(value) for key, value in trainer.callback_metrics.items() if key.startswith("val/")}
            file_log.info("step %d: %s", trainer.global_step, ", ".join(f"{k} {v:.4f}" for k, v in sorted(metrics.items())))


@contextmanager
def without_known_warnings():
    """Silence Lightning's and torch's warnings about this harness's deliberate choices, for one block.

    A deprecation inside Lightning that torch announces on every run; no loader workers on a CPU,
    where they would compete with the model for the cores; shuffled validation batches, a fresh
    random subset at each evaluation like the original dev stream; the callbacks a
    single-process test after a DDP run does not need; and, on a resume, the run's own checkpoint
    folder holding its checkpoints, and the loader starting the interrupted epoch's batches afresh
    (it keeps no position; the README's resume paragraph says so).
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)
        warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=r".*sampler has shuffling enabled.*")
        warnings.filterwarnings("ignore", message=r".*callbacks used to create the checkpoint need to be provided.*")
        warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
        warnings.filterwarnings("ignore", message=r".*resuming from a checkpoint that ended before the epoch ended.*")
        yield


def instantiate(node: DictConfig, what: str, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate``, with a missing optional package (tensorboard, wandb) or a name its module
    does not have named in one message."""
    try:
        return hydra.utils.instantiate(node, **kwargs)
    except InstantiationException as error:
        module, _, name = node._target_.rpartition(".")
        try:
            missing_name = not hasattr(importlib.import_module(module), name)
        except ImportError:
            missing_name = False
        if missing_name:
            raise RuntimeError(
                f"{what}: {module} has no {name!r} (a typo in the config, or a process started before the code "
                "changed, such as a long sweep: it still runs the code it imported)"
            ) from None
        if isinstance(error.__cause__, ModuleNotFoundError | ImportError):
            raise RuntimeError(f"{what} ({node._target_}) needs a package that is not installed: {error.__cause__}") from None
        raise


def checkpoint_step(path: Path) -> int:
    """The global step a Lightning checkpoint was saved at (read safely: :func:`read_checkpoint`)."""
    return read_checkpoint(path)["global_step"]


def fit_and_test(
    cfg: DictConfig,
    output_dir: Path,
    resume_from: Path | None,
    world_size: int,
    headline: str,
    stage: str = "classification",
    init_from: Path | None = None,
) -> dict[str, Any]:
    """Train (from ``resume_from`` if given), test the best-validation checkpoint; return what it measured, the
    :class:`lra.results.RunRecord` keys it records (``record.update(**measured)``).

    ``headline`` (the cell, its protocol and its folder) is logged with the model's parameter count, once built.

    ``stage`` ``pretraining`` trains ``cfg.pretrain``'s objective (masked prediction) instead of the
    classifier; ``init_from`` is a pretraining checkpoint the classifier's encoder starts from.
    """
    protocol = cfg.task.protocol
    # trainer.compile is the harness's (lra.module.compile_model), not a Trainer argument.
    compile_with = compile_backend(cfg.trainer.get("compile", False))
    trainer_args = {key: value for key, value in cfg.trainer.items() if key != "compile"}
    if compile_with is not None:
        # Fit's evaluations run under no_grad; testing under inference_mode would compile the model once more.
        trainer_args.setdefault("inference_mode", False)
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule = LRADataModule(
        task=cfg.task.name,
        seq_len=cfg.task.seq_len,
        data=OmegaConf.to_container(cfg.task.data, resolve=True),
        batch_size=protocol.batch_size // world_size,
        num_workers=cfg.num_workers,
        seed=cfg.seed,
    )
    settings = dict(
        task=cfg.task.name,
        seq_len=cfg.task.seq_len,
        model=OmegaConf.to_container(cfg.model, resolve=True),
        attention=OmegaConf.to_container(cfg.attention, resolve=True),
        lr=protocol.lr,
        warmup_steps=protocol.warmup_steps,
        max_steps=protocol.max_steps,
        weight_decay=protocol.weight_decay,
    )
    if stage == "pretraining":
        module = LRAMaskedLMModule(**settings, mask_rate=cfg.pretrain.mask_rate)
    else:
        module = LRAClassificationModule(**settings)
        if init_from is not None:
            load_pretrained_encoder(module, init_from)
    num_parameters = sum(p.numel() for p in module.parameters())
    log.info("%s, %s parameters", headline, f"{num_parameters:,}")
    if compile_with is not None:
        compile_model(module, compile_with)
    callbacks = [instantiate(node, f"callbacks.{name}") for name, node in cfg.callbacks.items()]
    if not cfg.trainer.enable_progress_bar:  # Lightning refuses a progress bar callback it was told not to show
        callbacks = [callback for callback in callbacks if not isinstance(callback, ProgressBar)]
    # A resumed run continues metrics.csv from the checkpoint's step (Lightning would start it afresh).
    resume_step = checkpoint_step(resume_from) if resume_from else None  # read safely before Lightning unpickles it
    resume = {"resume_step": resume_step} if resume_from and "resume_step" in cfg.logger else {}
    logger = instantiate(cfg.logger, "the logger", **resume)
    trainer = pl.Trainer(
        **trainer_args,
        max_steps=protocol.max_steps,
        val_check_interval=protocol.val_check_interval,
        check_val_every_n_epoch=None,
        # Batches are global (each process reads its share of each, see LRADataModule), so a DDP
        # run evaluates on the samples the single-process run does.
        limit_val_batches=protocol.limit_val_batches,
        use_distributed_sampler=False,
        callbacks=callbacks,
        logger=logger,
        log_every_n_steps=min(50, protocol.val_check_interval),
        default_root_dir=output_dir,
    )
    checkpoint = trainer.checkpoint_callback
    if not isinstance(checkpoint, ModelCheckpoint):
        raise ValueError("the callbacks must include a ModelCheckpoint (callbacks.checkpoint): its best checkpoint is tested")
    results.reset_peak_memory(trainer.strategy.root_device)
    on_interrupt = next((c for c in trainer.callbacks if isinstance(c, CheckpointOnInterrupt)), None)
    with without_known_warnings(), on_interrupt.stop_between_steps() if on_interrupt else nullcontext():
        trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from)
    if not checkpoint.best_model_path:
        raise RuntimeError("training ended without a validation checkpoint; check val_check_interval and max_steps")
    best_val_step = checkpoint_step(Path(checkpoint.best_model_path))  # read safely before Lightning tests it
    # What actually ran (the strategy may differ from what the config asked for).
    device, steps, world_size = trainer.strategy.root_device, trainer.global_step, trainer.world_size
    if trainer.world_size > 1:
        # The test runs once, on rank 0 alone: a distributed sampler would pad the test set with
        # repeated samples. The other ranks are done.
        if trainer.global_rank != 0:
            return {}
        torch.distributed.destroy_process_group()
        trainer = pl.Trainer(
            accelerator=cfg.trainer.accelerator,
            devices=[device.index] if device.type == "cuda" else 1,
            precision=cfg.trainer.precision,
            logger=False,
            enable_progress_bar=cfg.trainer.enable_progress_bar,
            inference_mode=trainer_args.get("inference_mode", True),
        )
    with without_known_warnings():
        test_metrics = trainer.test(module, datamodule=datamodule, ckpt_path=checkpoint.best_model_path, verbose=False)[0]
    peak_memory, peak_memory_kind = results.peak_memory_mb(device)
    return {
        "data_source": datamodule.task_data.data_source,
        "data_folder": str(datamodule.task_data.folder),
        "data_prepared_from": datamodule.task_data.manifest["source"]["path"],
        "num_samples": {split: len(data) for split, data in datamodule.task_data.splits.items()},
        "num_parameters": num_parameters,
        "steps": steps,
        "steps_per_second": steps_per_second(callbacks),  # training steps only (lra.callbacks.TrainingSpeed)
        "processes": world_size,
        "best_val_acc": float(checkpoint.best_model_score),
        "best_val_step": best_val_step,
        "test_acc": test_metrics["test/acc"],
        "test_loss": test_metrics["test/loss"],
        "best_checkpoint": str(checkpoint.best_model_path),
        "peak_memory_mb": round(peak_memory, 1),
        "peak_memory_kind": peak_memory_kind,
        "device": results.device_name(device),
        "precision": str(cfg.trainer.precision),
        "compiled": compile_with is not None,
        "compile_backend": compile_with,
    }
