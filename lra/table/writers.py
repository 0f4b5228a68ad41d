"""The table's last stage: a :class:`~lra.table.sections.Table` as Markdown, CSV, LaTeX and a figure.

Each section is written as its title, a description of its protocol and cells, and a row per table row with, for each
task, our cell beside the paper's number (:func:`section_frame`), then how the section agrees with the paper; the runs
that are not cells follow once, at the end. Writing twice from the same records gives the same files
(:func:`write_all`).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..data.tasks import TASKS as TASK_SPECS
from ..paper import TABLE3, PaperTable, Row
from ..results import FLOAT32, RunRecord
from . import curves as learning_curves
from .cells import AGREE_MARGIN, LISTOPS_SPLIT, MIN_RANKED_ROWS, NOT_RECORDED, TASKS
from .sections import (
    ALL_ROWS,
    COMPARISON,
    PAPER_ROWS,
    TASK_LABELS,
    PrecisionPair,
    Section,
    Table,
    base_row,
    build,
    row_label,
)
from .speed import figure as speed_figure

#: A training rate is marked as measured under load where other work kept more threads than this per CPU running or
#: waiting to run (the load average beyond the run's own threads) at the start or end of its timed steps: half of the
#: machine's CPUs taken, so that the run's threads waited for a CPU (issue 57: one cell trained at 0.67 steps/s beside
#: a test suite and at 13 alone).
LOADED = 0.5


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
    compiled: str  # marks a training rate of a compiled run (trainer.compile)


MARKDOWN = Style(("**", "**"), "±", "†", ("`", "`"), "ρ", "‡", "≥", "§", "ᶜ")
LATEX = Style(("\\textbf{", "}"), "$\\pm$", "\\dag", ("\\texttt{", "}"), "$\\rho$", "$^\\ddagger$", "$\\geq$", "\\S", "$^c$")
RHO_ROW = "Spearman's {rho} with the paper"
SIDE_ROW = "ListOps: on the paper's side"


def number(value: float | None) -> str:
    """A percentage to two decimals; "–" where there is none (the paper has no such row or task)."""
    return "–" if value is None or pd.isna(value) else f"{value:.2f}"


def cell_text(section: Section, row: str, task: str, style: Style = MARKDOWN) -> str:
    """Our cell: its mean ± its standard error (:func:`lra.table.cells.cell_frame`), bold where it is its task's best
    beyond the noise (:func:`lra.table.cells.best_rows`), marked where its data was generated; "–" where no cell."""
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


def cell_mean_text(section: Section, row: str, task: str, column: str, digits: int) -> str:
    """A cell's mean of a measurement its runs recorded (``steps_per_s``, ``peak_memory_mb``); "–" where none did."""
    cell = section.cell(row, task)
    return "–" if cell is None or pd.isna(cell[column]) else f"{cell[column]:.{digits}f}"


def under_load(section: Section, row: str, task: str) -> bool:
    """Whether one of a cell's runs was timed beside other work keeping more than :data:`LOADED` threads per CPU."""
    cell = section.cell(row, task)
    return cell is not None and bool(cell["others_load_per_cpu"] > LOADED)


def compiled(section: Section, row: str, task: str) -> bool:
    """Whether one of a cell's runs trained compiled (``trainer.compile``): its rate is then a compiled step's."""
    cell = section.cell(row, task)
    return cell is not None and bool(cell["compiled"])


def steps_text(section: Section, row: str, task: str, style: Style) -> str:
    """A cell's training steps per second, marked where one of its runs trained compiled and where one was timed under
    load (:data:`LOADED`)."""
    marks = (style.compiled if compiled(section, row, task) else "") + (style.loaded if under_load(section, row, task) else "")
    return cell_mean_text(section, row, task, "steps_per_s", 2) + marks


def section_frame(section: Section, style: Style, speed: bool = False) -> pd.DataFrame:
    """The section as text: a row per table row, then the agreement rows; per task, our cell beside the paper's and,
    with ``speed``, the cells' training steps per second and peak memory.

    The paper's number stands beside every cell whose row is one of the paper's rows (:meth:`PaperTable.number`,
    "–" for the others), and its column is marked (``style.full_protocol``) in a section that is not the paper's
    protocol and model: there the number stands under the paper's own protocol, a reference, not a target. A row's average
    is the paper's Avg: only over all five tasks (:meth:`Section.average`).
    """
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
            columns[label, "MB"] = [cell_mean_text(section, row, task, "peak_memory_mb", 0) for row in section.rows] + ["", ""]
    averages = [section.average(row) for row in section.rows]
    if any(average is not None for average in averages):
        paper_averages = [pd.Series({task: section.published.number(row, task) for task in TASKS}).mean() for row in section.rows]
        columns["avg", "ours"] = [number(average) for average in averages] + ["", ""]
        columns["avg", paper_column] = [number(average) for average in paper_averages] + ["", ""]
    labels = [row_label(row, section.published) for row in section.rows]
    text = pd.DataFrame(columns, index=labels + [RHO_ROW.format(rho=style.rho), SIDE_ROW])
    return text if section.has_cells("listops") else text.iloc[:-1]


