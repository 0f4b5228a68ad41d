"""Train and test one configured run with Lightning: the part of ``python -m lra.train`` that needs the model.

:mod:`lra.run` imports this module only when a run actually trains, so that composing a
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
from pytorch_lightning.callbacks import ModelCheckpoint, ProgressBar

from . import checkpoints, devices, results
from .callbacks import AtomicCheckpointIO, CheckpointOnInterrupt, RunIdentity, steps_per_second, timed_machine_load
from .datamodule import LRADataModule
from .module import (
    LRAClassificationModule,
    LRAMaskedLMModule,
    LRAModule,
    compile_backend,
    compile_mode,
    compile_model,
    load_pretrained_encoder,
)
from .results import CLASSIFICATION, PRETRAINING

log = logging.getLogger(__name__)


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


HARNESS_SETTINGS = ("compile", "compile_mode")  # trainer.* settings of the harness's, not Trainer arguments


def trainer_arguments(cfg: DictConfig, row: str | None = None) -> tuple[dict[str, Any], str | None, str | None]:
    """The Trainer's arguments from ``conf/trainer``, the ``torch.compile`` backend, if any, and its mode, if any:
    ``trainer.compile`` and ``trainer.compile_mode`` are the harness's (:func:`lra.module.compile_model`), not Trainer
    arguments. ``row``: the table row the run is a cell of, which ``trainer.compile=auto`` decides by."""
    compile_with = compile_backend(cfg.trainer.get("compile", False), row, cfg.trainer.get("accelerator"))
    mode = compile_mode(cfg.trainer.get("compile_mode"), compile_with)
    arguments = {key: value for key, value in cfg.trainer.items() if key not in HARNESS_SETTINGS}
    if compile_with is not None:
        # Fit's evaluations run under no_grad; testing under inference_mode would compile the model once more.
        arguments.setdefault("inference_mode", False)
    return arguments, compile_with, mode


def build_datamodule(cfg: DictConfig, world_size: int) -> LRADataModule:
    """The task's data in batches of each process's share of the protocol's batch."""
    return LRADataModule(
        task=cfg.task.name,
        seq_len=cfg.task.seq_len,
        data=OmegaConf.to_container(cfg.task.data, resolve=True),
        batch_size=cfg.task.protocol.batch_size // world_size,
        num_workers=cfg.num_workers,
        seed=cfg.seed,
    )


def build_module(cfg: DictConfig, stage: str, init_from: Path | None) -> LRAModule:
    """The model and its optimisation for ``stage``: masked prediction for pretraining, else the classifier, whose
    encoder starts from the pretraining checkpoint ``init_from`` where given."""
    protocol = cfg.task.protocol
    arguments = dict(
        task=cfg.task.name,
        seq_len=cfg.task.seq_len,
        model=OmegaConf.to_container(cfg.model, resolve=True),
        attention=OmegaConf.to_container(cfg.attention, resolve=True),
        lr=protocol.lr,
        warmup_steps=protocol.warmup_steps,
        max_steps=protocol.max_steps,
        weight_decay=protocol.weight_decay,
        skip_non_finite_steps=bool(protocol.skip_non_finite_steps),  # checked with the protocol (lra.config.checked)
    )
    if stage == PRETRAINING:
        return LRAMaskedLMModule(**arguments, mask_rate=cfg.pretrain.mask_rate)
    module = LRAClassificationModule(**arguments)
    if init_from is not None:
        load_pretrained_encoder(module, init_from)
    return module


def build_trainer(
    cfg: DictConfig, output_dir: Path, resume_from: Path | None, arguments: dict[str, Any], identity: RunIdentity | None = None
) -> pl.Trainer:
    """The Trainer of ``conf/trainer`` with the callbacks of ``conf/callbacks``, the logger of ``conf/logger`` and the
    protocol's steps and evaluation schedule."""
    protocol = cfg.task.protocol
    callbacks = [instantiate(node, f"callbacks.{name}") for name, node in cfg.callbacks.items()]
    callbacks += [identity] if identity is not None else []
    if not cfg.trainer.enable_progress_bar:  # Lightning refuses a progress bar callback it was told not to show
        callbacks = [callback for callback in callbacks if not isinstance(callback, ProgressBar)]
    # A resumed run continues metrics.csv from the checkpoint's step (Lightning would start it afresh).
    resume_step = checkpoints.step(resume_from) if resume_from else None  # read safely before Lightning unpickles it
    resume = {"resume_step": resume_step} if resume_from and "resume_step" in cfg.logger else {}
    trainer = pl.Trainer(
        **arguments,
        max_steps=protocol.max_steps,
        val_check_interval=protocol.val_check_interval,
        check_val_every_n_epoch=None,
        # Batches are global (each process reads its share of each, see LRADataModule), so a DDP
        # run evaluates on the samples the single-process run does.
        limit_val_batches=protocol.limit_val_batches,
        use_distributed_sampler=False,
        callbacks=callbacks,
        plugins=[AtomicCheckpointIO()],  # every checkpoint written whole or not at all, beside its target
        logger=instantiate(cfg.logger, "the logger", **resume),
        log_every_n_steps=min(50, protocol.val_check_interval),
        default_root_dir=output_dir,
    )
    if not isinstance(trainer.checkpoint_callback, ModelCheckpoint):
        raise ValueError("the callbacks must include a ModelCheckpoint (callbacks.checkpoint): its best checkpoint is tested")
    return trainer


