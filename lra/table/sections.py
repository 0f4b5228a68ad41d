"""The table's third stage: cells into sections, one per protocol and setting, in the order of their evidence.

:func:`build` makes the :class:`Table`: the records' runs (:mod:`lra.table.cells`) titled by section
(:func:`section_titles`) and labelled by row (:func:`row_labels`), pooled into cells, the sections strongest evidence
first (:func:`evidence_first`), and the runs that are not cells (:func:`left_out_runs`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd

from ..paper import TABLE3, TABLES, PaperTable
from ..results import FLOAT32, RunRecord
from .cells import (
    NOT_RECORDED,
    TASKS,
    agreement,
    cell_frame,
    compared_cells,
    configs_of,
    counted_runs,
    frame,
    what_differs,
)
from .records import as_result

# Keys that name the row, not the section: the attention and its hyperparameters.
ROW_KEYS = ("attention", "attention_hparams.")
PAPER_ROWS = "paper"  # the rows of the published table only: the table as the paper prints it
ALL_ROWS = "all"  # every row with finished runs: the paper's in its order, then the others by name
COMPARISON = "comparison"  # the files of a table of ALL_ROWS (or of rows asked for)
LEFT_OUT_COLUMNS = ["task", "row", "seed", "protocol", "config_hash", "overrides", "why"]
TASK_LABELS = {"listops": "ListOps", "text": "Text", "retrieval": "Retrieval", "image": "Image", "pathfinder": "Pathfinder"}


def base_row(row: str) -> str:
    """The preset or registered attention of a run's row (``yoso_32`` of ``yoso_32 attention.hparams.num_hashes=16``)."""
    return row.split(" ")[0]


def row_label(row: str, published: PaperTable) -> str:
    """A run's row as the paper labels its preset, with any change after it."""
    base, _, rest = row.partition(" ")
    return published.label(base) + (f" {rest}" if rest else "")


def is_paper_row(row: str, published: PaperTable) -> bool:
    """Whether a run's row (its preset, with any command-line change) is a row of the paper's table."""
    return base_row(row) in published.presets


def row_order(label: str, order: tuple[str, ...]) -> tuple[int, str, str]:
    """Rows in ``order`` (the paper's, or the one asked for), then the others by name; a changed or split row after
    its preset."""
    base = base_row(label)
    return (order.index(base) if base in order else len(order)), base, label


@cache
def declared_protocol(name: str, task: str) -> dict[str, Any] | None:
    """The protocol ``name`` as its experiment declares it for ``task`` (``experiment=<name> task=<task>``, composed);
    None where no experiment of that name declares it (a protocol named on the command line)."""
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    from .. import config

    try:
        protocol = OmegaConf.to_container(config.compose([f"task={task}", f"experiment={name}"]).task.protocol, resolve=True)
    except HydraException:
        return None
    return protocol if protocol.get("name") == name else None


def asked(protocol: dict[str, Any], adjusted: dict[str, Any]) -> dict[str, Any]:
    """A run's protocol as the run asked for it: before a shortened run's fitting, which follows from it."""
    return {**protocol, **{key: change["from"] for key, change in adjusted.items() if key in protocol}}


def departures(protocol: dict[str, Any] | None, adjusted: dict[str, Any], task: str) -> dict[str, str]:
    """``protocol.<key>: JSON value`` for each setting in which a run's protocol departs from its protocol as declared
    (:func:`declared_protocol`), the values as the run asked for them; none where the protocol is declared nowhere."""
    protocol = protocol or {}
    declared = declared_protocol(protocol.get("name", NOT_RECORDED), task)
    if declared is None:
        return {}
    return {
        f"protocol.{key}": json.dumps(value, sort_keys=True)
        for key, value in sorted(asked(protocol, adjusted).items())
        if key in declared and declared[key] != value
    }


def set_by_the_user(protocol: dict[str, Any] | None, adjusted: dict[str, Any], overrides: str) -> dict[str, str]:
    """``protocol.<key>: JSON value`` for each protocol setting the run's command line set (``task.protocol.<key>=``),
    as asked: what the user declared, which titles the runs of every task it was given to alike, where one task's
    experiment declares that value already and another's does not. A committed record keeps no command line."""
    values = asked(protocol or {}, adjusted)
    keys = {
        token.split("=", 1)[0].removeprefix("task.protocol.") for token in overrides.split() if token.startswith("task.protocol.")
    }
    return {f"protocol.{key}": json.dumps(values[key], sort_keys=True) for key in sorted(keys) if key in values}


