"""Where the benchmarks write, and how: ``results/`` of the folder they run in (or ``--out``), one CSV writer."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

RESULTS = Path("results")  # relative: the user's folder, never the installed package's


def write_csv(rows: list[dict[str, Any]], path: Path, fields: list[str]) -> None:
    """Write ``rows`` with the columns ``fields``, atomically (a partial file is renamed into place), creating the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(path.suffix + ".partial")
    with open(partial, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    partial.replace(path)
