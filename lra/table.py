"""Table 3 of the YOSO paper from the runs' records: ``python -m lra.table``.

Reads every ``results.json`` under the output folder (``outputs/``, ``$LRA_OUTPUT_DIR``) and the run
records committed under ``results/runs/``, and writes ``table3.{md,csv,tex,png}`` into the output
folder: the user's table, beside the user's runs. ``--collect`` copies the finished local runs into
``results/runs/`` (one small JSON each, without machine-specific paths), and ``--committed`` (implied
by ``--collect``) writes ``results/table3.*`` from the committed records alone, so the committed
table never holds a run that is not committed beside it.

Rules:

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
  values of every setting that differs between the protocol's runs of a task (``protocol.max_steps=20``),
  and within a section, runs of one row that still differ (a preset changed, another data source)
  are separate rows labelled by what differs.
* A cell shows the mean test accuracy (%) and its standard error: over seeds (std / sqrt(k)) where it
  has k >= 2 seeds, else the binomial standard error of one accuracy on its n test samples,
  sqrt(p (1 - p) / n). The best mean of a task is bold only when it beats the next row by more than
  twice the standard error of their difference.
* The paper's number and the difference are printed only in sections whose protocol and model are
  the paper's (``conf/task/<task>.yaml`` and ``conf/model/lra.yaml``, as ``experiment=paper``
  composes them); other sections say what differs and compare rows with each other only.
* "Did not finish" names only configurations and seeds with no finished run.

Writing twice from the same records gives the same files.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd

from . import paper
from .results import RESULTS_FILE, with_added_settings

TASKS = ("listops", "text", "retrieval", "image", "pathfinder")
TASK_LABELS = {"listops": "ListOps", "text": "Text", "retrieval": "Retrieval", "image": "Image", "pathfinder": "Pathfinder"}
#: Table 3 of the YOSO paper (ICML 2021): test accuracy (%) per row (our preset names) and task.
PAPER_TABLE3: dict[str, dict[str, float]] = {row.preset: row.accuracy for row in paper.TABLE3}
PAPER_LABELS = {row.preset: row.label for row in paper.TABLE3}
# Paths differ per machine and mean nothing in a committed record.
MACHINE_SPECIFIC = ("best_checkpoint", "data_folder", "data_prepared_from", "resumed_from")
# The parts of a record that configure a run (flattened into the keys a cell must agree on).
CONFIG_PARTS = ("task", "attention", "attention_hparams", "model", "protocol", "seq_len", "data", "pretrain")
# Keys that name the row, not the section: the attention and its hyperparameters.
ROW_KEYS = ("attention", "attention_hparams.")
NOT_RECORDED = "not recorded"  # a setting an older record does not have: a value of its own
BEST_MARGIN = 2.0  # "best" only beyond this many standard errors of the difference to the next row


def find_records(folders: Iterable[Path]) -> list[dict[str, Any]]:
    """Every run record under ``folders`` (``results.json`` files and ``*.json`` run records)."""
    records = []
    for folder in folders:
        folder = Path(folder)
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob(RESULTS_FILE)) + sorted(folder.glob("*.json")):
            try:
                record = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as error:
                raise SystemExit(f"error: {path} is not a readable run record ({error})") from None
            # A pretraining run (lra.train's stage "pretraining") is part of its fine-tuning runs, not a cell.
            if isinstance(record, dict) and "config_hash" in record and "task" in record and "stage" not in record:
                record.setdefault("row", record.get("attention"))
                records.append(record)
    return records


def run_file_name(record: dict[str, Any]) -> str:
    row = record["row"].replace(" ", "_").replace("/", "-").replace("=", "-")
    return f"{record['task']}__{row}__{record['protocol']['name']}__seed{record['seed']}__{record['config_hash'][:8]}.json"


def collect(records: list[dict[str, Any]], runs_dir: Path) -> int:
    """Copy finished runs into ``runs_dir`` as small JSON files; return how many were new."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    new = 0
    for record in records:
        if record.get("status") != "finished":
            continue
        path = runs_dir / run_file_name(record)
        new += not path.exists()
        small = {key: value for key, value in record.items() if key not in MACHINE_SPECIFIC}
        path.write_text(json.dumps(small, indent=2, sort_keys=True) + "\n")
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