def section_titles(runs: pd.DataFrame, precision: bool = True) -> pd.Series:
    """A run's section: its protocol as the user declared it, and the precision where it is not float32.

    Runs that differ in anything but their row and seed are never averaged: a section is one protocol (its ``name``)
    with the value of every protocol setting in which its runs depart from the protocol as its experiment declares it
    for their task (:func:`departures`: a lone 20-step run is titled ``protocol.max_steps=20``) or that their command
    line set (:func:`set_by_the_user`: one sweep of two tasks is one section), of every other setting that differs
    between the protocol's cells of a task (``model.positions``, ``pretrain``), and the precision where it is not
    float32 (float32 and bf16 runs never pool). A protocol's runs that depart from nothing declared (a protocol named on
    the command line) but differ are rows of one section, labelled by what differs (:func:`row_labels`); the runs of
    the declared protocol keep its name beside a user's shortened ones. ``precision=False``: the title without the
    precision, which the sections of one protocol in several precisions share (:func:`precision_pairs`).
    """
    configs = configs_of(runs)
    other_keys = [key for key in configs if not key.startswith((*ROW_KEYS, "protocol.")) and (precision or key != "precision")]
    differing = configs[other_keys].where(configs[other_keys].groupby([runs["protocol"], runs["task"]]).transform("nunique") > 1)
    titles = []
    for (index, run), differs in zip(runs.iterrows(), differing.itertuples(index=False)):
        shown = {key: value for key, value in zip(other_keys, differs) if isinstance(value, str)}
        shown.update(departures(run["protocol_fields"], run["adjusted"], run["task"]))
        shown.update(set_by_the_user(run["protocol_fields"], run["adjusted"], run["overrides"]))
        if precision and json.loads(run_precision(configs, index)) != FLOAT32:
            shown["precision"] = run_precision(configs, index)
        titles.append(", ".join([run["protocol"], *(f"{key}={json.loads(shown[key])}" for key in sorted(shown))]))
    return pd.Series(titles, index=runs.index)


def run_precision(configs: pd.DataFrame, index: Any) -> str:
    """The precision (a JSON value) of the run at ``index`` of ``configs`` (:func:`configs_of`); float32 for a record
    of before precision was recorded."""
    return configs.at[index, "precision"] if "precision" in configs else json.dumps(FLOAT32)


def natural_order(text: str) -> list[tuple[int, float | str]]:
    """A sort key that orders the numbers in ``text`` by value: ``max_steps=5`` before ``max_steps=10``."""
    parts = re.split(r"(-?\d+(?:\.\d+)?(?:e-?\d+)?)", text)
    return [(1, float(part)) if i % 2 else (0, part) for i, part in enumerate(parts) if part]


def row_labels(runs: pd.DataFrame) -> pd.Series:
    """A run's row in its section: the row, or where runs of one row and task still differ there (a changed preset,
    another data source), the row with what differs: ``yoso_32 (attention_hparams.num_hashes=16)``. Such runs are
    separate rows, never pooled."""
    configs = configs_of(runs).assign(data_source=runs["data_source"].map(json.dumps))
    differs = what_differs(configs[sorted(configs)], [runs["section"], runs["row"], runs["task"]])
    return runs["row"] + differs.map(lambda text: f" ({text})" if text else "")


@cache
def paper_setup(task: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The paper's protocol and model for ``task`` as ``experiment=paper`` composes them (``conf/task/<task>.yaml`` and
    ``conf/model/lra.yaml``): the full protocol under which the paper's numbers stand."""
    from hydra.errors import MissingConfigException
    from omegaconf import OmegaConf

    from .. import config

    try:
        cfg = config.compose([f"task={task}", "experiment=paper"])
    except MissingConfigException:  # a task this version has no config for
        return None
    return OmegaConf.to_container(cfg.task.protocol), OmegaConf.to_container(cfg.model)


def not_paper_because(runs: pd.DataFrame, published: PaperTable) -> str:
    """What in one section's runs differs from the protocol and model of the paper ``published`` (its
    :attr:`~lra.paper.PaperTable.protocol` as :func:`paper_setup` composes it); "" where nothing does. Only such a
    section's cells are compared with the paper's as equals (the difference, the paper column unmarked); in every other
    section the paper's number is a reference under its own protocol."""
    protocol = runs["protocol"].iloc[0]
    if published.protocol is None:
        return f"{published.title} ran a protocol of its own"
    if protocol != published.protocol:
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
    precision: str = FLOAT32  # its runs' (Lightning's name)
    local: bool = False  # it has runs of the user's own (in the output folder, not only committed records)
    title_without_precision: str = ""  # what the sections of one protocol in several precisions share; default: title

    def __post_init__(self) -> None:
        if self.cells.empty:
            raise ValueError(f"section {self.title!r} has no cells")
        self.order = self.order or self.published.presets
        self.title_without_precision = self.title_without_precision or self.title
        self.agreement = agreement(self.cells)

    @property
    def paper_protocol(self) -> bool:
        return not self.not_paper_because

    @property
    def rows(self) -> list[str]:
        return sorted(self.cells.index.unique("label"), key=lambda label: row_order(label, self.order))

    @property
    def tasks(self) -> list[str]:
        """The paper's five tasks, cells or not (a task without cells keeps its columns: the paper's numbers), then
        any other task with cells."""
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


