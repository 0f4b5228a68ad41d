"""The runs' records as a table beside a paper's: ``python -m lra.table [--rows ROWS] [--paper NAME] [--speed]``.

Which rows: by default (``--rows all``) the comparison table, ``comparison.*``: a row per attention
(registered name or preset, as ``attention=`` named it) with finished runs, Table 3's rows first in
its order, then the others by name, so an attention a user just added and trained is a row beside
the paper's. ``--rows a,b,c`` picks rows and orders them. ``--paper NAME`` alone writes a published
table (:data:`lra.paper.TABLES`) as its paper prints it, its rows only, in its order and labels:
``table3``, Table 3 of the YOSO paper, and ``lra_table1``, Table 1 of the LRA paper; with ``--rows``
it names whose numbers stand beside the cells (Table 3's by default). The rules below are the same
for every table ("the paper" is the table's). Reads every ``results.json`` under the output
folder (``outputs/``, ``$LRA_OUTPUT_DIR``) and the run records committed under ``results/runs/``, and
writes ``<name>.{md,csv,tex,png}`` and ``<name>_agreement.csv`` into the output folder: the user's
table, beside the user's runs; nothing is written into ``results/`` unless asked.
``--collect`` copies the finished local runs into ``results/runs/`` (one small JSON each, without
machine-specific paths), and ``--committed`` (implied by ``--collect``) writes ``results/<name>.*``
from the committed records alone, so the committed table never holds a run that is not committed
beside it. ``--speed`` adds each cell's training steps per second and peak memory, from the records.

What the table shows: one section per protocol (and per setting in which that protocol's runs
depart from it as declared or differ), with a row per row that has a cell there and, for each of the
paper's five tasks, our cell beside the paper's number ("–" where the paper has no such row). Under the
rows, per task, how the section agrees with the paper: Spearman's rank correlation of our row means
with the paper's column and, for ListOps, how many rows fall on the paper's side of its split (both
papers have every row at 34-37% or 16-19%). A task with no cell in the section keeps its columns (the
paper's numbers) and says how to get its data. Runs that are not cells (failed runs; in a published
table, rows the paper does not have) are listed once at the end.

Rules (each in one place below):

* A cell pools only runs whose whole configuration is equal but for the seed: task, attention and
  every hyperparameter, model, every protocol field, sequence length, data settings and the data
  source the run used. Two records of one configuration and seed count once: the latest finished
  (copies of one run, e.g. in ``outputs/`` and ``results/runs/``, are one record; distinct runs are
  named in the table).
* Training from scratch and self-pretraining (``pretrain``), and each position scheme
  (``model.positions``), are settings like any other: runs that differ in them are never pooled,
  and the section titles say which is which (``pretrain=none``, ``pretrain=mlm (...)``). A record
  written before a setting existed has the value runs had then (``lra.results.ADDED_SETTINGS``).
  Pretraining runs are not cells; the fine-tuning runs that start from them are.
* Runs that differ otherwise are never averaged: a section is one protocol (its ``name``) with the
  values of every setting that differs between the protocol's cells of a task (``protocol.max_steps=20``),
  of every protocol setting in which its runs depart from the protocol as its experiment declares it
  (:func:`departures`: a lone 20-step run is titled ``protocol.max_steps=20``), and the precision where
  it is not float32 (precision is part of the configuration: float32 and bf16 runs never pool). Within
  a section, runs of one row that still differ (a preset changed, another data source) are separate
  rows labelled by what differs. A section exists only where it has cells; sections follow the
  numeric order of their settings (:func:`natural_order`).
* A cell shows the mean test accuracy (%) and its standard error: over seeds (std / sqrt(k)) where it
  has k >= 2 seeds, else the binomial standard error of one accuracy on its n test samples,
  sqrt(p (1 - p) / n). The best mean of a task is bold only when it beats the next row by more than
  twice the standard error of their difference.
* The paper's number stands beside every cell whose row is one of the paper's rows as its preset
  defines it (:meth:`lra.paper.PaperTable.number`); it is the paper's full protocol (``conf/task/<task>.yaml`` and
  ``conf/model/lra.yaml``, as ``experiment=paper`` composes them), marked so in every section that
  is not, and the difference (ours - paper) is computed only in sections that are.
* Agreement with the paper (:func:`agreement`) counts only the rows that have the paper's number:
  Spearman's rho with ties at their average rank, from 3 rows up; the ListOps split at
  ``LISTOPS_SPLIT`` (28%): a row is on the paper's side when its mean is on the same side of 28% as
  the paper's number.
* Runs of a configuration and seed with no finished run are not cells: they are listed once, at the
  end, each with its command line's overrides and why: failed, diverged, refused for a bad value
  before its configuration was resolved (its record has none), running, or abandoned (recorded as
  running, but no live process holds its folder: killed before it could record it). So are, in a
  published table (``--paper`` alone), runs of a row that is in no published table
  (``lra/paper.py``); a row of the other table only is left out without a word: it is that table's.

Writing twice from the same records gives the same files.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from . import run_lock
from .data.tasks import TASKS as TASK_SPECS
from .paper import TABLE3, TABLES, PaperTable, Row
from .results import CONFIGURATION_KEYS, FLOAT32, RESULTS_FILE, RunRecord, config_hash_problem

TASKS = ("listops", "text", "retrieval", "image", "pathfinder")
TASK_LABELS = {"listops": "ListOps", "text": "Text", "retrieval": "Retrieval", "image": "Image", "pathfinder": "Pathfinder"}
#: Both papers' ListOps rows sit at 34-37% (they learn the task) or 16-19% (they do not): a row is on
#: the paper's side of this split when its mean is on the same side of it as the paper's number.
LISTOPS_SPLIT = 28.0
MIN_RANKED_ROWS = 3  # Spearman's rho only from this many rows up (two rows always give +-1)
# Keys that name the row, not the section: the attention and its hyperparameters.
ROW_KEYS = ("attention", "attention_hparams.")
NOT_RECORDED = "not recorded"  # a setting an older record does not have: a value of its own
BEST_MARGIN = 2.0  # "best" only beyond this many standard errors of the difference to the next row
#: A training rate is marked as measured under load where other work kept more threads than this per CPU running or
#: waiting to run (the load average beyond the run's own threads) at the start or end of its timed steps: half of the
#: machine's CPUs taken, so that the run's threads waited for a CPU (issue 57: one cell trained at 0.67 steps/s beside
#: a test suite and at 13 alone).
LOADED = 0.5
# A run record's identity, and what makes two of them one cell (with the seed) or one section.
SAME_RUN = ["setting", "data_source", "seed"]


def find_records(folders: Iterable[Path]) -> list[RunRecord]:
    """Every run record under ``folders`` (``results.json`` files and ``*.json`` run records)."""
    return [record for _, record in find_record_files(folders)]


def find_record_files(folders: Iterable[Path]) -> list[tuple[Path, RunRecord]]:
    """Every run record under ``folders``, with the file it was read from."""
    records = []
    for folder in folders:
        folder = Path(folder)
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob(RESULTS_FILE)) + sorted(folder.glob("*.json")):
            try:
                values = json.loads(path.read_text())
                # Not a run's record: another JSON file (a run's record, even of a run refused before its configuration
                # was resolved, has its task and status).
                if not isinstance(values, dict) or "task" not in values or "status" not in values:
                    continue
                record = RunRecord.from_dict(values)
            except (OSError, ValueError) as error:
                raise SystemExit(f"error: {path} is not a readable run record ({error})") from None
            # A pretraining run (lra.train's stage "pretraining") is part of its fine-tuning runs, not a cell.
            if record.stage is None:
                records.append((path, with_live_status(path, record)))
    return records


def with_live_status(path: Path, record: RunRecord) -> RunRecord:
    """``record`` (read from ``path``) as it stands: a run recorded as running whose folder no live process holds
    (:mod:`lra.run_lock`) was killed (SIGKILL, out of memory, a lost machine) before it could record it; it is
    ``abandoned``, not running. A live one's error names its process."""
    if record.status != "running" or path.name != RESULTS_FILE:
        return record
    if holder := run_lock.holder(path.parent):
        record.error = f"in progress ({holder})"
    else:
        record.status = "abandoned"
        record.error = (
            "its process ended without recording how (killed: SIGKILL, out of memory, a lost machine); the same "
            "command resumes it from its last.ckpt"
        )
    return record