def settings(record: dict[str, Any]) -> dict[str, str]:
    """The record's configuration, flattened to ``key: JSON value``, seed excluded; the pretraining as one label."""
    record = with_added_settings(record)
    flat = {}
    for part in CONFIG_PARTS:
        if part == "pretrain":
            flat[part] = json.dumps(pretraining_label(record[part], record.get("protocol")))
        else:
            flat.update(flatten(record[part], f"{part}.") if part in record else {part: json.dumps(NOT_RECORDED)})
    return flat


def frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per distinct run: its identity, configuration and result."""
    rows = []
    for record in records:
        config = settings(record)
        finished = record.get("status") == "finished"
        rows.append(
            {
                "task": record["task"],
                "row": record["row"],
                "seed": record["seed"],
                "protocol": record.get("protocol", {}).get("name", NOT_RECORDED),
                "status": record.get("status", "unknown"),
                "error": record.get("error") or "",
                "finished_at": record.get("finished_at") or "",
                "config_hash": record["config_hash"],
                "setting": json.dumps(config, sort_keys=True),
                # A finished run also says which data it used (source=auto resolves to one of two).
                "data_source": record.get("data_source", NOT_RECORDED) if finished else None,
                "accuracy": 100 * record["test_acc"] if finished else math.nan,
                "num_test": (record.get("num_samples") or {}).get("test") if finished else None,
                "model": with_added_settings(record)["model"],
                "protocol_fields": record.get("protocol"),
            }
        )
    runs = pd.DataFrame(rows)
    # The same run found twice (outputs/ and results/runs/) is one record.
    return runs.drop_duplicates(subset=["config_hash", "seed", "status", "finished_at"]).reset_index(drop=True)


@dataclass
class Cell:
    accuracies: list[float]  # test accuracy (%) per seed
    seeds: list[int]
    num_test: list[int]
    data_sources: list[str]
    paper: float | None = None  # the paper's number, where the section is the paper's protocol

    @property
    def mean(self) -> float:
        return sum(self.accuracies) / len(self.accuracies)

    @property
    def std(self) -> float:
        return float(pd.Series(self.accuracies).std()) if len(self.accuracies) > 1 else math.nan

    @property
    def standard_error(self) -> float:
        """Over seeds where there are several, else the binomial error of one run's accuracy."""
        if len(self.accuracies) > 1:
            return self.std / math.sqrt(len(self.accuracies))
        p = self.mean / 100
        return 100 * math.sqrt(p * (1 - p) / self.num_test[0]) if self.num_test[0] else math.nan

    @property
    def generated(self) -> bool:
        return "generated" in self.data_sources


@dataclass
class Section:
    protocol: str
    differs: tuple[tuple[str, str], ...]  # (key, JSON value) the section's runs share and others of the protocol do not
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)  # (row label, task) -> cell
    rows: list[str] = field(default_factory=list)  # row labels in table order
    failed: list[dict[str, Any]] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    paper_protocol: bool = False
    not_paper_because: str = ""

    @property
    def title(self) -> str:
        return self.protocol + "".join(f", {key}={json.loads(value)}" for key, value in self.differs)

    @property
    def tasks(self) -> list[str]:
        present = {task for _, task in self.cells}
        return [task for task in TASKS if task in present] + sorted(present - set(TASKS))

    def average(self, row: str) -> float | None:
        """The mean over the five tasks, only when every task has a cell (like the paper's Avg)."""
        cells = [self.cells.get((row, task)) for task in TASKS]
        return None if any(c is None for c in cells) else sum(c.mean for c in cells) / len(TASKS)

    def best(self, task: str) -> str | None:
        """The row whose mean beats every other row of ``task`` by more than the noise, if any."""
        ranked = sorted(((cell.mean, row) for (row, t), cell in self.cells.items() if t == task), reverse=True)
        if len(ranked) < 2:
            return None
        (top, top_row), (second, second_row) = ranked[:2]
        noise = math.hypot(self.cells[top_row, task].standard_error, self.cells[second_row, task].standard_error)
        return top_row if top - second > BEST_MARGIN * noise else None


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


def row_order(label: str) -> tuple[int, str]:
    base = label.split(" ")[0]
    return (paper.ROWS.index(base) if base in paper.ROWS else len(paper.ROWS), label)


