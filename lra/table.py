"""Table 3 of the YOSO paper from the runs' ``results.json`` files: ``python -m lra.table``.

Gathers every ``results.json`` under the output folders (``outputs/`` by default) and every run
record committed under ``results/runs/``, and writes ``results/table3.{md,csv,tex}`` and
``results/table3.png``: one table per protocol (the paper's, ``table3_short``, ...), rows in the
paper's order followed by any other attention, the five tasks and their average, each cell the mean
+- standard deviation of the test accuracy over seeds, the paper's number beside it and the
difference, the best mean of each task in bold. A cell on generated data is marked, as is a
protocol that is not the paper's. ``--collect`` first copies every finished run from the output
folders into ``results/runs/`` (one small JSON each, without machine-specific paths), the form in
which runs are committed. Writing twice from the same runs gives the same files.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from .results import RESULTS_FILE

TASKS = ("listops", "text", "retrieval", "image", "pathfinder")

#: Table 3 of the YOSO paper (ICML 2021): test accuracy (%) per row (our preset names) and task.
PAPER_TABLE3: dict[str, dict[str, float]] = {
    "none": dict(listops=19.20, text=61.11, retrieval=74.78, image=33.86, pathfinder=66.51),
    "softmax": dict(listops=37.10, text=65.02, retrieval=79.35, image=38.20, pathfinder=74.16),
    "yoso_e": dict(listops=37.30, text=64.71, retrieval=81.16, image=39.78, pathfinder=72.90),
    "nystromformer": dict(listops=37.15, text=65.52, retrieval=79.56, image=41.58, pathfinder=70.94),
    "longformer": dict(listops=37.20, text=64.60, retrieval=80.97, image=39.06, pathfinder=73.01),
    "linformer": dict(listops=37.25, text=55.91, retrieval=79.37, image=37.84, pathfinder=67.60),
    "reformer": dict(listops=19.05, text=64.88, retrieval=78.64, image=43.29, pathfinder=69.36),
    "performer": dict(listops=18.80, text=63.81, retrieval=78.62, image=37.07, pathfinder=69.87),
    "yoso_32": dict(listops=37.25, text=63.12, retrieval=78.69, image=40.21, pathfinder=72.33),
    "yoso_c_16": dict(listops=37.40, text=64.28, retrieval=77.61, image=44.67, pathfinder=71.86),
    "yoso_star_16": dict(listops=37.20, text=62.97, retrieval=79.02, image=40.50, pathfinder=72.05),
    "yoso_star_c_16": dict(listops=37.35, text=65.89, retrieval=78.80, image=45.93, pathfinder=71.39),
}
PAPER_ROWS = tuple(PAPER_TABLE3)
PAPER_LABELS = {
    "none": "none", "softmax": "softmax", "yoso_e": "yoso-e", "nystromformer": "nystromformer",
    "longformer": "longformer", "linformer": "linformer", "reformer": "reformer", "performer": "performer",
    "yoso_32": "yoso-32", "yoso_c_16": "yoso-C-16", "yoso_star_16": "*yoso-16", "yoso_star_c_16": "*yoso-C-16",
}
# Paths differ per machine and mean nothing in a committed record.
MACHINE_SPECIFIC = ("best_checkpoint", "data_folder", "data_prepared_from", "resumed_from")


def find_records(folders: Iterable[Path]) -> list[dict[str, Any]]:
    """Every run record under ``folders`` (``results.json`` files and ``results/runs/*.json``),
    once per configuration: where the same run is found twice, a finished copy wins."""
    by_config: dict[str, dict[str, Any]] = {}
    for folder in folders:
        folder = Path(folder)
        if not folder.is_dir():
            continue
        paths = sorted(folder.rglob(RESULTS_FILE)) + sorted(folder.glob("*.json"))
        for path in paths:
            try:
                record = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as error:
                raise SystemExit(f"error: {path} is not a readable run record ({error})") from None
            if not isinstance(record, dict) or "config_hash" not in record or "task" not in record:
                continue
            record.setdefault("row", record.get("attention"))
            known = by_config.get(record["config_hash"])
            if known is None or (known.get("status") != "finished" and record.get("status") == "finished"):
                by_config[record["config_hash"]] = record
    return [by_config[key] for key in sorted(by_config)]


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


@dataclass
class Cell:
    accuracies: list[float] = field(default_factory=list)  # test accuracy (%) per seed
    data_sources: set[str] = field(default_factory=set)

    @property
    def mean(self) -> float:
        return sum(self.accuracies) / len(self.accuracies)

    @property
    def std(self) -> float:  # sample standard deviation over seeds; 0 for one seed
        n = len(self.accuracies)
        if n < 2:
            return 0.0
        return math.sqrt(sum((a - self.mean) ** 2 for a in self.accuracies) / (n - 1))

    @property
    def generated(self) -> bool:
        return "generated" in self.data_sources


@dataclass
class Table:
    protocol: str
    cells: dict[tuple[str, str], Cell]  # (row, task) -> cell
    failed: list[dict[str, Any]]

    @property
    def rows(self) -> list[str]:
        present = {row for row, _ in self.cells} | {r["row"] for r in self.failed}
        return [r for r in PAPER_ROWS if r in present] + sorted(present - set(PAPER_ROWS))

    def average(self, row: str) -> float | None:
        """The mean over the five tasks, only when every task has a cell (like the paper's Avg)."""
        cells = [self.cells.get((row, task)) for task in TASKS]
        return None if any(c is None for c in cells) else sum(c.mean for c in cells) / len(TASKS)

    def best(self, task: str) -> float | None:
        means = [cell.mean for (row, t), cell in self.cells.items() if t == task]
        return max(means) if means else None


def build_tables(records: list[dict[str, Any]]) -> list[Table]:
    by_protocol: dict[str, Table] = {}
    for record in records:
        protocol = record["protocol"]["name"]
        table = by_protocol.setdefault(protocol, Table(protocol, {}, []))
        if record.get("status") != "finished":
            table.failed.append(record)
            continue
        cell = table.cells.setdefault((record["row"], record["task"]), Cell())
        cell.accuracies.append(100 * record["test_acc"])
        cell.data_sources.add(record.get("data_source", "unknown"))
    # The paper's protocol first, then the others by name.
    return sorted(by_protocol.values(), key=lambda t: (t.protocol != "paper", t.protocol))


def row_label(row: str) -> str:
    return PAPER_LABELS.get(row, row)


def paper_number(row: str, task: str) -> float | None:
    return PAPER_TABLE3.get(row, {}).get(task)


def format_cell(table: Table, row: str, task: str, bold: tuple[str, str] = ("**", "**")) -> str:
    cell = table.cells.get((row, task))
    paper = paper_number(row, task)
    if cell is None:
        return "–" if paper is None else f"– ({paper:.2f})"
    text = f"{cell.mean:.2f} ± {cell.std:.2f}" if len(cell.accuracies) > 1 else f"{cell.mean:.2f}"
    if table.best(task) == cell.mean:
        text = f"{bold[0]}{text}{bold[1]}"
    if cell.generated:
        text += "†"
    if paper is not None:
        text += f" ({paper:.2f}, {cell.mean - paper:+.2f})"
    return text


def markdown(tables: list[Table]) -> str:
    lines = [
        "# Table 3: LRA test accuracy (%)",
        "",
        "Generated by `python -m lra.table` from the run records in `results/runs/` (and any local",
        "`outputs/`). Each cell: mean ± std over seeds of the best-validation checkpoint's test accuracy,",
        "then (the paper's number, measured − paper). Best mean per task in bold. † = generated data",
        "(the official generators' algorithms, not the LRA release). Rows as in the YOSO paper's Table 3.",
    ]
    for table in tables:
        seeds = sorted({len(c.accuracies) for c in table.cells.values()})
        lines += ["", f"## Protocol: {table.protocol}", ""]
        if table.protocol != "paper":
            lines += [f"A reduced budget (`conf/experiment/{table.protocol}.yaml`), not the paper's: compare rows "
                      "with each other, not with the paper's numbers.", ""]
        lines += [f"Seeds per cell: {', '.join(map(str, seeds)) or '–'}.", ""]
        lines.append("| model | " + " | ".join(TASKS) + " | avg |")
        lines.append("| --- " * (len(TASKS) + 2) + "|")
        for row in table.rows:
            average = table.average(row)
            paper_avg = (sum(PAPER_TABLE3[row].values()) / len(TASKS)) if row in PAPER_TABLE3 else None
            avg = "–" if average is None else f"{average:.2f}" + (f" ({paper_avg:.2f})" if paper_avg else "")
            cells = [format_cell(table, row, task) for task in TASKS]
            lines.append(f"| {row_label(row)} | " + " | ".join(cells) + f" | {avg} |")
        if table.failed:
            lines += ["", "Cells that did not finish:", ""]
            for record in sorted(table.failed, key=lambda r: (r["task"], r["row"], r["seed"])):
                error = (record.get("error") or record.get("status", "unknown")).splitlines()[0][:200]
                lines.append(f"- {record['task']} / {row_label(record['row'])} / seed {record['seed']}: "
                             f"{record.get('status')}: {error}")
    return "\n".join(lines) + "\n"


def csv_text(tables: list[Table]) -> str:
    header = "protocol,row,task,num_seeds,mean,std,paper,difference,data_source,accuracies"
    lines = [header]
    for table in tables:
        for (row, task), cell in sorted(table.cells.items(), key=lambda item: (table.rows.index(item[0][0]), TASKS.index(item[0][1]) if item[0][1] in TASKS else 99, item[0][1])):
            paper = paper_number(row, task)
            values = [
                table.protocol, row, task, str(len(cell.accuracies)), f"{cell.mean:.4f}", f"{cell.std:.4f}",
                "" if paper is None else f"{paper:.2f}", "" if paper is None else f"{cell.mean - paper:.4f}",
                "+".join(sorted(cell.data_sources)), " ".join(f"{a:.4f}" for a in cell.accuracies),
            ]
            lines.append(",".join(f'"{v}"' if "," in v else v for v in values))
    return "\n".join(lines) + "\n"


def latex(tables: list[Table]) -> str:
    parts = ["% Generated by `python -m lra.table`. Cells: measured mean (paper); \\dag = generated data."]
    for table in tables:
        parts += [
            f"% Protocol: {table.protocol}",
            "\\begin{tabular}{l" + "c" * len(TASKS) + "|c}",
            "\\toprule",
            "Method & " + " & ".join(TASKS) + " & Avg \\\\",
            "\\midrule",
        ]
        for row in table.rows:
            cells = []
            for task in TASKS:
                cell = table.cells.get((row, task))
                if cell is None:
                    cells.append("--")
                    continue
                text = f"{cell.mean:.2f}"
                if table.best(task) == cell.mean:
                    text = f"\\textbf{{{text}}}"
                if len(cell.accuracies) > 1:
                    text += f"$\\pm${cell.std:.2f}"
                if cell.generated:
                    text += "\\dag"
                paper = paper_number(row, task)
                if paper is not None:
                    text += f" ({paper:.2f})"
                cells.append(text)
            average = table.average(row)
            label = row_label(row).replace("_", "\\_")
            parts.append(f"{label} & " + " & ".join(cells) + f" & {'--' if average is None else f'{average:.2f}'} \\\\")
        parts += ["\\bottomrule", "\\end{tabular}", ""]
    return "\n".join(parts) + "\n"


def figure(tables: list[Table], path: Path) -> None:
    """Measured (bars, with std) against the paper (black ticks), one panel per task, first protocol."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = tables[0]
    rows = table.rows
    fig, axes = plt.subplots(1, len(TASKS), figsize=(3.2 * len(TASKS), 0.32 * len(rows) + 1.6), sharey=True)
    for ax, task in zip(axes, TASKS):
        for i, row in enumerate(rows):
            cell = table.cells.get((row, task))
            if cell is not None:
                ax.barh(i, cell.mean, xerr=cell.std, color="tab:orange" if row.startswith("yoso") else "tab:blue",
                        hatch="//" if cell.generated else None, alpha=0.85)
            paper = paper_number(row, task)
            if paper is not None:
                ax.plot([paper, paper], [i - 0.4, i + 0.4], color="black", linewidth=2)
        ax.set_title(task)
        ax.set_xlabel("test accuracy (%)")
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(rows)), [row_label(r) for r in rows])
    axes[0].invert_yaxis()
    fig.suptitle(f"LRA Table 3, protocol {table.protocol}: measured (bars; hatched = generated data) vs paper (black)")
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})  # no version stamp: same runs, same bytes
    plt.close(fig)


def write_all(records: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    tables = build_tables(records)
    if not tables:
        raise SystemExit("error: no run records found; train some cells first (python -m lra.train ...)")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in (("table3.md", markdown(tables)), ("table3.csv", csv_text(tables)), ("table3.tex", latex(tables))):
        (out_dir / name).write_text(text)
        written.append(out_dir / name)
    figure(tables, out_dir / "table3.png")
    return written + [out_dir / "table3.png"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lra.table", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, nargs="*",
                        default=[Path(os.environ.get("LRA_OUTPUT_DIR", "outputs"))],
                        help="folders searched for results.json (default: outputs/ or $LRA_OUTPUT_DIR)")
    parser.add_argument("--results", type=Path, default=Path("results"),
                        help="where the tables go; its runs/ subfolder holds the committed run records")
    parser.add_argument("--collect", action="store_true", help="copy finished runs into RESULTS/runs/ first")
    args = parser.parse_args(argv)
    runs_dir = args.results / "runs"
    records = find_records([*args.runs, runs_dir])
    if args.collect:
        new = collect(records, runs_dir)
        print(f"{new} new run records in {runs_dir}")
        records = find_records([*args.runs, runs_dir])
    for path in write_all(records, args.results):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