def run_file_name(record: RunRecord) -> str:
    row = record.row.replace(" ", "_").replace("/", "-").replace("=", "-")
    return f"{record.task}__{row}__{record.protocol['name']}__seed{record.seed}__{record.config_hash[:8]}.json"


def check_hashes(found: list[tuple[Path, RunRecord]]) -> None:
    """Refuse to collect a finished run whose stored ``config_hash`` is not the hash recomputed from the configuration
    it holds (:func:`lra.results.config_hash_problem`): committed, it would make every checkout skip the configuration
    it claims. Nothing is collected then."""
    for path, record in found:
        if record.status == "finished" and (problem := config_hash_problem(record)):
            raise SystemExit(
                f"error: {path}: {problem}. Committed, it would stand for a configuration it did not run: move it out "
                "of the folders --collect reads, or run its configuration again (rerun=true); nothing was collected"
            )


def collect(records: list[RunRecord], runs_dir: Path) -> int:
    """Copy finished runs into ``runs_dir`` as small JSON files; return how many were new."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    new = 0
    for record in records:
        if record.status != "finished":
            continue
        path = runs_dir / run_file_name(record)
        new += not path.exists()
        record.write(path, committed=True)
    return new


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        items = {}
        for key in sorted(value):
            items.update(flatten(value[key], f"{prefix}{key}."))
        return items
    return {prefix[:-1]: json.dumps(value, sort_keys=True)}


def pretraining_label(pretrain: dict[str, Any], protocol: dict[str, Any] | None) -> str:
    """``none (from scratch)``, or the objective with every setting of it, its protocol's as far as it
    differs from the fine-tuning's: ``mlm (mask_rate=0.15, protocol as fine-tuning)``."""
    if pretrain["objective"] == "none":
        return "none (from scratch)"
    own = {key: value for key, value in pretrain.items() if key not in ("objective", "protocol")}
    own_protocol = pretrain.get("protocol") or {}
    differs = {f"{key}": value for key, value in own_protocol.items() if (protocol or {}).get(key) != value}
    details = [f"{key}={value}" for key, value in sorted(own.items())]
    details += [f"{key}={value}" for key, value in sorted(differs.items())] or ["protocol as fine-tuning"]
    return f"{pretrain['objective']} ({', '.join(details)})"


def settings(config: dict[str, Any]) -> dict[str, str]:
    """A record's configuration (:meth:`RunRecord.configuration`), flattened to ``key: JSON value``; the pretraining
    as one label."""
    flat = {}
    for part in CONFIGURATION_KEYS:
        if part == "pretrain":
            flat[part] = json.dumps(pretraining_label(config[part], config.get("protocol")))
        else:
            flat.update(flatten(config[part], f"{part}.") if part in config else {part: json.dumps(NOT_RECORDED)})
    return flat


def frame(records: list[RunRecord]) -> pd.DataFrame:
    """One row per distinct run: its identity, configuration and result."""
    rows = []
    for record in records:
        config = record.configuration()
        finished = record.status == "finished"
        overrides = " ".join(record.overrides or [])
        rows.append(
            {
                "task": record.task,
                "row": record.row or NOT_RECORDED,
                "seed": record.seed,
                "protocol": (record.protocol or {}).get("name", NOT_RECORDED),
                "status": record.status or "unknown",
                "error": record.error or "",
                "finished_at": record.finished_at or "",
                "config_hash": record.config_hash,
                "overrides": overrides,
                # A run refused before its configuration was resolved has none: its command line tells it apart.
                "setting": json.dumps(settings(config), sort_keys=True) if record.config_hash else f"refused: {overrides}",
                # A finished run also says which data it used (source=auto resolves to one of two).
                "data_source": (record.data_source or NOT_RECORDED) if finished else None,
                "accuracy": 100 * record.test_acc if finished else math.nan,
                "num_test": (record.num_samples or {}).get("test") if finished else None,
                "steps_per_s": record.steps_per_second if finished else None,
                "peak_memory_mb": record.peak_memory_mb if finished else None,
                "others_load_per_cpu": others_load_per_cpu(record.machine_load) if finished else None,
                "device": (record.device or NOT_RECORDED) if finished else None,
                "adjusted": record.adjusted or {},
                "model": config.get("model"),  # none in the record of a run refused before its configuration
                "protocol_fields": record.protocol,
            }
        )
    runs = pd.DataFrame(rows)
    if runs.empty:
        return runs
    # A count, whole even beside runs that have none (those are NA, not a float column of 256.0s).
    runs["num_test"] = pd.to_numeric(runs["num_test"], errors="coerce").astype("Int64")
    runs["num_test"] = runs["num_test"].where(runs["num_test"] > 0)
    for column in ("steps_per_s", "peak_memory_mb", "others_load_per_cpu"):
        runs[column] = pd.to_numeric(runs[column], errors="coerce")
    # The same run found twice (outputs/ and results/runs/) is one record.
    return runs.drop_duplicates(subset=["config_hash", "setting", "seed", "status", "finished_at"]).reset_index(drop=True)


def base_row(row: str) -> str:
    """The preset or registered attention of a run's row (``yoso_32`` of ``yoso_32 attention.hparams.num_hashes=16``)."""
    return row.split(" ")[0]


def is_paper_row(row: str, published: PaperTable) -> bool:
    """Whether a run's row (its preset, with any command-line change) is a row of the paper's table."""
    return base_row(row) in published.presets


def row_order(label: str, order: tuple[str, ...]) -> tuple[int, str, str]:
    """Rows in ``order`` (the paper's, or the one asked for), then the others by name; a changed or split row after
    its preset."""
    base = base_row(label)
    return (order.index(base) if base in order else len(order)), base, label


