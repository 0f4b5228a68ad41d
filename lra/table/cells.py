"""The table's second stage: run records to cells, and how the cells agree with the paper.

A cell is a row's runs of one task in one section, pooled over seeds (:func:`cell_frame`); which runs may be pooled is
:func:`settings`' and :func:`counted_runs`' rule. Under a section's rows, :func:`agreement` compares its cells with the
paper's numbers.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd

from ..paper import PaperTable
from ..results import CONFIGURATION_KEYS, RunRecord

TASKS = ("listops", "text", "retrieval", "image", "pathfinder")
#: Both papers' ListOps rows sit at 34-37% (they learn the task) or 16-19% (they do not): a row is on
#: the paper's side of this split when its mean is on the same side of it as the paper's number.
LISTOPS_SPLIT = 28.0
MIN_RANKED_ROWS = 3  # Spearman's rho only from this many rows up (two rows always give +-1)
NOT_RECORDED = "not recorded"  # a setting an older record does not have: a value of its own
BEST_MARGIN = 2.0  # "best" only beyond this many standard errors of the difference to the next row
AGREE_MARGIN = 2.0  # two cells of one row agree where their means differ by at most this many standard errors
# A run record's identity, and what makes two of them one cell (with the seed) or one section.
SAME_RUN = ["setting", "data_source", "seed"]


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested configuration as ``dotted.key: JSON value``, keys sorted."""
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
    as one label.

    This is what a cell pools over: only runs whose whole configuration is equal but for the seed (task, attention
    and every hyperparameter, model, every protocol field, sequence length, data settings; the data source the run
    used is :data:`SAME_RUN`'s). Training from scratch and self-pretraining (``pretrain``, one
    :func:`pretraining_label`), and each position scheme (``model.positions``), are settings like any other: runs
    that differ in them are never pooled, and the section titles say which is which (``pretrain=none``,
    ``pretrain=mlm (...)``). A record written before a setting existed has the value runs had then
    (``lra.results.ADDED_SETTINGS``, which :meth:`RunRecord.configuration` fills in), and a key it lacks all the
    same is :data:`NOT_RECORDED`, a value of its own.
    """
    flat = {}
    for part in CONFIGURATION_KEYS:
        if part == "pretrain":
            flat[part] = json.dumps(pretraining_label(config[part], config.get("protocol")))
        else:
            flat.update(flatten(config[part], f"{part}.") if part in config else {part: json.dumps(NOT_RECORDED)})
    return flat


def others_load_per_cpu(load: dict[str, float] | None) -> float | None:
    """What else ran on the machine while a run's steps were timed (its record's ``machine_load``): the load average
    beyond the run's own threads, at the busier of the timing's start and end, per CPU; None where not recorded."""
    if not load:
        return None
    return max(0.0, max(load["load_at_start"], load["load_at_end"]) - load["threads"]) / load["cpus"]


def frame(records: list[RunRecord]) -> pd.DataFrame:
    """One row per distinct run: its identity, configuration and result. Copies of one run (e.g. in ``outputs/`` and
    ``results/runs/``) are one record."""
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
                "test_correct": record.test_correct if finished else None,
                # Which test set it was tested on: runs of one task, data source and data settings share theirs.
                "test_set": json.dumps([record.task, record.data_source, config.get("data")], sort_keys=True),
                "steps_per_s": record.steps_per_second if finished else None,
                "peak_memory_mb": record.peak_memory_mb if finished else None,
                "others_load_per_cpu": others_load_per_cpu(record.machine_load) if finished else None,
                "compiled": bool(record.compiled) if finished else None,  # its steps/s is a compiled step's
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


def counted_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The finished runs that count (``runs`` is :func:`frame`'s), with how many ``copies`` each stands for: two
    records of one configuration, data source and seed count once, the latest finished. Distinct runs of one
    configuration and seed are named under their section (:attr:`lra.table.sections.Section.duplicates`)."""
    finished = runs[runs["status"] == "finished"].sort_values("finished_at", kind="stable")
    copies = finished.groupby(SAME_RUN, dropna=False).size().rename("copies")
    return finished.drop_duplicates(SAME_RUN, keep="last").join(copies, on=SAME_RUN)


def configs_of(runs: pd.DataFrame) -> pd.DataFrame:
    """Each run's configuration, a column per key (JSON values, sorted); a key a record lacks is NOT_RECORDED."""
    configs = pd.DataFrame(runs["setting"].map(json.loads).tolist(), index=runs.index)
    return configs[sorted(configs)].fillna(json.dumps(NOT_RECORDED))


def what_differs(configs: pd.DataFrame, groups: list[pd.Series]) -> pd.Series:
    """Per run, ``key=value, ...`` for each key whose value differs between the runs of its group (``configs`` grouped
    by ``groups``), in the columns' order; "" where none does."""
    differing = configs.where(configs.groupby(groups).transform("nunique") > 1)
    return differing.apply(lambda run: ", ".join(f"{key}={json.loads(value)}" for key, value in run.dropna().items()), axis=1)


def per_sample(test_correct: pd.Series) -> np.ndarray | None:
    """Each test sample's accuracy over a cell's runs (their records' ``test_correct``, one string of 0s and 1s each),
    in the test set's order; None where a run did not record it (one written before runs did) or two runs' test sets
    differ in size."""
    if test_correct.isna().any() or test_correct.str.len().nunique() != 1:
        return None
    return np.mean([np.frombuffer(correct.encode(), dtype=np.uint8) - ord("0") for correct in test_correct], axis=0)