def precision_words(precision: str) -> str:
    """A precision as the table says it: float32, or Lightning's name of the mixed one (``bf16-mixed``)."""
    return "float32" if precision == FLOAT32 else precision


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
        if section.published.protocol is None:
            protocol = f"Protocol `{section.protocol}`; {section.not_paper_because}"
        elif section.protocol != section.published.protocol:
            protocol = f"Protocol `{section.protocol}`, not the paper's"
        else:
            protocol = f"The paper's protocol with other settings ({section.not_paper_because})"
        lines = [f"{protocol}: the paper‡ column is the paper's number under its own protocol, a reference, not a target."]
    seeds = sorted(section.cells["num_seeds"].unique())
    sizes = section.cells["num_test"].explode().groupby(level="task").agg(lambda n: sorted(set(n.dropna().astype(int))))
    lines.append(
        f"Seeds per cell: {seeds_words(section)}. Test samples: "
        + "; ".join(
            f"{TASK_LABELS.get(task, task)} {', '.join(map(str, n)) or NOT_RECORDED}"
            for task, n in sizes.reindex([t for t in section.tasks if t in sizes.index]).items()
        )
        + "."
    )
    devices = sorted(set(" + ".join(section.cells["devices"]).split(" + ")))
    lines.append(f"Trained on {'; '.join(devices)}, in {precision_words(section.precision)}.")
    if 1 in seeds:
        lines.append(
            "A cell of one seed: its ± is the sampling error of its test set alone; another seed's run may differ by more."
        )
    if speed:
        lines.append(
            "steps/s: training steps per second (evaluations excluded), MB: peak memory, each the mean of the cell's "
            f"runs: compare them only between runs of one machine. {MARKDOWN.loaded}: timed "
            f"under load, other work keeping more than {LOADED:g} threads per CPU running beside a run of the cell (the "
            "load average beyond the run's own threads, where its timing started or ended): slower than alone. A run "
            "recorded without the machine's load is not marked. "
            f"{MARKDOWN.compiled}: trained compiled (`trainer.compile`), the others eager: a rate of the implementation as much "
            "as of the attention."
        )
    return lines


def seeds_words(section: Section) -> str:
    """How many seeds the section's cells pool: the most common count, and which cells pool another (``1, and 2 for
    ListOps's nystromformer and *yoso-C-16``), so that a reader knows which ± holds the seeds' spread."""
    counts = section.cells["num_seeds"].astype(int)
    usual = max(counts.mode())
    others = []
    for count in sorted(set(counts) - {usual}):
        cells = []
        for task in section.tasks:
            labels = [row_label(row, section.published) for row in section.rows if counts.get((row, task)) == count]
            if labels:
                cells.append(f"{TASK_LABELS.get(task, task)}'s {in_words(labels)}")
        others.append(f"{count} for {', '.join(cells)}")
    return ", and ".join([str(usual), *others])