def build_sections(records: list[dict[str, Any]]) -> list[Section]:
    runs = frame(records)
    if runs.empty:
        return []
    config = runs["setting"].map(json.loads)
    finished = runs[runs["status"] == "finished"]
    # Keys whose values differ between a protocol's runs of one task, the row's own keys aside.
    differs: dict[tuple[str, str], list[str]] = {}
    for (protocol, task), group in runs.groupby(["protocol", "task"]):
        keys = sorted({key for c in config[group.index] for key in c})
        differs[protocol, task] = [
            key
            for key in keys
            if not key.startswith(ROW_KEYS) and len({c.get(key, json.dumps(NOT_RECORDED)) for c in config[group.index]}) > 1
        ]

    def section_key(index: int) -> tuple[str, tuple[tuple[str, str], ...]]:
        protocol, task = runs.at[index, "protocol"], runs.at[index, "task"]
        return protocol, tuple((key, config[index].get(key, json.dumps(NOT_RECORDED))) for key in differs[protocol, task])

    sections: dict[tuple, Section] = {}
    latest = finished.sort_values("finished_at").groupby(["setting", "data_source", "seed"], sort=False)
    pooled: dict[tuple, dict[tuple, list[int]]] = {}  # section -> (row, task) -> indices of pooled runs
    for (_setting, _data_source, seed), group in latest:
        keep = group.index[-1]
        key = section_key(keep)
        section = sections.setdefault(key, Section(*key))
        if len(group) > 1:
            section.duplicates.append(
                f"{runs.at[keep, 'task']} / {runs.at[keep, 'row']} / seed {seed}: {len(group)} runs of one "
                f"configuration, the latest ({runs.at[keep, 'finished_at']}) counts"
            )
        pooled.setdefault(key, {}).setdefault((runs.at[keep, "row"], runs.at[keep, "task"]), []).append(keep)

    for key, by_cell in pooled.items():
        section = sections[key]
        for (row, task), indices in by_cell.items():
            # Runs of one row and task that still differ (a changed preset, another data source) are separate rows.
            variants: dict[tuple, list[int]] = {}
            for index in indices:
                variants.setdefault((runs.at[index, "setting"], runs.at[index, "data_source"]), []).append(index)
            for (setting, data_source), members in variants.items():
                label = row
                if len(variants) > 1:
                    others = [
                        json.loads(s) | {"data_source": json.dumps(d)} for s, d in variants if (s, d) != (setting, data_source)
                    ]
                    mine = json.loads(setting) | {"data_source": json.dumps(data_source)}
                    diff = sorted(k for k in mine if any(o.get(k) != mine[k] for o in others))
                    label = f"{row} ({', '.join(f'{k}={json.loads(mine[k])}' for k in diff)})"
                members = sorted(members, key=lambda i: runs.at[i, "seed"])
                section.cells[label, task] = Cell(
                    accuracies=[runs.at[i, "accuracy"] for i in members],
                    seeds=[int(runs.at[i, "seed"]) for i in members],
                    num_test=[runs.at[i, "num_test"] or 0 for i in members],
                    data_sources=sorted({runs.at[i, "data_source"] for i in members}),
                )
                section.rows.append(label)
                paper_check(section, task, runs.loc[members[0]])

    finished_settings = set(zip(finished["setting"], finished["seed"]))
    unfinished = runs[(runs["status"] != "finished")].sort_values("finished_at")
    for (setting, seed), group in unfinished.groupby(["setting", "seed"], sort=False):
        if (setting, seed) in finished_settings:
            continue
        index = group.index[-1]
        key = section_key(index)
        sections.setdefault(key, Section(*key)).failed.append(runs.loc[index].to_dict())

    for section in sections.values():
        section.rows = sorted(set(section.rows), key=row_order)
        if section.paper_protocol:
            for (row, task), cell in section.cells.items():
                cell.paper = PAPER_TABLE3.get(row, {}).get(task)
    # The paper's protocol first, then the others by name.
    return sorted(sections.values(), key=lambda s: (s.protocol != "paper", s.protocol, s.differs))


def paper_check(section: Section, task: str, run: pd.Series) -> None:
    """Mark the section as the paper's protocol while every cell matches it; say what differs otherwise."""
    if section.not_paper_because:
        return
    setup = paper_setup(task)
    if section.protocol != "paper" or setup is None:
        reason = f"protocol.name={section.protocol}"
    else:
        protocol, model = setup
        differ = [f"protocol.{k}" for k in protocol if (run["protocol_fields"] or {}).get(k) != protocol[k]]
        differ += [f"model.{k}" for k in model if (run["model"] or {}).get(k) != model[k]]
        reason = ", ".join(differ)
    if reason:
        section.paper_protocol, section.not_paper_because = False, reason
    else:
        section.paper_protocol = True


def row_label(row: str) -> str:
    base, _, rest = row.partition(" ")
    return PAPER_LABELS.get(base, base) + (f" {rest}" if rest else "")


