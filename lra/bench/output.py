"""Where the benchmarks write: ``results/`` of the folder they run in, unless ``--out`` says otherwise. Their rows are
read, merged and written through :mod:`lra.rows`."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path("results")  # relative: the user's folder, never the installed package's