def difference_error(first: pd.Series, second: pd.Series) -> tuple[float, bool]:
    """The standard error of the difference of two cells' means (:func:`cell_frame`'s cells), and whether it is paired.

    Its parts, in quadrature: each cell's seeds' spread, and the sampling error of the test set. Two cells tested on one
    test set whose runs all recorded which samples they classified correctly are paired on it: that error is the
    spread of the per-sample differences, sqrt(var(d) / n) with d the n samples' accuracies of one cell minus the
    other's (the two binomial errors combined, less twice their covariance: far less where the two cells predict
    alike, as one model does on two devices). Otherwise it is the two cells' binomial errors combined, as if their test
    sets were independent draws.
    """
    seeds = np.hypot(first["seed_error"], second["seed_error"])
    a, b = first["per_sample"], second["per_sample"]
    one_test_set = len(first["test_sets"]) == 1 and first["test_sets"] == second["test_sets"]
    paired = a is not None and b is not None and len(a) == len(b) and one_test_set
    test = 100 * np.sqrt((b - a).var() / len(a)) if paired else np.hypot(first["test_error"], second["test_error"])
    return float(np.hypot(seeds, test)), paired


def best_rows(cells: pd.DataFrame) -> pd.Series:
    """True for the row of a section and task whose mean beats the next row's by more than BEST_MARGIN standard
    errors of their difference (:func:`difference_error`; so at most one per task, and none among rows within the
    noise)."""
    best = pd.Series(False, index=cells.index)
    for _, task in cells.groupby(level=["section", "task"]):
        ranked = task.sort_values("mean", ascending=False, kind="stable")
        if len(ranked) >= 2:
            top, runner_up = ranked.iloc[0], ranked.iloc[1]
            best[top.name] = top["mean"] - runner_up["mean"] > BEST_MARGIN * difference_error(runner_up, top)[0]
    return best


def on_papers_side(cells: pd.DataFrame) -> pd.Series:
    """For a ListOps cell with the paper's number: whether its mean is on the same side of LISTOPS_SPLIT as the paper's."""
    listops = (cells.index.get_level_values("task") == "listops") & cells["paper"].notna()
    side = (cells["mean"] >= LISTOPS_SPLIT) == (cells["paper"] >= LISTOPS_SPLIT)
    return side.astype("boolean").where(listops)


def cell_frame(runs: pd.DataFrame, published: PaperTable) -> pd.DataFrame:
    """One row per cell, indexed by (section, row label, task): the runs pooled, their mean, standard error,
    the paper's number, whether the cell is its task's best and (ListOps) on the paper's side.

    The mean is the test accuracy (%) over the cell's seeds. Its standard error has two parts: the seeds' spread,
    std / sqrt(k) where it has k >= 2 seeds (``seed_error``), and the sampling error of the test set the seeds share,
    the binomial sqrt(p (1 - p) / n) of the mean on its n test samples, which averaging seeds does not reduce
    (``test_error``); in quadrature. ``per_sample``: each test sample's accuracy over the seeds, where every run of the
    cell recorded which samples it classified correctly (:func:`difference_error` pairs two cells by it). The
    paper's number is the one of the paper's row as the cell's preset defines it (:meth:`lra.paper.PaperTable.number`),
    NaN for a row the paper does not have or a changed one.
    """
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
        compiled=("compiled", lambda compiled: bool(compiled.fillna(False).any())),
        devices=("device", lambda devices: " + ".join(sorted(set(devices)))),
        config_hashes=("config_hash", list),
        test_sets=("test_set", lambda test_sets: sorted(set(test_sets))),
        per_sample=("test_correct", per_sample),
    )
    p, n = cells["mean"] / 100, pd.to_numeric(cells["num_test"].str[0], errors="coerce")
    cells["test_error"] = 100 * np.sqrt(p * (1 - p) / n)
    cells["seed_error"] = (cells["std"] / np.sqrt(cells["num_seeds"])).where(cells["num_seeds"] > 1, 0.0)
    cells["standard_error"] = np.hypot(cells["seed_error"], cells["test_error"])
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
    """Per task of one section's cells, over its rows with the paper's number (the others are not compared): how many
    rows, Spearman's rho of our means with the paper's and, for ListOps, how many rows are on the paper's side of its
    split (:func:`on_papers_side`)."""
    compared = cells[cells["paper"].notna()]
    columns = ["rows", "on_papers_side", "spearman"]
    if compared.empty:
        return pd.DataFrame(columns=columns, index=pd.Index([], name="task"))
    by_task = compared.groupby(level="task")
    result = by_task.agg(rows=("paper", "size"), on_papers_side=("papers_side", "sum")).astype("Int64")
    result["on_papers_side"] = result["on_papers_side"].where(result.index == "listops")
    result["spearman"] = by_task.apply(lambda task: spearman(task["mean"], task["paper"]))
    return result[columns]


def compared_cells(first: pd.DataFrame, second: pd.DataFrame) -> pd.DataFrame:
    """The cells of one row and task in both ``first`` and ``second`` (two sections' cells, indexed by (row label,
    task)), side by side: each one's mean, standard error and devices, the difference (second - first), its standard
    error (:func:`difference_error`, and whether it is ``paired`` on the test set) and whether they agree, within
    :data:`AGREE_MARGIN` of it."""
    both = first.index.intersection(second.index)
    columns = ["mean", "standard_error", "devices", "num_seeds"]
    pairs = first.loc[both, columns].add_suffix("_first").join(second.loc[both, columns].add_suffix("_second"))
    pairs["difference"] = pairs["mean_second"] - pairs["mean_first"]
    errors = [difference_error(first.loc[cell], second.loc[cell]) for cell in both]
    pairs["difference_error"] = [error for error, _ in errors]
    pairs["paired"] = [paired for _, paired in errors]
    pairs["agree"] = pairs["difference"].abs() <= AGREE_MARGIN * pairs["difference_error"]
    return pairs