def in_words(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def legend(table: Table) -> list[str]:
    """The rules of what the table shows, in the words its readers meet them in, wrapped under its heading."""
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
        "best-validation checkpoint ± its standard error: the binomial error √(p(1 − p)/n) of the mean on its n test "
        "samples, which its seeds share, and where a cell has k ≥ 2 seeds their spread std / √k, in quadrature. "
        "Bold: the best of a task where it beats the next row by more than twice the standard error of the "
        "difference (paired on the test set where every run of both recorded which samples it classified correctly: "
        "the spread of the per-sample differences in place of the two binomial errors). † = generated data (the official "
        "generators' algorithms, not the LRA release). A cell pools only runs whose whole configuration is equal but "
        f"for the seed. The paper column is {published.source}, under {published.protocol_words}, marked ‡ where "
        "the section's protocol is not the paper's: there it is a reference for the ranking, not a target. Under the "
        "rows, per task, how the section agrees with the paper over the rows that have its number: "
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
    """The table as Markdown: its heading and legend, each section (title, description, rows, the runs counted once),
    then the runs that are not cells, each once, at the end."""
    lines = [heading(table, title), "", f"Generated by `python -m lra.table` from {source}.", "", *legend(table)]
    for section in table.sections:
        lines += ["", f"## {section.title}", "", *describe_section(section, table.speed), ""]
        lines += markdown_table(section_frame(section, MARKDOWN, table.speed), len(section.rows))
        if section.duplicates:
            lines += ["", "Counted once:", "", *(f"- {text}" for text in section.duplicates)]
    for pair in table.precision_pairs:
        lines += ["", *precision_pair_lines(pair)]
    if not table.left_out.empty:
        lines += ["", "## Not in the table", "", "Runs without a result (no finished run of the configuration and seed)"]
        if not table.comparison:
            lines[-1] += f" and runs of rows the paper's {table.published.title} does not have"
        lines[-1] += ":"
        lines += ["", *left_out_lines(table.left_out, table.published)]
    return "\n".join(lines) + "\n"


def precision_pair_lines(pair: PrecisionPair) -> list[str]:
    """Two sections of one protocol in two precisions, as Markdown: the rows and tasks both have, each cell on its
    devices, the difference and whether it is within the noise."""
    first, second = pair.first, pair.second
    lines = [
        f"## `{first.title}` against `{second.title}`",
        "",
        *textwrap.wrap(
            f"One protocol in two precisions ({precision_words(first.precision)} and {second.precision}): where both "
            "have a cell, the "
            f"difference of the means (the second's minus the first's) and its standard error: the two cells' errors "
            "combined, or, marked paired where every run of both recorded which test samples it classified correctly, "
            "their seeds' spreads and the spread of the per-sample differences on the test set they share (smaller "
            "where the two predict alike, as one model on two devices should). They agree where the difference is "
            f"within {AGREE_MARGIN:g} standard errors of it. "
            f"{sum(pair.cells['agree'])} of {len(pair.cells)} agree.",
            105,
            break_on_hyphens=False,
        ),
        "",
        f"| model | task | {precision_words(first.precision)} | on | {second.precision} | on | difference | agree |",
        "| --- " * 8 + "|",
    ]
    for (row, task), cell in pair.cells.iterrows():
        lines.append(
            f"| {row_label(row, first.published)} | {TASK_LABELS.get(task, task)} "
            f"| {cell['mean_first']:.2f} ± {cell['standard_error_first']:.2f} ({cell['num_seeds_first']}) "
            f"| {cell['devices_first']} "
            f"| {cell['mean_second']:.2f} ± {cell['standard_error_second']:.2f} ({cell['num_seeds_second']}) "
            f"| {cell['devices_second']} | {cell['difference']:+.2f} ± {cell['difference_error']:.2f}"
            f"{' paired' if cell['paired'] else ''} | {'yes' if cell['agree'] else 'no'} |"
        )
    return lines


CELL_COLUMNS = [
    "section", "protocol", "row", "task", "num_seeds", "seeds", "num_test", "mean", "std", "standard_error", "best",
    "paper", "paper_protocol", "difference", "papers_side", "data_source", "accuracies", "steps_per_s", "peak_memory_mb",
    "compiled", "devices",
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
    """A row label as LaTeX text: underscores escaped, the paper's asterisks as superscripts."""
    return text.replace("_", "\\_").replace("*", "$^*$").replace("%", "\\%")


def latex(table: Table) -> str:
    """The table as LaTeX: a tabular per section, its agreement rows under a rule; the runs that are not cells as
    comments at the end."""
    parts = [
        "% Generated by `python -m lra.table`. Cells: mean $\\pm$ standard error; \\dag = generated data; beside each,"
        " the paper's number ($^\\ddagger$: its own protocol, not the section's); under the rows, Spearman's $\\rho$ with"
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
    """The first section (the strongest evidence, :func:`lra.table.sections.evidence_first`), per task with cells:
    our mean with its standard error beside the paper's number, row by row; the other sections are in the Markdown
    table beside it, so that the picture stays readable at a page's width whatever else was run."""
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
        protocol = "" if section.paper_protocol else " (grey: the paper under its own protocol)"
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
                color=[learning_curves.colour(row) for row in section.rows],
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
    curves: dict[str, Path] | None = None,
    local: set[str] | frozenset[str] = frozenset(),
) -> list[Path]:
    """Write ``<name>.{md,csv,tex,png}`` and ``<name>_agreement.csv`` (``name`` by default :func:`default_name`) into
    ``out_dir`` from ``records`` (only those of ``protocols`` if given), with the rows of :func:`build`, and where
    ``curves`` (:func:`lra.table.curves.find_curves`) has the learning curves of a section's runs,
    ``<name>_curves.png`` (:func:`lra.table.curves.figure`) and its numbers ``<name>_curves.csv``
    (:func:`lra.table.curves.summary`), and where its runs recorded their speed and memory,
    ``<name>_speed.png``, the LRA paper's Figure 3 (:func:`lra.table.speed.figure`). Writing twice from the same
    records gives the same files."""
    if protocols:
        records = [record for record in records if (record.protocol or {}).get("name") in protocols]
    if not records:
        wanted = f" of protocol {', '.join(protocols)}" if protocols else ""
        raise SystemExit(f"error: no run records{wanted} found; train some cells first (python -m lra.train ...)")
    table = build(records, published, rows, speed, curves, local)
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
    curves_figure, curves_numbers = out_dir / f"{name}_curves.png", out_dir / f"{name}_curves.csv"
    if learning_curves.figure(table, curves or {}, curves_figure):
        learning_curves.summary(table, curves or {}).to_csv(curves_numbers, index=False, float_format="%.2f")
        paths += [curves_figure, curves_numbers]
    else:  # an earlier table's, of runs with curves: not this one's
        curves_figure.unlink(missing_ok=True)
        curves_numbers.unlink(missing_ok=True)
    if speed_figure(table, out_dir / f"{name}_speed.png"):
        paths.append(out_dir / f"{name}_speed.png")
    else:
        (out_dir / f"{name}_speed.png").unlink(missing_ok=True)
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
