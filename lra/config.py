"""The Hydra configuration shipped in ``lra/conf``, and what Python adds to it.

Every command reads the configuration through Hydra (``python -m lra.train`` through ``@hydra.main``,
library code and the other commands through :func:`compose`), never by a path into the source tree,
so an installed copy works from any folder. Python adds:

* the config group ``attention_zoo``: every registered attention (with its defaults) and every
  registered preset, each as ``{name, hparams}`` with every hyperparameter. A file
  ``conf/attention/<row>.yaml`` selects one (``defaults: [/attention_zoo@_here_: <name>]``) and may
  override some of its hyperparameters, so the values live once, in ``attention_zoo``, and every one
  of them can be changed on the command line as ``attention.hparams.<key>=...``;
* an option of the ``attention`` group for every registered attention and preset that has no YAML
  of its own, so ``attention=<name>`` works for every name ``attention_zoo`` lists (a YAML, where
  there is one, is the option);
* the resolvers ``lra_run_name`` (a run folder's name from its overrides) and ``lra_paper_rows``
  (a published table's rows, :mod:`lra.paper`: ``${lra_paper_rows:table3}`` is what
  ``experiment=table3`` sweeps).

It also holds the rules a composed configuration must meet before a run starts (:func:`checked`: the
seed, the task's lengths, the pretraining objective, the protocols fitted to a shortened run; the
process count), the one-line refusals of overrides Hydra would refuse in its own words, and the
name of the table row a run belongs to (:func:`row_name`), which ``lra.train`` and ``lra.campaign``
both give it.

This module imports ``attention_zoo`` (and so torch) but not Lightning, the model or the data:
composing a configuration (``--cfg job``, ``--help``) does not pay for what only training needs.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import os
import textwrap
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

import attention_zoo

from . import paper
from .protocol import Protocol
from .results import CLASSIFICATION, FLOAT32, precision_name

CONFIG_MODULE = "lra.conf"
CONFIG_NAME = "config"
MAX_RUN_NAME = 120  # file names are limited to 255 bytes
PRETRAINING_OBJECTIVES = ("none", "mlm")  # conf/pretrain/<objective>.yaml


def output_dir() -> Path:
    """The output folder of the commands that do not compose a run (``lra.campaign``, ``lra.table``): the one
    ``conf/paths/default.yaml`` gives a run, ``$LRA_OUTPUT_DIR`` or ``outputs`` in the folder the command runs in."""
    return Path(os.environ.get("LRA_OUTPUT_DIR", "outputs"))


def run_name(overrides: str, precision: str | int = FLOAT32) -> str:
    """The run folder's name: the command-line overrides, "default" for none, and the precision where it is not
    float32 (a run's identity: a bf16 run never shares a float32 run's folder, whether ``trainer=gpu`` or
    ``trainer.precision=...`` chose it).

    A long list is cut and suffixed with a hash of the whole list, so the name stays unique and
    within file-name limits; the full list is in the run's ``.hydra/overrides.yaml``.
    """
    if precision_name(precision) != FLOAT32:
        overrides = ",".join(filter(None, [f"precision={precision_name(precision)}", overrides]))  # first: never cut
    if not overrides:
        return "default"
    if len(overrides) <= MAX_RUN_NAME:
        return overrides
    digest = hashlib.sha256(overrides.encode()).hexdigest()[:12]
    return f"{overrides[: MAX_RUN_NAME - 13]}-{digest}"


# What --help lists (conf/hydra/help/lra.yaml): the groups a user chooses from, with what each option is for.
HELP_GROUPS = {
    "task": "the LRA task",
    "attention": "a row of conf/attention/ or any registered attention or preset",
    "experiment": "the protocol: steps, batch, learning rate, data size (smoke by default)",
    "trainer": "where it runs: cpu, gpu (bf16), ddp",
    "logger": "metrics.csv (csv), TensorBoard or Weights & Biases",
    "pretrain": "none, or mlm self-pretraining first",
    "model": "the encoder: lra (the paper's), efficiency (the efficiency profile's)",
}


def group_options(group: str) -> list[str]:
    """The options of a config group: its YAMLs in the package, and for ``attention`` every registered name."""
    if group == "attention":
        return sorted({*attention_rows(), *attention_zoo.available(), *attention_zoo.presets()})
    folder = resources.files(CONFIG_MODULE) / group
    return sorted(entry.name.removesuffix(".yaml") for entry in folder.iterdir() if entry.name.endswith(".yaml"))


def help_choices() -> str:
    """The ``--help`` lines of the groups a user chooses from, each with its options wrapped under it."""
    lines = []
    for group, what in HELP_GROUPS.items():
        lines.append(f"  {group}=  {what}")
        lines += textwrap.wrap(", ".join(group_options(group)), 110, initial_indent="      ", subsequent_indent="      ")
    return "\n".join(lines)


def paper_rows(name: str) -> str:
    """The rows of the published table ``name`` (:data:`lra.paper.TABLES`), as a sweep's list."""
    if name not in paper.TABLES:
        raise ValueError(f"no published table {name!r}; known: {', '.join(paper.TABLES)}")
    return ",".join(paper.TABLES[name].presets)


