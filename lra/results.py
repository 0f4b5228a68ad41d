"""The per-run ``results.json``: what ran, on what, and how well (:class:`RunRecord`, its schema), and how a run's
record is built from its configuration (:func:`new_record`, :func:`record_configuration`, :func:`defining_config`:
the settings whose hash identifies a run)."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import subprocess
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from functools import cache
from importlib import resources
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

import attention_zoo

from .files import write_atomically

RESULTS_FILE = "results.json"
CLASSIFICATION, PRETRAINING = "classification", "pretraining"  # a run's stage (RunRecord.stage: a pretraining run's)
REPO_ROOT = Path(__file__).resolve().parent.parent


FLOAT32 = "32-true"  # Lightning's name of float32 training, the precision of every run before precision was an identity
# Lightning's short names of a precision, under the name it reports (and records keep).
PRECISION_NAMES = {"32": FLOAT32, "64": "64-true", "16": "16-mixed", "bf16": "bf16-mixed"}

# Settings added to a run's identity after runs were recorded, at the value those runs had: a run with these
# values has the config hash it had before them (config_hash), and a record without them has them (lra.table).
# A key is the setting's path: (setting,) at the top level, (part, setting) inside a part of the configuration, a
# longer one deeper; a part added whole (pretrain) is a setting of its own. A protocol's setting has a path in a
# defining config (task.protocol) and one in a record (protocol), and one in the pretraining's protocol.
ADDED_SETTINGS = {
    ("model", "positions"): "learned",
    ("pretrain",): {"objective": "none"},
    ("precision",): FLOAT32,
    ("task", "protocol", "skip_non_finite_steps"): False,
    ("protocol", "skip_non_finite_steps"): False,
    ("pretrain", "protocol", "skip_non_finite_steps"): False,
}

# What a run's identity (config_hash, and the cells lra.table pools: CONFIGURATION_KEYS) is: every setting that
# changes what is computed. The composed config's other keys are left out, each for a reason:
# * trainer.precision is in (as "precision"): bf16 autocast changes every number a step computes;
# * trainer.accelerator, trainer.devices, trainer.num_nodes, trainer.strategy: where the same arithmetic runs. The
#   protocol's batch is the total over the processes, so DDP computes the single process's step to float rounding
#   where nothing is random (the DDP tests) and draws dropout from other streams otherwise, like another seed's
#   draws; a GPU's kernels compute the CPU's to rounding (python -m yoso_cuda --check);
# * trainer.compile: Inductor computes the eager step to rounding; only the random stream differs, like a seed's
#   draws, and a compiled run is reproducible from its seed (tests/lra/test_compile.py);
# * trainer.enable_progress_bar, logger, callbacks, num_workers, paths, rerun: what is shown, written, or where,
#   and how batches are loaded (the sampler is seeded, so the batches are the same), never what is computed;
# * task.data.source_dir, cache_dir, generated_dir: where the data lies; which data it is, is data_source. The hash
#   holds the task's own paths under the default data folder in their place (default_data_paths), as every run
#   committed before they were left out had them, so a record, which keeps no paths, has a hash that can be recomputed.
DATA_PATHS = ("source_dir", "cache_dir", "generated_dir")
DEFAULT_DATA_DIR = "data"  # conf/paths' data folder where LRA_DATA_DIR is not set


def precision_name(precision: Any) -> str:
    """A Lightning precision under the name Lightning reports: ``32`` and ``"32"`` are ``"32-true"``."""
    return PRECISION_NAMES.get(str(precision), str(precision))


def with_added_settings(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (a record's) with every added setting it lacks at its old value, where the part it is in is (a record
    that failed before its configuration was known has no protocol to complete)."""
    config = copy.deepcopy(config)
    for (*parts, key), value in ADDED_SETTINGS.items():
        if isinstance(part := nested_part(config, parts), dict):
            part.setdefault(key, copy.deepcopy(value))
    return config


def nested_part(config: dict[str, Any], parts: list[str]) -> Any:
    """The value at the path ``parts`` of ``config``; None where there is none."""
    for name in parts:
        config = config.get(name) if isinstance(config, dict) else None
    return config


