"""Where the benchmarks write: ``results/`` of the folder they run in, unless ``--out`` says otherwise. Their rows are
read, merged and written through :mod:`lra.rows`."""

from __future__ import annotations

from pathlib import Path

from lra.rows import write_rows

RESULTS = Path("results")  # relative: the user's folder, never the installed package's

write_csv = write_rows  # the name lra.campaign's cells-per-hour curve still writes through, until it moves to lra.rows
