"""The LRA paper's Figure 3 from the runs' own records: each row's test accuracy against its training speed, its peak
memory as the marker's size (Tay et al., ICLR 2021, "Long Range Arena", Figure 3: performance, speed and memory of
each model).

A point per row of the first section that has them (:func:`points`): its mean test accuracy over the section's tasks
where it has a cell, the mean of its cells' training steps per second (:class:`lra.callbacks.TrainingSpeed`: the
training steps alone, evaluations excluded) and of their peak memory (:func:`lra.devices.peak_memory_mb`). The speed
and memory are those of the machines the runs trained on: the section's description names them, and only points of
one machine compare. A row that trained compiled (``trainer.compile``) says so beside its name: its speed is a compiled
step's.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

from ..rows import pyplot, save_figure
from .curves import colour
from .sections import Section, Table, row_label


@dataclass(frozen=True)
class Point:
    row: str
    accuracy: float  # mean test accuracy (%) over the row's cells
    steps_per_s: float
    peak_memory_mb: float
    compiled: bool  # one of its cells' runs trained compiled: its speed is a compiled step's


def points(section: Section) -> list[Point]:
    """A point per row of ``section`` whose cells recorded their speed and memory."""
    found = []
    for row in section.rows:
        cells = section.cells.xs(row, level="label")
        measured = cells.dropna(subset=["steps_per_s", "peak_memory_mb"])
        if not measured.empty:
            found.append(
                Point(
                    row,
                    float(cells["mean"].mean()),
                    float(measured["steps_per_s"].mean()),
                    float(measured["peak_memory_mb"].mean()),
                    bool(measured["compiled"].any()),
                )
            )
    return found


def figure(table: Table, path: Path) -> bool:
    """Draw the first section with speed and memory into ``path``; whether there was one."""
    section, shown = next(((s, p) for s in table.sections if (p := points(s))), (None, []))
    if section is None:
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.6), layout="constrained")
    largest = max(point.peak_memory_mb for point in shown) or 1.0
    for point in shown:
        ax.scatter(
            point.steps_per_s, point.accuracy, s=40 + 1200 * point.peak_memory_mb / largest, color=colour(point.row), alpha=0.55
        )
        label = row_label(point.row, section.published) + (" (compiled)" if point.compiled else "")
        ax.annotate(label, (point.steps_per_s, point.accuracy), fontsize=7, ha="center")
    if max(p.steps_per_s for p in shown) > 4 * min(p.steps_per_s for p in shown):
        ax.set_xscale("log")
    devices = sorted(set(" + ".join(section.cells["devices"]).split(" + ")))
    ax.set_xlabel(f"training steps per second ({'; '.join(devices)})", fontsize=8)
    tasks = [task for task in section.tasks if section.has_cells(task)]
    ax.set_ylabel(f"test accuracy (%), mean over {', '.join(tasks)}", fontsize=8)
    ax.set_title(
        textwrap.fill(f"{section.title}: accuracy, speed and peak memory (marker area; largest {largest:.0f} MB)", 70),
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    save_figure(fig, path, dpi=100)
    return True
