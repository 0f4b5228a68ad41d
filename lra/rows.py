"""Measurement rows on disk: the CSV files ``results/`` keeps (benchmarks, the campaign's cells per hour), and
their figures.

One store for every writer: :func:`read_rows` (typed where asked), :func:`merge_rows` (a new measurement replaces
the earlier one of its key and keeps the rest, so a run of some cells keeps the file's other rows),
:func:`write_rows` (atomically: a reader, a kill or a full disk finds the old file or the new one whole) and
:func:`pyplot` / :func:`save_figure` (matplotlib without a display, and files without a version stamp: the same rows
give the same bytes).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from .files import write_atomically

Row = dict[str, Any]


def read_rows(path: Path, types: dict[str, Callable[[str], Any]] | None = None) -> list[Row]:
    """The rows of the CSV file ``path`` (none where it does not exist), each value a string, or typed by ``types``
    (a column's function from its text; an empty cell stays ""). A column the file lacks (written before the column
    was) is "" in every row where ``types`` names it."""
    if not Path(path).is_file():
        return []
    with open(path, newline="") as file:
        rows = list(csv.DictReader(file))
    for row in rows:
        for column, convert in (types or {}).items():
            text = row.get(column) or ""
            row[column] = convert(text) if text != "" else ""
    return rows


def merge_rows(rows: Iterable[Row], new: Iterable[Row], key: Sequence[str]) -> list[Row]:
    """``rows`` with each of ``new`` in place of the row of its key (the values of the columns ``key``, compared as
    text), or after them where it has none."""
    merged = list(rows)
    where = {key_of(row, key): index for index, row in enumerate(merged)}
    for row in new:
        index = where.get(key_of(row, key))
        if index is None:
            where[key_of(row, key)] = len(merged)
            merged.append(row)
        else:
            merged[index] = row
    return merged


def key_of(row: Row, key: Sequence[str]) -> tuple[str, ...]:
    return tuple(str(row.get(column, "")) for column in key)


def write_rows(rows: Iterable[Row], path: Path, fields: Sequence[str]) -> None:
    """Write ``rows`` with the columns ``fields`` (a key a row lacks is empty; one ``fields`` lacks is an error),
    atomically, creating the folder."""
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(fields))
    writer.writeheader()
    writer.writerows(rows)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_atomically(Path(path), text.getvalue().encode())


def pyplot():
    """matplotlib's pyplot, drawing into files (the Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, dpi: int = 120) -> None:
    """Write ``fig`` to ``path`` without matplotlib's version stamp (the same rows give the same bytes) and close it."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, metadata={"Software": None})
    pyplot().close(fig)