def cell_text(section: Section, row: str, task: str, bold: tuple[str, str] = ("**", "**"), pm: str = "±") -> str:
    cell = section.cells.get((row, task))
    if cell is None:
        return "–"
    text = f"{cell.mean:.2f} {pm} {cell.standard_error:.2f}"
    if section.best(task) == row:
        text = f"{bold[0]}{text}{bold[1]}"
    if cell.generated:
        text += "†"
    if cell.paper is not None:
        text += f" ({cell.paper:.2f}, {cell.mean - cell.paper:+.2f})"
    return text


def describe_section(section: Section) -> list[str]:
    """The sentences under a section's title: its protocol, the cells' seeds and test sizes."""
    if section.paper_protocol:
        lines = ["The paper's protocol and model: each cell is followed by (the paper's number, measured − paper)."]
    elif section.protocol != "paper":
        lines = [f"Protocol `{section.protocol}`, not the paper's: compare rows with each other, not with the paper's numbers."]
    else:
        lines = [
            f"The paper's protocol with other settings ({section.not_paper_because}): compare rows with each "
            "other, not with the paper's numbers."
        ]
    seeds = sorted({len(cell.seeds) for cell in section.cells.values()})
    sizes = {
        task: sorted({n for (_, t), cell in section.cells.items() if t == task for n in cell.num_test}) for task in section.tasks
    }
    if seeds:
        lines.append(
            f"Seeds per cell: {', '.join(map(str, seeds))}. Test samples: "
            + "; ".join(f"{TASK_LABELS.get(t, t)} {', '.join(map(str, n))}" for t, n in sizes.items())
            + "."
        )
    return lines


def markdown(sections: list[Section], source: str, title: str = "Table 3") -> str:
    lines = [
        f"# {title}: LRA test accuracy (%)",
        "",
        f"Generated by `python -m lra.table` from {source}.",
        "",
        "Each cell: the mean test accuracy of the best-validation checkpoint ± its standard error (over",
        "seeds, std / √k, where a cell has k ≥ 2 seeds; else the binomial error √(p(1 − p)/n) of one run",
        "on its n test samples). Bold: the best of a task where it beats the next row by more than twice",
        "the standard error of the difference. † = generated data (the official generators' algorithms,",
        "not the LRA release). A cell pools only runs whose whole configuration is equal but for the",
        "seed; a section title names the settings in which its runs differ from other runs of the same",
        "protocol. Rows as in the YOSO paper's Table 3.",
    ]
    for section in sections:
        tasks = section.tasks
        with_avg = tasks == list(TASKS)
        lines += ["", f"## {section.title}", "", *describe_section(section), ""]
        lines.append("| model | " + " | ".join(TASK_LABELS.get(t, t) for t in tasks) + (" | avg |" if with_avg else " |"))
        lines.append("| --- " * (len(tasks) + 1 + with_avg) + "|")
        for row in section.rows:
            cells = [cell_text(section, row, task) for task in tasks]
            if with_avg:
                average = section.average(row)
                cells.append("–" if average is None else f"{average:.2f}")
            lines.append(f"| {row_label(row)} | " + " | ".join(cells) + " |")
        if section.duplicates:
            lines += ["", "Counted once:", "", *(f"- {text}" for text in sorted(section.duplicates))]
        if section.failed:
            lines += ["", "Did not finish (no finished run of the configuration and seed):", ""]
            for run in sorted(section.failed, key=lambda r: (r["task"], r["row"], r["seed"])):
                error = (run["error"] or run["status"]).splitlines()[0][:200]
                lines.append(f"- {run['task']} / {row_label(run['row'])} / seed {run['seed']}: {run['status']}: {error}")
    return "\n".join(lines) + "\n"


def cells_frame(sections: list[Section]) -> pd.DataFrame:
    rows = []
    for section in sections:
        for row in section.rows:
            for task in section.tasks:
                cell = section.cells.get((row, task))
                if cell is None:
                    continue
                rows.append(
                    {
                        "section": section.title,
                        "protocol": section.protocol,
                        "row": row,
                        "task": task,
                        "num_seeds": len(cell.seeds),
                        "seeds": " ".join(map(str, cell.seeds)),
                        "num_test": " ".join(map(str, cell.num_test)),
                        "mean": round(cell.mean, 4),
                        "std": round(cell.std, 4),
                        "standard_error": round(cell.standard_error, 4),
                        "best": section.best(task) == row,
                        "paper": cell.paper,
                        "difference": None if cell.paper is None else round(cell.mean - cell.paper, 4),
                        "data_source": "+".join(cell.data_sources),
                        "accuracies": " ".join(f"{a:.4f}" for a in cell.accuracies),
                    }
                )
    return pd.DataFrame(rows)