def register() -> None:
    """Add the resolvers and the ``attention_zoo`` group (again, to pick up attentions registered since)."""
    OmegaConf.register_new_resolver("lra_run_name", run_name, replace=True)
    OmegaConf.register_new_resolver("lra_paper_rows", paper_rows, replace=True)
    OmegaConf.register_new_resolver("lra_help_choices", help_choices, replace=True)
    store = ConfigStore.instance()
    registered = {name: name for name in attention_zoo.available()}
    registered.update({name: preset.attention for name, preset in attention_zoo.presets().items()})
    rows = set(attention_rows())
    for name, attention in registered.items():
        store.store(group="attention_zoo", name=name, node=_node(name, attention))
        if name not in rows:
            store.store(group="attention", name=name, node=_node(name, attention))


def _node(name: str, attention: str) -> dict:
    return {"name": attention, "hparams": dataclasses.asdict(attention_zoo.make_config(name))}


def compose(overrides: Iterable[str] = (), *, return_hydra_config: bool = False) -> DictConfig:
    """The configuration ``python -m lra.train OVERRIDES`` runs with (unresolved)."""
    register()
    with hydra.initialize_config_module(CONFIG_MODULE, version_base="1.3"):
        return hydra.compose(CONFIG_NAME, overrides=list(overrides), return_hydra_config=return_hydra_config)


def attention_rows() -> list[str]:
    """The rows of ``conf/attention/``: one per ``<row>.yaml`` shipped in the package, sorted."""
    folder = resources.files(CONFIG_MODULE) / "attention"
    return sorted(entry.name.removesuffix(".yaml") for entry in folder.iterdir() if entry.name.endswith(".yaml"))