def single_process_tester(trainer: pl.Trainer, cfg: DictConfig, arguments: dict[str, Any]) -> pl.Trainer | None:
    """The Trainer that tests after ``trainer`` trained: itself, or after a distributed run a single-process one on
    rank 0 (a distributed sampler would pad the test set with repeated samples) and None on the other ranks."""
    if trainer.world_size == 1:
        return trainer
    if trainer.global_rank != 0:
        return None
    device = trainer.strategy.root_device
    torch.distributed.destroy_process_group()
    return pl.Trainer(
        accelerator=cfg.trainer.accelerator,
        devices=[device.index] if device.type == "cuda" else 1,
        precision=cfg.trainer.precision,
        logger=False,
        enable_progress_bar=cfg.trainer.enable_progress_bar,
        inference_mode=arguments.get("inference_mode", True),
    )


def what_trained(trainer: pl.Trainer, module: LRAModule) -> dict[str, Any]:
    """The record's keys of what training did, read from the Trainer that trained (the strategy may differ from what
    the config asked for)."""
    best = trainer.checkpoint_callback.best_model_path
    if not best:
        raise RuntimeError("training ended without a validation checkpoint; check val_check_interval and max_steps")
    return dict(
        num_parameters=sum(p.numel() for p in module.parameters()),
        steps=trainer.global_step,
        steps_per_second=steps_per_second(trainer.callbacks),  # training steps only (lra.callbacks.TrainingSpeed)
        machine_load=timed_machine_load(trainer.callbacks),
        processes=trainer.world_size,
        best_val_acc=float(trainer.checkpoint_callback.best_model_score),
        best_val_step=checkpoints.step(Path(best)),  # read safely before Lightning tests it
        best_checkpoint=str(best),
        **({"skipped_steps": module.skipped_steps} if module.hparams.skip_non_finite_steps else {}),
    )


def fit_and_test(
    cfg: DictConfig,
    output_dir: Path,
    resume_from: Path | None,
    world_size: int,
    headline: str,
    stage: str = CLASSIFICATION,
    init_from: Path | None = None,
    config_hash: str | None = None,
    row: str | None = None,
) -> dict[str, Any]:
    """Train ``stage``'s model (from ``resume_from`` if given; the classifier's encoder from the pretraining checkpoint
    ``init_from``), test its best-validation checkpoint; return the :class:`lra.results.RunRecord` keys it measured
    (none on a distributed run's ranks other than 0, which do not test). ``headline`` is logged with the parameter count.
    ``config_hash`` (the record's) stamps every checkpoint (:class:`lra.callbacks.RunIdentity`); ``row`` (the record's)
    is what ``trainer.compile=auto`` decides by.
    """
    arguments, compile_with, mode = trainer_arguments(cfg, row)
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule = build_datamodule(cfg, world_size)
    module = build_module(cfg, stage, init_from)
    log.info("%s, %s parameters", headline, f"{sum(p.numel() for p in module.parameters()):,}")
    if compile_with is not None:
        compile_model(module, compile_with, mode)
    identity = RunIdentity(config_hash, cfg.seed) if config_hash else None
    trainer = build_trainer(cfg, output_dir, resume_from, arguments, identity)
    devices.reset_peak_memory(trainer.strategy.root_device)
    on_interrupt = next((c for c in trainer.callbacks if isinstance(c, CheckpointOnInterrupt)), None)
    with without_known_warnings(), on_interrupt.stop_between_steps() if on_interrupt else nullcontext():
        trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from)
    if identity is not None and (best := trainer.checkpoint_callback.best_model_path):
        # The best checkpoint may be one a resumed run found in its folder: test only this run's.
        fix = f"delete {Path(best).parent} and run the same command again to train this configuration from the start"
        checkpoints.read_own(Path(best), config_hash, cfg.seed, fix)
    trained = what_trained(trainer, module)
    best = trained["best_checkpoint"]
    device = trainer.strategy.root_device
    if (tester := single_process_tester(trainer, cfg, arguments)) is None:
        return {}
    with without_known_warnings():
        test_metrics = tester.test(module, datamodule=datamodule, ckpt_path=best, verbose=False)[0]
    tested = {**tested_run_keys(cfg, datamodule, device, compile_with, trained, test_metrics), "compile_mode": mode}
    if (correct := module.test_correct()) is not None:  # a classifier's test: which samples it classified correctly
        tested["test_correct"] = correct
    return tested


def tested_run_keys(
    cfg: DictConfig,
    datamodule: LRADataModule,
    device: torch.device,
    compile_with: str | None,
    trained: dict[str, Any],
    test_metrics: dict[str, float],
) -> dict[str, Any]:
    """The run record's keys of a tested run: what ``trained`` holds, what was tested on and how well, and on what."""
    peak_memory, peak_memory_kind = devices.peak_memory_mb(device)
    task_data = datamodule.task_data
    return {
        **trained,
        "data_source": task_data.data_source,
        "data_folder": str(task_data.folder),
        "data_prepared_from": task_data.manifest["source"]["path"],
        "num_samples": {split: len(data) for split, data in task_data.splits.items()},
        "test_acc": test_metrics["test/acc"],
        "test_loss": test_metrics["test/loss"],
        "peak_memory_mb": round(peak_memory, 1),
        "peak_memory_kind": peak_memory_kind,
        "device": devices.device_name(device),
        "precision": results.precision_name(cfg.trainer.precision),
        "compiled": compile_with is not None,
        "compile_backend": compile_with,
    }