def model_and_hparams_with_current_names(
    model: dict[str, Any] | None, attention: str | None, hparams: dict[str, Any] | None, old: bool = False
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """A stored model section and attention hyperparameters with every renamed setting (the ``RENAMED`` map of
    :class:`lra.model.ModelConfig` and of the attention's config) under its current name; ``old=True``: under its
    old name. Records and checkpoints written before a rename hold the old names."""
    from .model import ModelConfig  # the model, only where a stored configuration is read

    if model is not None:
        model = attention_zoo.with_current_names(ModelConfig, model, old=old)
    if hparams is not None and attention in attention_zoo.available() + list(attention_zoo.presets()):
        hparams = attention_zoo.with_current_names(attention_zoo.get_class(attention).Config, hparams, old=old)
    return model, hparams


@cache
def default_data_paths(task: str) -> dict[str, str]:
    """Where ``conf/task/<task>.yaml`` puts the task's data under the default data folder: what a config hash holds
    for the data's paths (:data:`DATA_PATHS`) wherever the data lies."""
    composed = OmegaConf.merge({"paths": {"data_dir": DEFAULT_DATA_DIR}}, {"task": task_options(task)})
    return {key: composed.task.data[key] for key in DATA_PATHS if key in composed.task.data}


def task_options(task: str) -> Any:
    """``conf/task/<task>.yaml`` over the task options its defaults list names (Path-X's is Pathfinder's), unresolved:
    the one defaults rule the task group uses, read without Hydra, which cannot compose inside a running job."""
    options = OmegaConf.create((resources.files("lra.conf") / "task" / f"{task}.yaml").read_text())
    defaults = list(options.pop("defaults", ["_self_"]))
    return OmegaConf.merge(*(options if name == "_self_" else task_options(name) for name in defaults))


def config_hash(config: dict[str, Any]) -> str:
    """A short, stable hash of the settings that define a run's result.

    Settings of :data:`ADDED_SETTINGS` at their old values are left out (and a part they leave
    empty), and renamed settings hashed under their old names, so that a run of today's default
    configuration keeps the hash of its earlier runs. The data's paths are hashed as the task's
    defaults (:func:`default_data_paths`): where the data lies never changes the hash.
    """
    config = copy.deepcopy(config)
    task = config.get("task")
    if isinstance(task, dict) and isinstance(task.get("data"), dict) and DATA_PATHS[0] in task["data"]:
        config["task"] = {**task, "data": {**task["data"], **default_data_paths(task["name"])}}
    if "model" in config and "attention" in config:
        attention = config["attention"]
        config["model"], hparams = model_and_hparams_with_current_names(
            config["model"], attention["name"], attention["hparams"], old=True
        )
        config["attention"] = {**attention, "hparams": hparams}
    for (*parts, key), value in ADDED_SETTINGS.items():
        part = nested_part(config, parts)
        if isinstance(part, dict) and key in part and part[key] == value:
            del part[key]
            if parts and not part:  # a part only the added setting was in
                del nested_part(config, parts[:-1])[parts[-1]]
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def git_commit() -> str:
    """The commit of the checkout this code runs from, with ``-dirty`` for uncommitted changes; "unknown"
    for an installed copy (even one installed inside another repository's folder)."""
    try:
        top = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "--show-toplevel"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        if not top or Path(top).resolve() != REPO_ROOT:
            return "unknown"
        commit = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


RECORD_VERSION = 2
#: The key a record's version is written under: version 1 is the dict lra.train assembled before
#: :class:`RunRecord` (every record committed up to issue 29); a record keeps the version it was written with.
VERSION_KEYS = {1: "schema_version", 2: "record_version"}
#: The keys that identify a run's configuration (with its seed): a cell of ``lra.table`` pools the runs equal in
#: every one of them. ``config_hash`` is the hash of the settings they are resolved from (:func:`defining_config`).
CONFIGURATION_KEYS = ("task", "attention", "attention_hparams", "model", "protocol", "seq_len", "data", "pretrain", "precision")
#: The keys that describe only the machine a run ran on, its paths: ``data.*`` ones are never recorded (a task's
#: data settings without them), the others are left out of a committed record (``lra.table --collect``). The
#: overrides are among them: they may name the machine's paths, and a committed run is named by its configuration.
MACHINE_KEYS = (
    "best_checkpoint", "data_folder", "data_prepared_from", "resumed_from", "overrides",
    "data.source_dir", "data.cache_dir", "data.generated_dir",
)  # fmt: skip


@dataclass(kw_only=True)
class RunRecord:
    """A run's ``results.json``: what ran (its configuration, :data:`CONFIGURATION_KEYS`), in which code, on what,
    and how well.

    A record holds what was known when it was written: one of a run that failed before its configuration was
    resolved has no configuration, one of a run that did not finish has no results, and one of an older version
    lacks the keys added since. A key it lacks reads None and is not written; a key recorded as null (no training
    step timed, no compilation) is written as null.
    """

    record_version: int = RECORD_VERSION
    task: str | None = None
    attention: str | None = None
    row: str | None = None  # the table row: the attention preset and any command-line change to it
    overrides: list[str] | None = None  # the command line's overrides: what names a run the table lists as not a cell
    seed: int | None = None
    git_commit: str | None = None
    torch_version: str | None = None
    lightning_version: str | None = None
    started_at: str | None = None  # a resumed run's: its first piece's (lra.run.goes_on)
    status: str | None = None  # running, finished, failed or interrupted
    stage: str | None = None  # PRETRAINING for a pretraining run; a classification run has none
    protocol: dict[str, Any] | None = None
    model: dict[str, Any] | None = None
    pretrain: dict[str, Any] | None = None
    seq_len: int | None = None
    data: dict[str, Any] | None = None  # task.data without the machine's paths
    config_hash: str | None = None  # lra.train's: a committed run is recognised by it
    adjusted: dict[str, Any] | None = None  # protocol settings fitted to a shortened run
    attention_hparams: dict[str, Any] | None = None
    resumed_from: str | None = None
    pretrained: dict[str, Any] | None = None  # the pretraining run a fine-tuning started from
    # What training and testing measured (lra.fit).
    data_source: str | None = None
    data_folder: str | None = None
    data_prepared_from: str | None = None
    num_samples: dict[str, int] | None = None
    num_parameters: int | None = None
    steps: int | None = None
    steps_per_second: float | None = None
    skipped_steps: int | None = None  # steps skipped for a non-finite loss or gradients (protocol.skip_non_finite_steps)
    machine_load: dict[str, float] | None = None  # while steps_per_second was timed (lra.callbacks.TrainingSpeed)
    processes: int | None = None
    best_val_acc: float | None = None
    best_val_step: int | None = None
    test_acc: float | None = None
    test_loss: float | None = None
    # Which test samples the best checkpoint classified correctly, in the test set's order: "1" correct, "0" not. Two
    # runs tested on one test set are compared sample by sample (lra.table's paired errors). A classifier's run only.
    test_correct: str | None = None
    best_checkpoint: str | None = None
    peak_memory_mb: float | None = None
    peak_memory_kind: str | None = None
    device: str | None = None
    precision: str | None = None
    compiled: bool | None = None
    compile_backend: str | None = None
    compile_mode: str | None = None  # trainer.compile_mode: Inductor's mode (reduce-overhead: CUDA graphs), None for its default
    error: str | None = None
    wall_time_s: float | None = None  # seconds its processes ran, a resumed run's pieces summed (lra.run.goes_on)
    finished_at: str | None = None
    non_finite: dict[str, str] | None = None  # a measured number that was NaN or infinite (JSON has none): null, and here
    nulls: set[str] = field(default_factory=set, repr=False, compare=False)  # the keys recorded as null

    def update(self, **values: Any) -> None:
        """Record ``values``; one that is None is recorded as null."""
        for key, value in values.items():
            if key not in RECORD_KEYS:
                raise KeyError(f"a run record has no key {key!r}")
            setattr(self, key, value)
            if value is None:
                self.nulls.add(key)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunRecord:
        """The record of a ``results.json``'s contents, of any version; a record without a row is its attention's."""
        values = dict(values)
        key = next((key for key in VERSION_KEYS.values() if key in values), None)
        version = values.pop(key) if key else RECORD_VERSION
        if key and VERSION_KEYS.get(version) != key:
            known = ", ".join(f"{key}={version}" for version, key in VERSION_KEYS.items())
            raise ValueError(f"a run record of {key}={version}; this version of lra reads {known}")
        unknown = sorted(set(values) - set(RECORD_KEYS))
        if unknown:
            raise ValueError(f"a run record of version {version} has no key(s) {', '.join(unknown)}")
        if "row" not in values and "attention" in values:
            values["row"] = values["attention"]
        record = cls(record_version=version, **values)
        record.nulls = {key for key, value in values.items() if value is None}
        return record

    @classmethod
    def read(cls, path: Path) -> RunRecord:
        """The record in ``path``; OSError, ValueError (json's errors among them) where there is none to read."""
        values = json.loads(Path(path).read_text())
        if not isinstance(values, dict):
            raise ValueError(f"{path} holds no run record")
        return cls.from_dict(values)

    def to_dict(self, committed: bool = False) -> dict[str, Any]:
        """What ``results.json`` holds, its version first; ``committed``: without the machine's paths."""
        values = {VERSION_KEYS[self.record_version]: self.record_version}
        non_finite = dict(self.non_finite or {})
        for key in RECORD_KEYS:
            value = getattr(self, key)
            if isinstance(value, float) and not math.isfinite(value):  # json.dumps would write NaN, which is not JSON
                value, non_finite[key] = None, str(value)
            if (value is not None or key in self.nulls or key in non_finite) and not (committed and key in MACHINE_KEYS):
                values[key] = value
        if non_finite:
            values["non_finite"] = non_finite
        return values

    def write(self, path: Path, committed: bool = False) -> None:
        """Write atomically (:func:`write_atomically`), so a reader never sees half a file; ``committed``: as
        ``results/runs/`` keeps it, without the machine's paths and with its keys sorted."""
        text = json.dumps(self.to_dict(committed), indent=2, sort_keys=committed, default=str, allow_nan=False)
        write_atomically(Path(path), (text + "\n").encode())

    def configuration(self) -> dict[str, Any]:
        """The configuration keys the record has, with every added setting it lacks at its old value
        (:data:`ADDED_SETTINGS`) and every renamed one under its current name
        (:func:`model_and_hparams_with_current_names`: the record keeps what was written)."""
        model, hparams = model_and_hparams_with_current_names(self.model, self.attention, self.attention_hparams)
        precision = None if self.precision is None else precision_name(self.precision)
        current = {**vars(self), "model": model, "attention_hparams": hparams, "precision": precision}
        return with_added_settings({key: current[key] for key in CONFIGURATION_KEYS if current[key] is not None})


RECORD_KEYS = tuple(f.name for f in fields(RunRecord) if f.name not in ("record_version", "nulls"))


def recomputed_config_hash(record: RunRecord) -> str | None:
    """The config hash of the configuration ``record`` keeps, recomputed (:func:`defining_config` from the
    record's keys); None for a record that keeps too little of it to tell (one of before the data and the sequence
    length were recorded). A stored ``config_hash`` is a claim: this is what it must equal."""
    if record.task is None or record.seq_len is None or record.data is None or record.protocol is None:
        return None
    data = {**record.data, **default_data_paths(record.task)}  # the paths a record never keeps, as the hash holds them
    task = {"name": record.task, "seq_len": record.seq_len, "data": data, "protocol": record.protocol}
    defining = {
        "task": task,
        "attention": {"name": record.attention, "hparams": record.attention_hparams},
        "model": record.model,
        "seed": record.seed,
    }
    defining.update({key: getattr(record, key) for key in ("pretrain", "precision") if getattr(record, key) is not None})
    return config_hash({**defining, "stage": record.stage} if record.stage is not None else defining)


def config_hash_problem(record: RunRecord) -> str | None:
    """None where ``record``'s stored ``config_hash`` is the hash recomputed from the configuration it holds
    (:func:`recomputed_config_hash`), else what is wrong with it, in words."""
    recomputed = recomputed_config_hash(record)
    if recomputed == record.config_hash:
        return None
    if recomputed is None:
        return f"it says config_hash {record.config_hash} but holds too little of its configuration to check it (an older record)"
    return (
        f"it says config_hash {record.config_hash} but the configuration it holds hashes to {recomputed}: it was edited "
        "or copied from another run"
    )


def read(path: Path) -> RunRecord | None:
    """The record in ``path``, None where there is no readable one."""
    try:
        return RunRecord.read(path)
    except (OSError, ValueError, TypeError):
        return None


def recorded_data(data: dict[str, Any]) -> dict[str, Any]:
    """What a record keeps of a task's data settings: every setting but the machine's paths."""
    return {key: value for key, value in data.items() if f"data.{key}" not in MACHINE_KEYS}


def defining_config(cfg: DictConfig, stage: str = CLASSIFICATION) -> dict[str, Any]:
    """The settings that determine a run's result (not where it writes or on which device)."""
    defining = {key: OmegaConf.to_container(cfg[key], resolve=True) for key in ("task", "attention", "model", "pretrain")}
    defining["seed"] = cfg.seed
    defining["precision"] = precision_name(cfg.trainer.precision)  # bf16 changes the numbers
    return {**defining, "stage": stage} if stage == PRETRAINING else defining


def new_record(cfg: DictConfig, row: str | None, stage: str) -> RunRecord:
    """The record of a run about to start: what is known before its configuration is checked."""
    from hydra.core.hydra_config import HydraConfig

    return RunRecord(
        task=cfg.task.name,
        attention=cfg.attention.name,
        row=row or cfg.attention.name,
        # The command line's, where Hydra ran the run (not in a direct call of lra.run.train()).
        overrides=list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else None,
        seed=cfg.seed,
        git_commit=git_commit(),
        torch_version=torch.__version__,
        lightning_version=version("pytorch-lightning"),
        started_at=now(),
        status="running",
        stage=stage if stage == PRETRAINING else None,
    )


def record_configuration(record: RunRecord, cfg: DictConfig, stage: str) -> None:
    """Record the checked configuration of ``cfg``'s run: its attention's hyperparameters, protocol, model, data and
    the hash that identifies it."""
    defining = defining_config(cfg, stage)
    hparams = OmegaConf.to_container(cfg.attention.hparams, resolve=True)
    record.update(
        attention_hparams=asdict(attention_zoo.make_config(cfg.attention.name, **hparams)),
        protocol=defining["task"]["protocol"],
        model=defining["model"],
        pretrain=defining["pretrain"],
        seq_len=defining["task"]["seq_len"],
        data=recorded_data(defining["task"]["data"]),
        precision=defining["precision"],
        config_hash=config_hash(defining),
    )
