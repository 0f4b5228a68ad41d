"""The runs' learning curves: each run's validation accuracy against its step, beside the table's cells.

A run's curve is its ``metrics.csv`` (Lightning's CSV logger: a row per logged step, a ``val/acc`` at each
evaluation): in its run folder (``<folder>/metrics/metrics.csv`` beside ``results.json``) or, for a committed run,
``results/runs/curves/<its record's name>.csv`` (``lra.campaign pack`` carries it there). :func:`find_curves` finds
them for the records the table reads; :func:`figure` draws the first section that has any, a panel per row and task,
each seed's curve (a shade of the row's colour per seed) beside the paper's number, so that a row that misses the paper
is shown with how it trained; :func:`summary` reads the same curves as numbers (``<name>_curves.csv``): when each run
reached the ListOps split, its best evaluation, where it ended.
"""

from __future__ import annotations

import csv
import math
import textwrap
from pathlib import Path

import pandas as pd

from ..finished import curve_file
from ..results import RunRecord
from .cells import LISTOPS_SPLIT
from .sections import TASK_LABELS, Section, Table, row_label

PANEL_COLUMNS = 4


def find_curves(found: list[tuple[Path, RunRecord]]) -> dict[str, Path]:
    """The curve of each finished record that has one (:func:`lra.finished.curve_file`), by its configuration hash
    (which holds the seed: one run per hash)."""
    return {
        record.config_hash: curve_file(path)
        for path, record in found
        if record.status == "finished" and record.config_hash and curve_file(path).is_file()
    }


def validation_curve(path: Path) -> list[tuple[int, float]]:
    """The (step, validation accuracy %) of each evaluation in a ``metrics.csv``, in step order, each step once (a
    resumed run logs the evaluation it resumed after again: the later row counts)."""
    points: dict[int, float] = {}
    with open(path, newline="") as file:
        for row in csv.DictReader(file):
            if row.get("val/acc") and row.get("step"):
                points[int(float(row["step"]))] = 100 * float(row["val/acc"])
    return sorted(points.items())


def panels(section: Section, curves: dict[str, Path]) -> list[tuple[str, str, list[tuple[int, Path]]]]:
    """The (row, task, (seed, curve file) of each seed with one) of each of ``section``'s cells with a curve, in the
    table's order."""
    found = []
    for (row, task), cell in section.in_order().iterrows():
        files = [(seed, curves[digest]) for seed, digest in zip(cell["seeds"], cell["config_hashes"]) if digest in curves]
        if files:
            found.append((row, task, files))
    return found


def drawn_section(table: Table, curves: dict[str, Path]) -> tuple[Section | None, list]:
    """The first of ``table``'s sections with any curve (the strongest evidence first) and its :func:`panels`."""
    return next(((section, found) for section in table.sections if (found := panels(section, curves))), (None, []))


#: The evaluations whose mean is where a run ended (``val_last``): its last 500 steps under the paper's protocol.
LAST_EVALUATIONS = 10


def summary(table: Table, curves: dict[str, Path]) -> pd.DataFrame | None:
    """A row per run of the section :func:`figure` draws: its test accuracy, how many evaluations its curve has and the
    last one's step, its best validation accuracy and the step of the first evaluation that reached it, the mean of its
    last :data:`LAST_EVALUATIONS` evaluations, and for ListOps the step of its first evaluation at or above the paper's
    split (empty where none was). All in %. None where no section has curves."""
    section, shown = drawn_section(table, curves)
    if section is None:
        return None
    runs = []
    for row, task, files in shown:
        cell = section.cell(row, task)
        test = dict(zip(cell["seeds"], cell["accuracies"]))
        for seed, file in files:
            steps, accuracies = zip(*validation_curve(file))
            best = max(accuracies)
            at_split = [step for step, accuracy in zip(steps, accuracies) if accuracy >= LISTOPS_SPLIT]
            runs.append(
                {
                    "section": section.title,
                    "row": row_label(row, section.published),
                    "task": task,
                    "seed": seed,
                    "test_acc": test[seed],
                    "evaluations": len(steps),
                    "last_step": steps[-1],
                    "best_val": best,
                    "best_val_step": steps[accuracies.index(best)],
                    "val_last": sum(accuracies[-LAST_EVALUATIONS:]) / len(accuracies[-LAST_EVALUATIONS:]),
                    "first_step_at_split": at_split[0] if task == "listops" and at_split else None,
                }
            )
    return pd.DataFrame(runs).astype({"first_step_at_split": "Int64"})