def row_label(row: str, published: PaperTable) -> str:
    base, _, rest = row.partition(" ")
    return published.label(base) + (f" {rest}" if rest else "")


def configs_of(runs: pd.DataFrame) -> pd.DataFrame:
    """Each run's configuration, a column per key (JSON values, sorted); a key a record lacks is NOT_RECORDED."""
    configs = pd.DataFrame(runs["setting"].map(json.loads).tolist(), index=runs.index)
    return configs[sorted(configs)].fillna(json.dumps(NOT_RECORDED))


def what_differs(configs: pd.DataFrame, groups: list[pd.Series]) -> pd.Series:
    """Per run, ``key=value, ...`` for each key whose value differs between the runs of its group (``configs`` grouped
    by ``groups``), in the columns' order; "" where none does."""
    differing = configs.where(configs.groupby(groups).transform("nunique") > 1)
    return differing.apply(lambda run: ", ".join(f"{key}={json.loads(value)}" for key, value in run.dropna().items()), axis=1)


@cache
def declared_protocol(name: str, task: str) -> dict[str, Any] | None:
    """The protocol ``name`` as its experiment declares it for ``task`` (``experiment=<name> task=<task>``, composed);
    None where no experiment of that name declares it (a protocol named on the command line)."""
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    from . import config

    try:
        protocol = OmegaConf.to_container(config.compose([f"task={task}", f"experiment={name}"]).task.protocol, resolve=True)
    except HydraException:
        return None
    return protocol if protocol.get("name") == name else None


def departures(protocol: dict[str, Any] | None, adjusted: dict[str, Any], task: str) -> dict[str, str]:
    """``protocol.<key>: JSON value`` for each setting in which a run's protocol departs from its protocol as declared
    (:func:`declared_protocol`), the values as the run asked for them (before a shortened run's fitting, which follows
    from them); none where the protocol is declared nowhere."""
    protocol = protocol or {}
    declared = declared_protocol(protocol.get("name", NOT_RECORDED), task)
    if declared is None:
        return {}
    asked = {**protocol, **{key: change["from"] for key, change in adjusted.items() if key in protocol}}
    return {
        f"protocol.{key}": json.dumps(value, sort_keys=True)
        for key, value in sorted(asked.items())
        if key in declared and declared[key] != value
    }


def section_titles(runs: pd.DataFrame) -> pd.Series:
    """A run's section: its protocol, each setting in which it departs from the protocol as declared, each setting that
    differs between the protocol's runs of its task (the row's aside), and the precision where it is not float32."""
    configs = configs_of(runs)
    section_keys = [key for key in configs if not key.startswith(ROW_KEYS)]
    differing = configs[section_keys].where(
        configs[section_keys].groupby([runs["protocol"], runs["task"]]).transform("nunique") > 1
    )
    titles = []
    for (index, run), differs in zip(runs.iterrows(), differing.itertuples(index=False)):
        shown = {key: value for key, value in zip(section_keys, differs) if isinstance(value, str)}
        shown.update(departures(run["protocol_fields"], run["adjusted"], run["task"]))
        precision = configs.at[index, "precision"] if "precision" in configs else json.dumps(FLOAT32)
        if json.loads(precision) != FLOAT32:
            shown["precision"] = precision
        titles.append(", ".join([run["protocol"], *(f"{key}={json.loads(shown[key])}" for key in sorted(shown))]))
    return pd.Series(titles, index=runs.index)


def natural_order(text: str) -> list[tuple[int, float | str]]:
    """A sort key that orders the numbers in ``text`` by value: ``max_steps=5`` before ``max_steps=10``."""
    parts = re.split(r"(-?\d+(?:\.\d+)?(?:e-?\d+)?)", text)
    return [(1, float(part)) if i % 2 else (0, part) for i, part in enumerate(parts) if part]


def row_labels(runs: pd.DataFrame) -> pd.Series:
    """A run's row in its section: the row, or where runs of one row and task still differ there (a changed preset,
    another data source), the row with what differs: ``yoso_32 (attention_hparams.num_hashes=16)``."""
    configs = configs_of(runs).assign(data_source=runs["data_source"].map(json.dumps))
    differs = what_differs(configs[sorted(configs)], [runs["section"], runs["row"], runs["task"]])
    return runs["row"] + differs.map(lambda text: f" ({text})" if text else "")


def best_rows(cells: pd.DataFrame) -> pd.Series:
    """True for the row of a section and task whose mean beats the next row's by more than BEST_MARGIN standard
    errors of their difference (so at most one per task, and none among rows within the noise)."""
    ranked = cells.sort_values("mean", ascending=False, kind="stable")
    by_task = ranked.groupby(level=["section", "task"])
    runner_up = by_task[["mean", "standard_error"]].shift(-1)
    noise = np.hypot(ranked["standard_error"], runner_up["standard_error"])
    best = (by_task.cumcount() == 0) & (ranked["mean"] - runner_up["mean"] > BEST_MARGIN * noise)
    return best.reindex(cells.index)


def on_papers_side(cells: pd.DataFrame) -> pd.Series:
    """For a ListOps cell with the paper's number: whether its mean is on the same side of LISTOPS_SPLIT as the paper's."""
    listops = (cells.index.get_level_values("task") == "listops") & cells["paper"].notna()
    side = (cells["mean"] >= LISTOPS_SPLIT) == (cells["paper"] >= LISTOPS_SPLIT)
    return side.astype("boolean").where(listops)


def cell_frame(runs: pd.DataFrame, published: PaperTable) -> pd.DataFrame:
    """One row per cell, indexed by (section, row label, task): the runs pooled, their mean, standard error,
    the paper's number, whether the cell is its task's best and (ListOps) on the paper's side."""
    by_cell = runs.sort_values("seed", kind="stable").groupby(["section", "label", "task"])
    cells = by_cell.agg(
        accuracies=("accuracy", list),
        seeds=("seed", list),
        num_test=("num_test", list),
        data_source=("data_source", lambda sources: "+".join(sorted(set(sources)))),
        num_seeds=("seed", "size"),
        mean=("accuracy", "mean"),
        std=("accuracy", "std"),
        steps_per_s=("steps_per_s", "mean"),
        peak_memory_mb=("peak_memory_mb", "mean"),
        others_load_per_cpu=("others_load_per_cpu", "max"),
        devices=("device", lambda devices: " + ".join(sorted(set(devices)))),
    )
    p, n = cells["mean"] / 100, pd.to_numeric(cells["num_test"].str[0], errors="coerce")
    binomial = 100 * np.sqrt(p * (1 - p) / n)
    cells["standard_error"] = (cells["std"] / np.sqrt(cells["num_seeds"])).where(cells["num_seeds"] > 1, binomial)
    cells["generated"] = cells["data_source"].str.contains("generated")
    labels, tasks = cells.index.get_level_values("label"), cells.index.get_level_values("task")
    cells["paper"] = [published.number(label, task) for label, task in zip(labels, tasks)]
    cells["best"] = best_rows(cells)
    cells["papers_side"] = on_papers_side(cells)
    return cells