def latex(sections: list[Section]) -> str:
    parts = [
        "% Generated by `python -m lra.table`. Cells: mean $\\pm$ standard error; \\dag = generated data;"
        " (paper, difference) only under the paper's protocol."
    ]
    for section in sections:
        tasks = section.tasks
        table = pd.DataFrame(
            [
                [row_label(row)]
                + [cell_text(section, row, task, ("\\textbf{", "}"), "$\\pm$").replace("†", "\\dag") for task in tasks]
                for row in section.rows
            ],
            columns=["Method", *(TASK_LABELS.get(t, t) for t in tasks)],
        )
        table["Method"] = table["Method"].str.replace("_", "\\_").str.replace("*", "$^*$", regex=False)
        parts += [f"% {section.title}", table.to_latex(index=False, escape=False, column_format="l" + "c" * len(tasks))]
    return "\n".join(parts)


def figure(sections: list[Section], path: Path) -> None:
    """Mean with its standard error per row (bars), the paper's number (black ticks) in paper sections."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = max(len(s.tasks) for s in sections)
    height = sum(0.3 * len(s.rows) + 1.2 for s in sections)
    fig, axes = plt.subplots(
        len(sections),
        width,
        figsize=(3.4 * width, height),
        squeeze=False,
        gridspec_kw={"height_ratios": [len(s.rows) + 2 for s in sections]},
    )
    for axis_row, section in zip(axes, sections):
        for ax in axis_row[len(section.tasks) :]:
            ax.axis("off")
        for ax, task in zip(axis_row, section.tasks):
            for i, row in enumerate(section.rows):
                cell = section.cells.get((row, task))
                if cell is not None:
                    ax.barh(
                        i,
                        cell.mean,
                        xerr=cell.standard_error,
                        color="tab:orange" if row.startswith("yoso") else "tab:blue",
                        hatch="//" if cell.generated else None,
                        alpha=0.85,
                    )
                    if cell.paper is not None:
                        ax.plot([cell.paper, cell.paper], [i - 0.4, i + 0.4], color="black", linewidth=2)
            ax.set_title(f"{TASK_LABELS.get(task, task)} ({section.title})", fontsize=9)
            ax.set_xlabel("test accuracy (%)")
            ax.set_yticks(range(len(section.rows)), [row_label(r) for r in section.rows], fontsize=8)
            ax.invert_yaxis()
            ax.grid(axis="x", alpha=0.3)
    fig.suptitle(
        "LRA Table 3: mean test accuracy ± standard error\n(hatched: generated data; black: the paper's "
        "number, under its protocol only)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})  # no version stamp: same runs, same bytes
    plt.close(fig)


def write_all(
    records: list[dict[str, Any]], out_dir: Path, source: str, name: str = "table3", protocols: list[str] | None = None
) -> list[Path]:
    """Write ``<name>.{md,csv,tex,png}`` into ``out_dir`` from ``records`` (only those of ``protocols`` if given)."""
    if protocols:
        records = [record for record in records if record.get("protocol", {}).get("name") in protocols]
    sections = build_sections(records)
    if not sections:
        wanted = f" of protocol {', '.join(protocols)}" if protocols else ""
        raise SystemExit(f"error: no run records{wanted} found; train some cells first (python -m lra.train ...)")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.{suffix}" for suffix in ("md", "csv", "tex", "png")]
    paths[0].write_text(markdown(sections, source, "Table 3" if name == "table3" else name))
    cells_frame(sections).to_csv(paths[1], index=False, float_format="%.4f")
    paths[2].write_text(latex(sections))
    figure(sections, paths[3])
    return paths


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
        help="copy finished runs into RESULTS/runs/, then write RESULTS/table3.* (implies --committed)",
    )
    parser.add_argument(
        "--committed", action="store_true", help="write RESULTS/table3.* from RESULTS/runs/ alone instead of the user's table"
    )
    parser.add_argument(
        "--protocol", nargs="+", metavar="NAME", help="only runs of these protocols (e.g. spt_short); default: every run"
    )
    parser.add_argument("--name", default="table3", help="the tables' file name, NAME.{md,csv,tex,png} (default: table3)")
    args = parser.parse_args(argv)
    runs_dir = args.results / "runs"
    only = {"name": args.name, "protocols": args.protocol}
    if args.collect:
        new = collect(find_records(args.runs), runs_dir)
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