def evidence_first(section: Section) -> tuple:
    """The order of the sections: the user's own runs first, then the strongest evidence: the paper's protocol as run
    (then as declared), then the section with the most rows, then the most runs; ties by protocol name and the values
    of the settings, numbers by value (:func:`natural_order`)."""
    runs = int(section.cells["num_seeds"].sum())
    return (
        not section.local,
        not section.paper_protocol,
        section.protocol != "paper",
        -len(section.rows),
        -runs,
        section.protocol,
        natural_order(section.title),
    )


@dataclass
class PrecisionPair:
    """Two sections of one protocol and settings but for the precision (a CPU's float32 and a GPU's bf16, say), and
    their cells of the rows and tasks both have (:func:`lra.table.cells.compared_cells`): a check of the protocol
    across precisions and devices."""

    first: Section  # the float32 one, where there is one
    second: Section
    cells: pd.DataFrame


def precision_pairs(sections: list[Section]) -> list[PrecisionPair]:
    """Each pair of ``sections`` that differ only in their precision and share a cell of some row and task, the float32
    section first, in the sections' order."""
    pairs = []
    for i, first in enumerate(sections):
        for second in sections[i + 1 :]:
            if first.title_without_precision != second.title_without_precision:
                continue
            if second.precision == FLOAT32:
                first, second = second, first
            both = compared_cells(first.cells, second.cells)
            if not both.empty:
                pairs.append(PrecisionPair(first, second, both))
    return pairs


@dataclass
class Table:
    published: PaperTable
    sections: list[Section]
    left_out: pd.DataFrame  # runs that are not cells: LEFT_OUT_COLUMNS
    rows: str | tuple[str, ...] = PAPER_ROWS  # PAPER_ROWS, ALL_ROWS, or the rows asked for, in their order
    speed: bool = False  # the Markdown and LaTeX show each cell's training steps/s and peak memory

    @property
    def precision_pairs(self) -> list[PrecisionPair]:
        return precision_pairs(self.sections)

    @property
    def comparison(self) -> bool:
        """Whether rows the paper does not have are rows here (every table but the paper's own)."""
        return self.rows != PAPER_ROWS


def left_out_runs(runs: pd.DataFrame, unknown: pd.DataFrame, published: PaperTable) -> pd.DataFrame:
    """Runs that are not cells, each once: the latest record of a configuration and seed with no finished run, and
    the counted runs of rows the paper's table does not have.

    A run without a result says why: failed, diverged, refused for a bad value before its configuration was resolved
    (its record has none), running, or abandoned (:func:`lra.table.records.with_live_status`), its first line only.
    """
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
    records: list[RunRecord],
    published: PaperTable = TABLE3,
    rows: str | tuple[str, ...] = PAPER_ROWS,
    speed: bool = False,
    curves: dict[str, Path] | None = None,
    local: set[str] | frozenset[str] = frozenset(),
) -> Table:
    """The table of ``records`` beside the paper's table ``published``: its sections of cells, and the runs that are
    not cells. ``rows``: PAPER_ROWS (the published table: its rows only, in its order), ALL_ROWS (every row with
    finished runs: the paper's in its order, then the others by name) or the rows to show, in their order. A finished
    record that is not a result (:func:`lra.table.records.as_result`, its curve from ``curves`` where there) is listed
    with why, never a cell. ``local``: the configuration hashes of the user's own runs (their sections come first).

    In the published table, runs of a row that is in no published table (``lra/paper.py``) are listed with the runs
    that are not cells; a row of another published table only is left out without a word: it is that table's.
    """
    table = Table(published, [], pd.DataFrame(columns=LEFT_OUT_COLUMNS), rows, speed)
    runs = frame([as_result(record, curves or {}) for record in records])
    if runs.empty:
        return table
    counted = counted_runs(runs)
    if rows == PAPER_ROWS:
        in_table = counted["row"].map(lambda row: is_paper_row(row, published)).astype(bool)
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
    without_precision = section_titles(cell_runs, precision=False)
    configs = configs_of(cell_runs)
    cells = cell_frame(cell_runs, published)
    sections = [
        Section(
            title=title,
            protocol=runs_of["protocol"].iloc[0],
            not_paper_because=not_paper_because(runs_of, published),
            cells=cells.xs(title, level="section"),
            published=published,
            order=order,
            precision=json.loads(run_precision(configs, runs_of.index[0])),
            local=bool(runs_of["config_hash"].isin(local).any()),
            title_without_precision=without_precision[runs_of.index[0]],
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