def spearman(ours: pd.Series, papers: pd.Series) -> float:
    """Spearman's rank correlation: Pearson's of the ranks, ties at their average rank (scipy's definition, without
    scipy); NaN below MIN_RANKED_ROWS rows, or where one side's values are all equal."""
    if len(ours) < MIN_RANKED_ROWS:
        return math.nan
    with np.errstate(all="ignore"):
        return float(ours.rank().corr(papers.rank()))


def agreement(cells: pd.DataFrame) -> pd.DataFrame:
    """Per task of one section's cells, over its rows with the paper's number: how many rows, Spearman's rho of our
    means with the paper's and, for ListOps, how many rows are on the paper's side of its split."""
    compared = cells[cells["paper"].notna()]
    columns = ["rows", "on_papers_side", "spearman"]
    if compared.empty:
        return pd.DataFrame(columns=columns, index=pd.Index([], name="task"))
    by_task = compared.groupby(level="task")
    result = by_task.agg(rows=("paper", "size"), on_papers_side=("papers_side", "sum")).astype("Int64")
    result["on_papers_side"] = result["on_papers_side"].where(result.index == "listops")
    result["spearman"] = by_task.apply(lambda task: spearman(task["mean"], task["paper"]))
    return result[columns]


@cache
def paper_setup(task: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The paper's protocol and model for ``task`` as ``experiment=paper`` composes them."""
    from hydra.errors import MissingConfigException
    from omegaconf import OmegaConf

    from . import config

    try:
        cfg = config.compose([f"task={task}", "experiment=paper"])
    except MissingConfigException:  # a task this version has no config for
        return None
    return OmegaConf.to_container(cfg.task.protocol), OmegaConf.to_container(cfg.model)


def not_paper_because(runs: pd.DataFrame) -> str:
    """What in one section's runs differs from the paper's protocol and model; "" where nothing does."""
    protocol = runs["protocol"].iloc[0]
    if protocol != "paper":
        return f"protocol.name={protocol}"
    differ = set()
    for task, fields, model in zip(runs["task"], runs["protocol_fields"], runs["model"]):
        setup = paper_setup(task)
        if setup is None:
            differ.add(f"task={task} (no paper protocol)")
            continue
        differ |= {f"protocol.{key}" for key, value in setup[0].items() if (fields or {}).get(key) != value}
        differ |= {f"model.{key}" for key, value in setup[1].items() if (model or {}).get(key) != value}
    return ", ".join(sorted(differ))


@dataclass
class Section:
    """One protocol with the settings its cells share (the title), and its cells; it exists only with cells."""

    title: str
    protocol: str
    not_paper_because: str  # what differs from the paper's protocol and model; "" where nothing does
    cells: pd.DataFrame  # indexed by (row label, task); the columns of cell_frame
    published: PaperTable = TABLE3
    duplicates: list[str] = field(default_factory=list)
    order: tuple[str, ...] = ()  # the rows' order (presets); rows not in it follow by name. Default: the paper's

    def __post_init__(self) -> None:
        if self.cells.empty:
            raise ValueError(f"section {self.title!r} has no cells")
        self.order = self.order or self.published.presets
        self.agreement = agreement(self.cells)

    @property
    def paper_protocol(self) -> bool:
        return not self.not_paper_because

    @property
    def rows(self) -> list[str]:
        return sorted(self.cells.index.unique("label"), key=lambda label: row_order(label, self.order))

    @property
    def tasks(self) -> list[str]:
        """The paper's five tasks, cells or not, then any other task with cells."""
        return [*TASKS, *sorted(set(self.cells.index.unique("task")) - set(TASKS))]

    def in_order(self) -> pd.DataFrame:
        """The cells in the table's order: by row, then by task."""
        positions = {"label": self.rows, "task": self.tasks}
        return self.cells.sort_index(key=lambda level: level.map(positions[level.name].index))

    def cell(self, row: str, task: str) -> pd.Series | None:
        return self.cells.loc[row, task] if (row, task) in self.cells.index else None

    def has_cells(self, task: str) -> bool:
        return task in self.cells.index.unique("task")

    def best(self, task: str) -> str | None:
        return next((row for row, of in self.cells.index[self.cells["best"]] if of == task), None)

    def average(self, row: str) -> float | None:
        """The mean over the five tasks, only when every task has a cell (like the paper's Avg)."""
        cells = [self.cell(row, task) for task in TASKS]
        return None if any(c is None for c in cells) else sum(c["mean"] for c in cells) / len(TASKS)


PAPER_ROWS = "paper"  # the rows of the published table only: the table as the paper prints it
ALL_ROWS = "all"  # every row with finished runs: the paper's in its order, then the others by name
COMPARISON = "comparison"  # the files of a table of ALL_ROWS (or of rows asked for)


def evidence_first(section: Section) -> tuple:
    """The order of the sections, strongest evidence first: the paper's protocol as run (then as declared), then the
    section with the most rows, then the most runs; ties by protocol name and the values of the settings."""
    runs = int(section.cells["num_seeds"].sum())
    return (
        not section.paper_protocol,
        section.protocol != "paper",
        -len(section.rows),
        -runs,
        section.protocol,
        natural_order(section.title),
    )


@dataclass
class Table:
    published: PaperTable
    sections: list[Section]
    left_out: pd.DataFrame  # runs that are not cells: LEFT_OUT_COLUMNS
    rows: str | tuple[str, ...] = PAPER_ROWS  # PAPER_ROWS, ALL_ROWS, or the rows asked for, in their order
    speed: bool = False  # the Markdown and LaTeX show each cell's training steps/s and peak memory

    @property
    def comparison(self) -> bool:
        """Whether rows the paper does not have are rows here (every table but the paper's own)."""
        return self.rows != PAPER_ROWS


LEFT_OUT_COLUMNS = ["task", "row", "seed", "protocol", "config_hash", "overrides", "why"]


def left_out_runs(runs: pd.DataFrame, unknown: pd.DataFrame, published: PaperTable) -> pd.DataFrame:
    """Runs that are not cells, each once: the latest record of a configuration and seed with no finished run, and
    the counted runs of rows the paper's table does not have."""
    done = pd.MultiIndex.from_frame(runs.loc[runs["status"] == "finished", ["setting", "seed"]])
    failed = runs[runs["status"] != "finished"].sort_values("finished_at", kind="stable")
    failed = failed.drop_duplicates(["setting", "seed"], keep="last")
    failed = failed[~pd.MultiIndex.from_frame(failed[["setting", "seed"]]).isin(done)]
    failed = failed.assign(why=[f"{status}: {error or status}" for status, error in zip(failed["status"], failed["error"])])
    unknown = unknown.assign(
        why=[
            f"finished at {accuracy:.2f}%, but {base_row(row)} is not a row of the paper's {published.title} (lra/paper.py); "
            "the comparison table (python -m lra.table) has every row"
            for accuracy, row in zip(unknown["accuracy"], unknown["row"])
        ]
    )
    left_out = pd.concat([failed, unknown])[LEFT_OUT_COLUMNS]
    left_out["why"] = left_out["why"].map(lambda why: why.splitlines()[0][:200])
    return left_out.sort_values(["task", "row", "seed", "protocol", "config_hash"]).reset_index(drop=True)


def build(
    records: list[RunRecord], published: PaperTable = TABLE3, rows: str | tuple[str, ...] = PAPER_ROWS, speed: bool = False
) -> Table:
    """The table of ``records`` beside the paper's table ``published``: its sections of cells, and the runs that are
    not cells. ``rows``: PAPER_ROWS (the published table: its rows only, in its order), ALL_ROWS (every row with
    finished runs: the paper's in its order, then the others by name) or the rows to show, in their order."""
    table = Table(published, [], pd.DataFrame(columns=LEFT_OUT_COLUMNS), rows, speed)
    runs = frame(records)
    if runs.empty:
        return table
    finished = runs[runs["status"] == "finished"].sort_values("finished_at", kind="stable")
    # One record per configuration, data source and seed: the latest finished.
    copies = finished.groupby(SAME_RUN, dropna=False).size().rename("copies")
    counted = finished.drop_duplicates(SAME_RUN, keep="last").join(copies, on=SAME_RUN)
    if rows == PAPER_ROWS:
        in_table = counted["row"].map(lambda row: is_paper_row(row, published)).astype(bool)
        # A row of another published table is that table's, not a run this one leaves out.
        elsewhere = counted["row"].map(lambda row: any(is_paper_row(row, other) for other in TABLES.values())).astype(bool)
        unknown, order = counted[~in_table & ~elsewhere], published.presets
    else:
        in_table = counted["row"].map(lambda row: rows == ALL_ROWS or base_row(row) in rows).astype(bool)
        unknown, order = counted.iloc[:0], (published.presets if rows == ALL_ROWS else tuple(rows))
    table.left_out = left_out_runs(runs, unknown, published)
    cell_runs = counted[in_table].copy()
    if cell_runs.empty:
        return table
    cell_runs["section"] = section_titles(cell_runs)
    cell_runs["label"] = row_labels(cell_runs)
    cells = cell_frame(cell_runs, published)
    sections = [
        Section(
            title=title,
            protocol=runs_of["protocol"].iloc[0],
            not_paper_because=not_paper_because(runs_of),
            cells=cells.xs(title, level="section"),
            published=published,
            order=order,
            duplicates=[
                f"{run.task} / {run.row} / seed {run.seed}: {run.copies} runs of one configuration, "
                f"the latest ({run.finished_at}) counts"
                for run in runs_of[runs_of["copies"] > 1].sort_values(["task", "row", "seed"]).itertuples()
            ],
        )
        for title, runs_of in cell_runs.groupby("section")
    ]
    sections.sort(key=evidence_first)
    table.sections = sections
    return table


@dataclass(frozen=True)
class Style:
    """How the Markdown and LaTeX tables write the same things."""

    bold: tuple[str, str]
    pm: str
    generated: str
    code: tuple[str, str]
    rho: str
    full_protocol: str  # marks the paper's column where its protocol is not the section's
    geq: str
    loaded: str  # marks a training rate measured under load (LOADED)


MARKDOWN = Style(("**", "**"), "±", "†", ("`", "`"), "ρ", "‡", "≥", "§")
LATEX = Style(("\\textbf{", "}"), "$\\pm$", "\\dag", ("\\texttt{", "}"), "$\\rho$", "$^\\ddagger$", "$\\geq$", "\\S")
RHO_ROW = "Spearman's {rho} with the paper"
SIDE_ROW = "ListOps: on the paper's side"


def number(value: float | None) -> str:
    return "–" if value is None or pd.isna(value) else f"{value:.2f}"


def cell_text(section: Section, row: str, task: str, style: Style = MARKDOWN) -> str:
    cell = section.cell(row, task)
    if cell is None:
        return "–"
    text = f"{cell['mean']:.2f}" + ("" if pd.isna(cell["standard_error"]) else f" {style.pm} {cell['standard_error']:.2f}")
    if cell["best"]:
        text = f"{style.bold[0]}{text}{style.bold[1]}"
    return text + (style.generated if cell["generated"] else "")


def agreement_text(section: Section, task: str, style: Style) -> tuple[str, str]:
    """What a task's column says under the rows: Spearman's rho (or how to get the task's data where the section has
    no cell of it), and for ListOps the rows on the paper's side of its split."""
    if not section.has_cells(task):
        spec = TASK_SPECS.get(task)
        if spec is not None and spec.generate is None:
            return f"no runs; data: {style.code[0]}python -m lra.data download {task}{style.code[1]}", ""
        return "no runs", ""
    if task not in section.agreement.index:
        return "none: no row here has the paper's number", ""
    rows, side, rho = (section.agreement.at[task, column] for column in ("rows", "on_papers_side", "spearman"))
    if rows < MIN_RANKED_ROWS:
        rho_text = f"needs {style.geq} {MIN_RANKED_ROWS} rows with the paper's number ({rows} here)"
    elif pd.isna(rho):
        rho_text = f"undefined: our {rows} rows' means are all equal"
    else:
        rho_text = f"{rho:+.2f} ({rows} rows)"
    return rho_text, ("" if pd.isna(side) else f"{side} of {rows}")


def measured(section: Section, row: str, task: str, column: str, digits: int) -> str:
    """A cell's mean of a measurement its runs recorded (``steps_per_s``, ``peak_memory_mb``); "–" where none did."""
    cell = section.cell(row, task)
    return "–" if cell is None or pd.isna(cell[column]) else f"{cell[column]:.{digits}f}"


def others_load_per_cpu(load: dict[str, float] | None) -> float | None:
    """What else ran on the machine while a run's steps were timed (its record's ``machine_load``): the load average
    beyond the run's own threads, at the busier of the timing's start and end, per CPU; None where not recorded."""
    if not load:
        return None
    return max(0.0, max(load["load_at_start"], load["load_at_end"]) - load["threads"]) / load["cpus"]


def under_load(section: Section, row: str, task: str) -> bool:
    cell = section.cell(row, task)
    return cell is not None and bool(cell["others_load_per_cpu"] > LOADED)


def steps_text(section: Section, row: str, task: str, style: Style) -> str:
    """A cell's training steps per second, marked where one of its runs was timed under load (:data:`LOADED`)."""
    return measured(section, row, task, "steps_per_s", 2) + (style.loaded if under_load(section, row, task) else "")


def section_frame(section: Section, style: Style, speed: bool = False) -> pd.DataFrame:
    """The section as text: a row per table row, then the agreement rows; per task, our cell beside the paper's and,
    with ``speed``, the cells' training steps per second and peak memory."""
    paper_column = "paper" if section.paper_protocol else f"paper{style.full_protocol}"
    columns: dict[tuple[str, str], list[str]] = {}
    for task in section.tasks:
        label = TASK_LABELS.get(task, task)
        columns[label, "ours"] = [cell_text(section, row, task, style) for row in section.rows] + [
            *agreement_text(section, task, style)
        ]
        columns[label, paper_column] = [number(section.published.number(row, task)) for row in section.rows] + ["", ""]
        if speed and section.has_cells(task):
            columns[label, "steps/s"] = [steps_text(section, row, task, style) for row in section.rows] + ["", ""]
            columns[label, "MB"] = [measured(section, row, task, "peak_memory_mb", 0) for row in section.rows] + ["", ""]
    averages = [section.average(row) for row in section.rows]
    if any(average is not None for average in averages):
        paper_averages = [pd.Series({task: section.published.number(row, task) for task in TASKS}).mean() for row in section.rows]
        columns["avg", "ours"] = [number(average) for average in averages] + ["", ""]
        columns["avg", paper_column] = [number(average) for average in paper_averages] + ["", ""]
    labels = [row_label(row, section.published) for row in section.rows]
    text = pd.DataFrame(columns, index=labels + [RHO_ROW.format(rho=style.rho), SIDE_ROW])
    return text if section.has_cells("listops") else text.iloc[:-1]


def paper_split(published: PaperTable) -> tuple[list[Row], list[Row]]:
    """The paper's ListOps rows above and below LISTOPS_SPLIT."""
    return (
        [row for row in published.rows if row.accuracy["listops"] >= LISTOPS_SPLIT],
        [row for row in published.rows if row.accuracy["listops"] < LISTOPS_SPLIT],
    )


def describe_section(section: Section, speed: bool = False) -> list[str]:
    """The sentences under a section's title: its protocol, the cells' seeds and test sizes (and with ``speed``, where
    the speed and memory were measured)."""
    if section.paper_protocol:
        lines = ["The paper's protocol and model: the paper column is the paper's number under the same protocol."]
    else:
        protocol = (
            f"Protocol `{section.protocol}`, not the paper's"
            if section.protocol != "paper"
            else f"The paper's protocol with other settings ({section.not_paper_because})"
        )
        lines = [f"{protocol}: the paper‡ column is the paper's number under its full protocol, a reference, not a target."]
    seeds = sorted(section.cells["num_seeds"].unique())
    sizes = section.cells["num_test"].explode().groupby(level="task").agg(lambda n: sorted(set(n.dropna().astype(int))))
    lines.append(
        f"Seeds per cell: {', '.join(map(str, seeds))}. Test samples: "
        + "; ".join(
            f"{TASK_LABELS.get(task, task)} {', '.join(map(str, n)) or NOT_RECORDED}"
            for task, n in sizes.reindex([t for t in section.tasks if t in sizes.index]).items()
        )
        + "."
    )
    if speed:
        devices = sorted(set(" + ".join(section.cells["devices"]).split(" + ")))
        lines.append(
            "steps/s: training steps per second (evaluations excluded), MB: peak memory, each the mean of the cell's "
            f"runs, on {'; '.join(devices)}: compare them only between runs of one machine. {MARKDOWN.loaded}: timed "
            f"under load, other work keeping more than {LOADED:g} threads per CPU running beside a run of the cell (the "
            "load average beyond the run's own threads, where its timing started or ended): slower than alone. A run "
            "recorded without the machine's load is not marked."
        )
    return lines


def legend(table: Table) -> list[str]:
    published = table.published
    learn, chance = paper_split(published)

    def group(rows: list[Row]) -> str:
        return f"{', '.join(row.label for row in rows)} at about {np.mean([row.accuracy['listops'] for row in rows]):.0f}%"

    if table.comparison:
        rows = (
            f"a row per attention with a cell there ({published.title}'s rows in its order, then the others by name)"
            if table.rows == ALL_ROWS
            else f"a row per attention asked for ({', '.join(table.rows)}) with a cell there"
        )
        numbers = f"the paper's number where {published.title} has the row, – where it does not"
        not_cells = "Failed runs are listed at the end, not in the table."
    else:
        rows = f"a row per {published.title} row with a cell there"
        numbers = "the paper's number"
        not_cells = (
            "Failed runs and runs of rows the paper does not have are listed at the end, not in the table "
            "(`python -m lra.table` without --paper has every row)."
        )
    text = (
        "Each section is one protocol with every setting in which its runs depart from the protocol as declared (its "
        f"`experiment=`) or differ from each other, and the precision where it is not float32 (its title): {rows} and, "
        f"per task, our cell beside {numbers}. Our cell: the mean test accuracy of the "
        "best-validation checkpoint ± its standard error (over seeds, std / √k, where a cell has k ≥ 2 seeds; else the "
        "binomial error √(p(1 − p)/n) of one run on its n test samples). Bold: the best of a task where it beats the "
        "next row by more than twice the standard error of the difference. † = generated data (the official "
        "generators' algorithms, not the LRA release). A cell pools only runs whose whole configuration is equal but "
        f"for the seed. The paper column is {published.source}, under its full protocol (`experiment=paper`), "
        "marked ‡ where the section's protocol is not the paper's: there it is a reference for the ranking, not a "
        "target. Under the rows, per task, how the section agrees with the paper over the rows that have its number: "
        f"Spearman's ρ of our means with the paper's (ties at their average rank; from {MIN_RANKED_ROWS} rows) and, "
        f"for ListOps, the rows on the paper's side of its split: the paper has {group(learn)} and "
        f"{group(chance)}, and a row is on its side when its mean is ≥ {LISTOPS_SPLIT:g}% for the "
        f"first group, < {LISTOPS_SPLIT:g}% for the second. A task without runs in a section says how to get its data. "
        f"{not_cells}"
    )
    return textwrap.wrap(text, 105, break_on_hyphens=False)


def markdown_table(text: pd.DataFrame, num_rows: int) -> list[str]:
    """``text`` (section_frame's) as Markdown, its rows after the first ``num_rows`` (the agreement) in italics."""
    header = ["model", *(task if part == "ours" else part for task, part in text.columns)]
    agreement_rows = set(text.index[num_rows:])
    return [
        "| " + " | ".join(header) + " |",
        "| --- " * len(header) + "|",
        *(
            "| " + " | ".join([f"*{label}*" if label in agreement_rows else label, *values]) + " |"
            for label, values in zip(text.index, text.to_numpy().tolist())
        ),
    ]


def left_out_lines(left_out: pd.DataFrame, published: PaperTable) -> list[str]:
    """A line per run that is not a cell: what it is (its configuration, or that it had none yet), its command line's
    overrides where recorded, and why it is not a cell."""
    lines = []
    for run in left_out.itertuples():
        resolved = pd.notna(run.config_hash)
        what = f"protocol {run.protocol}, config {run.config_hash[:8]}" if resolved else "no configuration resolved"
        overrides = f", overrides: {run.overrides}" if run.overrides else ""
        lines.append(f"- {run.task} / {row_label(run.row, published)} / seed {run.seed}, {what}{overrides}: {run.why}")
    return lines


def heading(table: Table, title: str | None) -> str:
    if table.comparison:
        return f"# {title or 'Comparison'}: LRA test accuracy (%) of each attention, beside {table.published.source}"
    return f"# {title or table.published.title}: LRA test accuracy (%), ours beside the paper's"


def markdown(table: Table, source: str, title: str | None = None) -> str:
    lines = [heading(table, title), "", f"Generated by `python -m lra.table` from {source}.", "", *legend(table)]
    for section in table.sections:
        lines += ["", f"## {section.title}", "", *describe_section(section, table.speed), ""]
        lines += markdown_table(section_frame(section, MARKDOWN, table.speed), len(section.rows))
        if section.duplicates:
            lines += ["", "Counted once:", "", *(f"- {text}" for text in section.duplicates)]
    if not table.left_out.empty:
        lines += ["", "## Not in the table", "", "Runs without a result (no finished run of the configuration and seed)"]
        if not table.comparison:
            lines[-1] += f" and runs of rows the paper's {table.published.title} does not have"
        lines[-1] += ":"
        lines += ["", *left_out_lines(table.left_out, table.published)]
    return "\n".join(lines) + "\n"


CELL_COLUMNS = [
    "section", "protocol", "row", "task", "num_seeds", "seeds", "num_test", "mean", "std", "standard_error", "best",
    "paper", "paper_protocol", "difference", "papers_side", "data_source", "accuracies", "steps_per_s", "peak_memory_mb",
    "devices",
]  # fmt: skip


def cells_frame(table: Table) -> pd.DataFrame:
    """The cells, tidy: one line per section, row and task, with the paper's number (the difference only where the
    section is the paper's protocol) and, for ListOps, whether the row is on the paper's side of its split."""
    parts = [
        section.in_order()
        .reset_index()
        .rename(columns={"label": "row"})
        .assign(section=section.title, protocol=section.protocol, paper_protocol=section.paper_protocol)
        for section in table.sections
    ]
    if not parts:
        return pd.DataFrame(columns=CELL_COLUMNS)
    cells = pd.concat(parts, ignore_index=True)
    cells["difference"] = (cells["mean"] - cells["paper"]).where(cells["paper_protocol"])
    for column in ("seeds", "num_test"):
        cells[column] = cells[column].map(lambda values: " ".join("" if pd.isna(v) else str(v) for v in values))
    cells["accuracies"] = cells["accuracies"].map(lambda values: " ".join(f"{v:.4f}" for v in values))
    return cells[CELL_COLUMNS].round(4)


def agreement_frame(table: Table) -> pd.DataFrame:
    """Per section and task with cells: the rows compared with the paper, those on its ListOps side, Spearman's rho."""
    columns = ["section", "protocol", "task", "rows", "on_papers_side", "spearman"]
    parts = [s.agreement.reset_index().assign(section=s.title, protocol=s.protocol) for s in table.sections]
    parts = [part for part in parts if not part.empty]
    return (pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns))[columns].round(4)


