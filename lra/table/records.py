"""The table's first stage: finding and reading the run records, and committing the finished ones.

The records are every ``results.json`` under the folders searched (a run's output folder) and every ``*.json`` run
record in them (``results/runs/``, as :func:`collect` writes them). ``--collect`` copies the finished runs into
``results/runs/`` after :func:`check_hashes` has found each stored hash to be the one its configuration gives.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from .. import run_lock
from ..results import RESULTS_FILE, RunRecord, config_hash_problem


def find_records(folders: Iterable[Path]) -> list[RunRecord]:
    """Every run record under ``folders`` (``results.json`` files and ``*.json`` run records)."""
    return [record for _, record in find_record_files(folders)]


def find_record_files(folders: Iterable[Path]) -> list[tuple[Path, RunRecord]]:
    """Every run record under ``folders``, with the file it was read from."""
    records = []
    for folder in folders:
        folder = Path(folder)
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob(RESULTS_FILE)) + sorted(folder.glob("*.json")):
            try:
                values = json.loads(path.read_text())
                # Not a run's record: another JSON file (a run's record, even of a run refused before its configuration
                # was resolved, has its task and status).
                if not isinstance(values, dict) or "task" not in values or "status" not in values:
                    continue
                record = RunRecord.from_dict(values)
            except (OSError, ValueError) as error:
                raise SystemExit(f"error: {path} is not a readable run record ({error})") from None
            # A pretraining run (lra.train's stage "pretraining") is part of its fine-tuning runs, not a cell.
            if record.stage is None:
                records.append((path, with_live_status(path, record)))
    return records


def with_live_status(path: Path, record: RunRecord) -> RunRecord:
    """``record`` (read from ``path``) as it stands: a run recorded as running whose folder no live process holds
    (:mod:`lra.run_lock`) was killed (SIGKILL, out of memory, a lost machine) before it could record it; it is
    ``abandoned``, not running. A live one's error names its process."""
    if record.status != "running" or path.name != RESULTS_FILE:
        return record
    if holder := run_lock.holder(path.parent):
        record.error = f"in progress ({holder})"
    else:
        record.status = "abandoned"
        record.error = (
            "its process ended without recording how (killed: SIGKILL, out of memory, a lost machine); the same "
            "command resumes it from its last.ckpt"
        )
    return record


def run_file_name(record: RunRecord) -> str:
    """A committed record's file name: its task, row, protocol, seed and configuration hash, one file per
    configuration and seed."""
    row = record.row.replace(" ", "_").replace("/", "-").replace("=", "-")
    return f"{record.task}__{row}__{record.protocol['name']}__seed{record.seed}__{record.config_hash[:8]}.json"


def check_hashes(found: list[tuple[Path, RunRecord]]) -> None:
    """Refuse to collect a finished run whose stored ``config_hash`` is not the hash recomputed from the configuration
    it holds (:func:`lra.results.config_hash_problem`): committed, it would make every checkout skip the configuration
    it claims. Nothing is collected then."""
    for path, record in found:
        if record.status == "finished" and (problem := config_hash_problem(record)):
            raise SystemExit(
                f"error: {path}: {problem}. Committed, it would stand for a configuration it did not run: move it out "
                "of the folders --collect reads, or run its configuration again (rerun=true); nothing was collected"
            )


def collect(records: list[RunRecord], runs_dir: Path) -> int:
    """Copy finished runs into ``runs_dir`` as small JSON files, without machine-specific paths (``committed=True``);
    return how many were new."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    new = 0
    for record in records:
        if record.status != "finished":
            continue
        path = runs_dir / run_file_name(record)
        new += not path.exists()
        record.write(path, committed=True)
    return new