def group_choices(group: str) -> list[str] | None:
    """Every option of the config group ``group`` (``attention``, ``task``, ``hydra/launcher``, ...), sorted; None
    where ``group`` is not a group. An ``attention=`` option is a row of ``conf/attention/`` or any registered
    attention or preset."""
    register()
    with hydra.initialize_config_module(CONFIG_MODULE, version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        parent, _, leaf = group.rpartition("/")
        return loader.get_group_options(group) if leaf in loader.list_groups(parent) else None


def attention_choices() -> list[str]:
    """Every ``attention=`` option, sorted."""
    return group_choices("attention") or []


def unknown_option(overrides: Iterable[str]) -> str | None:
    """The error for an override ``GROUP=NAME`` of a config group (or a sweep's ``GROUP=a,b``) whose NAME is not one
    of the group's options: the closest option and every choice, in one line, where Hydra would print its search
    path."""
    for override in overrides:
        key, _, value = override.partition("=")
        group = key.lstrip("+~")
        if not value or any(mark in value for mark in "($[{") or "." in group:
            continue  # a sweep function, an interpolation, a list, or a value rather than a group
        choices = group_choices(group)
        if choices is None:
            continue
        for name in (part.strip() for part in value.split(",")):
            if name not in choices:
                close = difflib.get_close_matches(name, choices, n=1)
                hint = f"did you mean {close[0]}? " if close else ""
                what = "an attention" if group == "attention" else f"an option of {group}"
                return f"{group}={name} is not {what}; {hint}The choices: {', '.join(choices)}"
    return None


def value_problem(arguments: list[str]) -> str | None:
    """What is wrong with a run's values (its seed, lengths, protocol, attention hyperparameters, process count), in
    one line, found by composing it as ``lra.train`` will, before Hydra makes its folder; None where nothing is (or
    where the command runs no training: ``--help``, ``--cfg``). A sweep (``-m``) is checked on its first cell, each
    list at its first value (its other cells are checked by their own runs)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    multirun = any(argument in ("-m", "--multirun") for argument in arguments)
    if any(argument.startswith("-") and argument not in ("-m", "--multirun") for argument in arguments):
        return None
    overrides = [argument for argument in arguments if not argument.startswith("-")]
    if multirun:
        first = []
        for override in OverridesParser.create().parse_overrides(overrides):
            if override.is_sweep_override() and not override.is_discrete_sweep():
                return None  # an interval: the sweeper's, not a value to check here
            value = next(override.sweep_string_iterator()) if override.is_sweep_override() else None
            first.append(override.input_line if value is None else f"{override.get_key_element()}={value}")
        overrides = first
    try:
        cfg = compose(overrides)
        checked(cfg, CLASSIFICATION)
        attention_zoo.make_config(cfg.attention.name, **OmegaConf.to_container(cfg.attention.hparams, resolve=True))
        if cfg.task.protocol.batch_size % processes(cfg.trainer):
            return (
                f"task.protocol.batch_size={cfg.task.protocol.batch_size} does not divide over {processes(cfg.trainer)} "
                "processes; the protocol's batch is the total over all devices"
            )
    except (ValueError, TypeError) as error:
        return str(error)
    except Exception:  # what Hydra refuses in its own words is its to say, when it composes the run
        return None
    return None


def row_name(attention_choice: str, overrides: Iterable[str]) -> str:
    """The table row a run belongs to: its ``attention=`` choice (a row of ``conf/attention/``, or a registered name)
    and every command-line change to it (``attention.*`` overrides, sorted, so that their order does not matter)."""
    changes = [o for o in overrides if o.split("=", 1)[0].lstrip("+~").startswith("attention.")]
    return " ".join([attention_choice, *sorted(changes)])


def fitted_protocol(cfg: DictConfig, section: str) -> tuple[DictConfig, dict[str, dict[str, Any]]]:
    """``cfg`` with its ``<section>.protocol`` checked and fitted to a shortened run (:meth:`Protocol.fitted`): a new
    config (``cfg`` is left as composed) and what was adjusted (the run logs it)."""
    protocol = Protocol.checked(OmegaConf.to_container(cfg[section].protocol, resolve=True))
    adjusted = protocol.fitted()
    changes = {key: change["to"] for key, change in adjusted.items()}
    return OmegaConf.merge(cfg, {section: {"protocol": changes}}), adjusted


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


def checked(cfg: DictConfig, stage: str) -> tuple[DictConfig, dict[str, dict[str, Any]]]:
    """``cfg`` validated and its protocols fitted to the run's steps (a new config) and what was adjusted: the
    task's protocol, then the pretraining's where this classification stage has one (it defaults to the task's),
    its keys prefixed ``pretrain.``."""
    if not isinstance(cfg.seed, int) or isinstance(cfg.seed, bool):
        raise ValueError(f"seed={cfg.seed} is not a seed: it takes a whole number (seed=0, seed=1, ...)")
    check_task(cfg.task)
    if cfg.pretrain.objective not in PRETRAINING_OBJECTIVES:
        raise ValueError(f"pretrain.objective must be one of {', '.join(PRETRAINING_OBJECTIVES)}, got {cfg.pretrain.objective!r}")
    cfg, adjusted = fitted_protocol(cfg, "task")
    if stage == CLASSIFICATION and cfg.pretrain.objective != "none":
        cfg, pretraining = fitted_protocol(cfg, "pretrain")
        adjusted.update({f"pretrain.{key}": change for key, change in pretraining.items()})
    return cfg, adjusted


def processes(trainer_cfg: DictConfig) -> int:
    """How many training processes the trainer config asks for (devices x nodes)."""
    devices = trainer_cfg.devices
    if isinstance(devices, str) or (isinstance(devices, int) and devices < 1):
        raise ValueError(f"trainer.devices must be a device count or a list of devices, got {devices!r}")
    per_node = devices if isinstance(devices, int) else len(devices)
    return per_node * trainer_cfg.get("num_nodes", 1)


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
            cfg = compose([f"attention={choice}"] if choice else [])
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


def renamed_model_overrides(overrides: list[str]) -> str | None:
    """The error for an override of a renamed ``model`` setting, which names the new name (Hydra would say only
    that the old key is not in struct)."""
    from .model import ModelConfig  # no Lightning: the model's config only

    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~").removeprefix("model.")
        if override.startswith(("model.", "+model.", "~model.")) and key in ModelConfig.RENAMED:
            try:
                ModelConfig.from_dict({key: None})
            except ValueError as error:
                return str(error)
    return None