def latex_escape(text: str) -> str:
    return text.replace("_", "\\_").replace("*", "$^*$").replace("%", "\\%")


def latex(table: Table) -> str:
    parts = [
        "% Generated by `python -m lra.table`. Cells: mean $\\pm$ standard error; \\dag = generated data; beside each,"
        " the paper's number ($^\\ddagger$: its full protocol, not the section's); under the rows, Spearman's $\\rho$ with"
        f" the paper and the ListOps rows on the paper's side of {LISTOPS_SPLIT:g}\\%."
    ]
    for section in table.sections:
        text = section_frame(section, LATEX, table.speed)
        text.index = text.index.map(latex_escape)
        text.insert(0, ("Method", ""), text.index)
        tabular = text.to_latex(
            index=False, escape=False, multicolumn=True, multicolumn_format="c", column_format="l" + "c" * (text.shape[1] - 1)
        )
        lines = tabular.splitlines()
        lines.insert(lines.index("\\midrule") + 1 + len(section.rows), "\\midrule")  # between the rows and the agreement
        parts += [f"% {section.title}", "\n".join(lines) + "\n"]
    if not table.left_out.empty:
        parts += [
            "% Not in the table (failed runs):"
            if table.comparison
            else "% Not in the table (failed runs, rows the paper does not have):"
        ]
        parts += [f"% {line[2:]}" for line in left_out_lines(table.left_out, table.published)]
    return "\n".join(parts) + "\n"


