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

This module is the entry point only: the run's logging, Hydra's ``main`` and the command line's own checks. What
a run does, from finding a finished run of its configuration to recording its own, is :mod:`lra.run`.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from . import config, run, run_lock

config.register()  # before @hydra.main composes: the attention_zoo group and the resolvers


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
    # Only the summary's size estimate in MB is affected (it assumes 32 bits), and the run prints its own parameter
    # count: under bf16-mixed this warning was the one line of a default run's console not of this harness.
    warnings.filterwarnings("ignore", message=r"Precision .* is not supported by the model summary")


@hydra.main(version_base="1.3", config_path="conf", config_name=config.CONFIG_NAME)
def main(cfg: DictConfig) -> float | None:
    quiet_library_noise()
    hydra_config = HydraConfig.get()
    row = config.row_name(hydra_config.runtime.choices["attention"], hydra_config.overrides.task)
    try:
        record = run.train(cfg, Path(hydra_config.runtime.output_dir), row=row)
    except run_lock.RunFolderBusy as busy:
        # Printed, not logged: train.log and results.json are the holder's, and nothing of this process goes there.
        print(f"error: {busy}", file=sys.stderr, flush=True)
        if hydra_config.mode == RunMode.MULTIRUN:
            return None  # the sweep's summary names the holder (lra/sweep.py)
        sys.exit(1)
    except run.RunFailed as failure:
        if hydra_config.mode == RunMode.MULTIRUN:
            return None  # recorded; the other cells go on and the sweep's summary reports it
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise failure.__cause__ from None
        sys.exit(1)
    return record.best_val_acc


def cli() -> None:
    """``python -m lra.train`` and ``lra-train``: the overrides Hydra would refuse with its own words, and values the
    run would refuse (:func:`lra.config.value_problem`), are refused first, in one line that names the fix and before
    anything is written; then the run."""
    arguments = sys.argv[1:]
    if problem := config.unknown_option(arguments):
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(1)
    if problem := config.unknown_hparam_overrides(arguments) or config.renamed_model_overrides(arguments):
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(1)
    # Before Hydra makes the run's folder, so that nothing is left behind; with HYDRA_FULL_ERROR=1 the run itself
    # refuses them, with the traceback asked for.
    if os.environ.get("HYDRA_FULL_ERROR") != "1" and (problem := config.value_problem(arguments)):
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(1)
    main()


if __name__ == "__main__":
    cli()