# Each seed's shade of a row's colour, darkest first; seeds past the last take the last.
SEED_SHADES = (1.0, 0.62, 0.4)


def colour(row: str, seed: int = 0) -> str:
    """A row's colour, as the table's figure has it (the YOSO rows orange, the others blue), in ``seed``'s shade
    (:data:`SEED_SHADES`: the row's colour mixed with white), so that a panel's seeds are told apart."""
    import matplotlib.colors

    base = matplotlib.colors.to_rgb("tab:orange" if row.startswith("yoso") else "tab:blue")
    shade = SEED_SHADES[min(seed, len(SEED_SHADES) - 1)]
    return matplotlib.colors.to_hex([shade * channel + (1 - shade) for channel in base])


def figure(table: Table, curves: dict[str, Path], path: Path) -> bool:
    """Draw the learning curves of the first section with any (the strongest evidence first) into ``path``: a panel
    per row and task, each seed's validation accuracy against the step, the paper's number (dashed) and, for ListOps,
    the paper's split (dotted); its title our test accuracy beside the paper's. Whether there was anything to draw."""
    section, shown = drawn_section(table, curves)
    if section is None:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(PANEL_COLUMNS, len(shown))
    lines = math.ceil(len(shown) / columns)
    one_task = len({task for _, task, _ in shown}) == 1  # one scale then, so that the rows compare at a glance
    size = (3.2 * columns, 2.4 * lines + 0.7)
    fig, axes = plt.subplots(lines, columns, figsize=size, squeeze=False, sharey=one_task, layout="constrained")
    for ax, (row, task, files) in zip(axes.flat, shown):
        for seed, file in files:
            points = validation_curve(file)
            steps, accuracies = [step for step, _ in points], [accuracy for _, accuracy in points]
            ax.plot(steps, accuracies, linewidth=1, color=colour(row, seed), label=f"seed {seed}")
        paper = section.published.number(row, task)
        if paper is not None and not math.isnan(paper):
            ax.axhline(paper, color="0.4", linestyle="--", linewidth=1)
        if task == "listops":
            ax.axhline(LISTOPS_SPLIT, color="black", linestyle=":", linewidth=0.8)
        cell = section.cell(row, task)
        ours = f"test {cell['mean']:.2f}" + (f" (paper {paper:.2f})" if paper is not None and not math.isnan(paper) else "")
        ax.set_title(f"{row_label(row, section.published)}, {TASK_LABELS.get(task, task)}: {ours}", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(shown) :]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("step", fontsize=8)
    for ax in axes[:, 0]:
        ax.set_ylabel("validation accuracy (%)", fontsize=8)
    several_seeds = any(len(files) > 1 for _, _, files in shown)
    seeds = "each seed a line, the later seeds lighter; " if several_seeds else ""
    fig.suptitle(
        textwrap.fill(
            f"{section.title}: learning curves ({seeds}dashed: the paper's number; dotted: ListOps split at {LISTOPS_SPLIT:g}%)",
            40 * columns,
        ),
        fontsize=9,
    )
    if several_seeds:  # the shades named once, on the panel with the most seeds
        most_seeds, _ = max(zip(axes.flat, shown), key=lambda panel: len(panel[1][2]))
        most_seeds.legend(fontsize=6)
    fig.savefig(path, dpi=100, metadata={"Software": None})  # no version stamp: same runs, same bytes
    plt.close(fig)
    return True