def figure(table: Table, path: Path) -> None:
    """The first section (the strongest evidence, :func:`evidence_first`), per task with cells: our mean with its
    standard error beside the paper's number, row by row; the other sections are in the Markdown table beside it, so
    that the picture stays readable at a page's width whatever else was run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    shown = table.sections[:1]
    panels = [[task for task in section.tasks if section.has_cells(task)] for section in shown]
    width = max(map(len, panels), default=1)
    heights = [0.45 * len(section.rows) + 1.6 for section in shown] or [1.0]
    fig = plt.figure(figsize=(4.5 * width + 1, sum(heights) + 0.5), layout="constrained")
    subfigures = fig.subfigures(len(heights), 1, height_ratios=heights, squeeze=False).flat
    for subfig, section, tasks in zip(subfigures, shown, panels):
        protocol = "" if section.paper_protocol else " (paper: its full protocol)"
        more = len(table.sections) - len(shown)
        others = f"; {more} more section{'s' * (more > 1)} in {path.with_suffix('.md').name}" if more else ""
        subfig.suptitle(textwrap.fill(section.title + protocol + others, 50 * width + 10), fontsize=9, fontweight="bold")
        y = np.arange(len(section.rows))
        for ax, task in zip(subfig.subplots(1, width, squeeze=False)[0], [*tasks, *[None] * width]):
            if task is None:
                ax.axis("off")
                continue
            cells = section.cells.xs(task, level="task").reindex(section.rows)
            ax.barh(
                y - 0.2,
                cells["mean"],
                height=0.4,
                xerr=cells["standard_error"],
                color=["tab:orange" if row.startswith("yoso") else "tab:blue" for row in section.rows],
                hatch=["//" if generated is True else None for generated in cells["generated"]],
                edgecolor="white",
            )
            ax.barh(y + 0.2, [section.published.number(row, task) for row in section.rows], height=0.4, color="0.7")
            if task == "listops":
                ax.axvline(LISTOPS_SPLIT, color="black", linestyle=":", linewidth=1)
            rho, side = agreement_text(section, task, MARKDOWN)
            side = f", {side} on the paper's side" if side else ""
            ax.set_title(textwrap.fill(f"{TASK_LABELS.get(task, task)}: ρ {rho}{side}", 48), fontsize=9)
            ax.set_yticks(y, [row_label(r, section.published) for r in section.rows], fontsize=8)
            ax.set_ylim(len(section.rows) - 0.5, -0.5)
            ax.set_xlabel("test accuracy (%)", fontsize=8)
            ax.tick_params(axis="x", labelsize=8)
            ax.grid(axis="x", alpha=0.3)
    fig.legend(
        handles=[
            Patch(color="tab:blue", label="ours: mean ± standard error"),
            Patch(color="tab:orange", label="ours, YOSO rows"),
            Patch(facecolor="white", edgecolor="black", hatch="//", label="generated data"),
            Patch(color="0.7", label=f"the paper's {table.published.title}"),
            Line2D([], [], color="black", linestyle=":", label=f"ListOps split ({LISTOPS_SPLIT:g}%)"),
        ],
        loc="outside upper center",
        ncol=5 if width > 1 else 3,
        fontsize=8,
        frameon=False,
    )
    fig.savefig(path, dpi=100, metadata={"Software": None})  # no version stamp: same runs, same bytes
    plt.close(fig)


def write_all(
    records: list[RunRecord],
    out_dir: Path,
    source: str,
    name: str | None = None,
    protocols: list[str] | None = None,
    published: PaperTable = TABLE3,
    rows: str | tuple[str, ...] = PAPER_ROWS,
    speed: bool = False,
) -> list[Path]:
    """Write ``<name>.{md,csv,tex,png}`` and ``<name>_agreement.csv`` (``name`` by default :func:`default_name`) into
    ``out_dir`` from ``records`` (only those of ``protocols`` if given), with the rows of :func:`build`."""
    if protocols:
        records = [record for record in records if (record.protocol or {}).get("name") in protocols]
    if not records:
        wanted = f" of protocol {', '.join(protocols)}" if protocols else ""
        raise SystemExit(f"error: no run records{wanted} found; train some cells first (python -m lra.train ...)")
    table = build(records, published, rows, speed)
    if isinstance(rows, tuple):
        shown = {base_row(label) for section in table.sections for label in section.rows}
        if missing := [row for row in rows if row not in shown]:
            having = sorted({base_row(record.row) for record in records if record.status == "finished" and record.row})
            check_rows(missing, {base_row(record.row) for record in records if record.row}, having)
            print(f"note: no finished runs of {', '.join(missing)}; rows with finished runs: {', '.join(having) or 'none'}")
    default = default_name(published, rows)
    name = name or default
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}{suffix}" for suffix in (".md", ".csv", "_agreement.csv", ".tex", ".png")]
    paths[0].write_text(markdown(table, source, None if name == default else name))
    cells_frame(table).to_csv(paths[1], index=False, float_format="%.4f")
    agreement_frame(table).to_csv(paths[2], index=False, float_format="%.4f")
    paths[3].write_text(latex(table))
    figure(table, paths[4])
    return paths


def check_rows(missing: list[str], recorded: set[str], having: list[str]) -> None:
    """``--rows`` names without a finished run must at least be rows: registered attentions or presets, or rows
    some record has; a name that is neither (a typo) is an error before anything is written."""
    import difflib

    import attention_zoo

    known = {*attention_zoo.available(), *attention_zoo.presets(), *recorded}
    if unknown := [row for row in missing if row not in known]:
        hints = [
            f"{row} (did you mean {close[0]}?)" if (close := difflib.get_close_matches(row, known, 1)) else row for row in unknown
        ]
        raise SystemExit(
            f"error: --rows names no attention, preset or recorded row: {', '.join(hints)}; rows with finished runs: "
            f"{', '.join(having) or 'none'}. Nothing was written."
        )


def default_name(published: PaperTable, rows: str | tuple[str, ...]) -> str:
    """The files' name: the published table's (``table3``) for its own rows, else ``comparison`` (beside Table 3's
    numbers) or ``comparison_<paper>``."""
    if rows == PAPER_ROWS:
        return published.name
    return COMPARISON if published is TABLE3 else f"{COMPARISON}_{published.name}"


def parse_rows(text: str) -> str | tuple[str, ...]:
    """``--rows``: ``paper``, ``all`` or a comma-separated list of rows (presets or attentions), in the order wanted."""
    if text in (PAPER_ROWS, ALL_ROWS):
        return text
    rows = tuple(row.strip() for row in text.split(",") if row.strip())
    if not rows:
        raise argparse.ArgumentTypeError(f"expected {PAPER_ROWS}, {ALL_ROWS} or rows separated by commas, got {text!r}")
    return rows


def main(argv: list[str] | None = None) -> None:
    output_dir = Path(os.environ.get("LRA_OUTPUT_DIR", "outputs"))
    parser = argparse.ArgumentParser(prog="python -m lra.table", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--runs",
        type=Path,
        nargs="*",
        default=[output_dir],
        help="folders searched for results.json (default: outputs/ or $LRA_OUTPUT_DIR)",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=Path("results"),
        help="the committed results; their runs/ subfolder holds the committed run records",
    )
    parser.add_argument(
        "--out", type=Path, default=output_dir, help="where the user's table goes (default: outputs/ or $LRA_OUTPUT_DIR)"
    )
    parser.add_argument(
        "--collect",
        action="store_true",
        help="copy finished runs into RESULTS/runs/, then write RESULTS/NAME.* (implies --committed)",
    )
    parser.add_argument(
        "--committed", action="store_true", help="write RESULTS/NAME.* from RESULTS/runs/ alone instead of the user's table"
    )
    parser.add_argument(
        "--paper",
        choices=sorted(TABLES),
        help="the published table whose numbers stand beside the cells: table3 (the YOSO paper's Table 3, the default) or "
        "lra_table1 (the LRA paper's Table 1); given alone, the table as the paper prints it (its rows only): NAME.*",
    )
    parser.add_argument(
        "--rows",
        type=parse_rows,
        help="which rows: 'all' (every attention with finished runs, the paper's rows first in its order, then the others "
        "by name: comparison.*, the default without --paper), 'paper' (the published table's rows: the default with --paper) "
        "or rows separated by commas, in the order wanted (e.g. softmax,yoso_32,my_attention)",
    )
    parser.add_argument(
        "--speed", action="store_true", help="also show each cell's training steps per second and peak memory (MB)"
    )
    parser.add_argument(
        "--protocol", nargs="+", metavar="NAME", help="only runs of these protocols (e.g. spt_short); default: every run"
    )
    parser.add_argument(
        "--name", help="the tables' file name, NAME.{md,csv,tex,png} (default: comparison, or the --paper's name for its rows)"
    )
    args = parser.parse_args(argv)
    runs_dir = args.results / "runs"
    rows = args.rows or (PAPER_ROWS if args.paper else ALL_ROWS)
    published = TABLES[args.paper or TABLE3.name]
    only = {"name": args.name, "protocols": args.protocol, "published": published, "rows": rows, "speed": args.speed}
    if args.collect:
        found = find_record_files(args.runs)
        check_hashes(found)
        new = collect([record for _, record in found], runs_dir)
        print(f"{new} new run records in {runs_dir}")
    if args.collect or args.committed:
        paths = write_all(find_records([runs_dir]), args.results, f"the run records committed in `{runs_dir}/`", **only)
    else:
        paths = write_all(
            find_records([*args.runs, runs_dir]),
            args.out,
            f"the runs in `{', '.join(map(str, args.runs))}` and `{runs_dir}/`",
            **only,
        )
    for path in paths:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
