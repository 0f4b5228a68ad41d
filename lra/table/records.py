"""The table's first stage: finding and reading the run records, and committing the finished ones.

The records are every ``results.json`` under the folders searched (a run's output folder) and every ``*.json`` run
record in them (``results/runs/``, as :func:`collect` writes them). ``--collect`` commits the finished runs into
``results/runs/`` with their curves, each one a result (:func:`lra.finished.record_problem`) and by the one rule of
:func:`lra.finished.plan_commit`: never over a newer record of its configuration, and a conflict stops it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path

from .. import run_lock
from ..finished import commit, curve_bytes, plan_commit, record_paths, record_problem
from ..finished import run_file_name as run_file_name
from ..results import RESULTS_FILE, RunRecord


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
        for path in record_paths(folder):
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


def as_result(record: RunRecord, curves: dict[str, Path]) -> RunRecord:
    """``record`` as the table takes it: a finished one that is not a result (:func:`lra.finished.record_problem`, its
    curve from ``curves`` where there; one of before records held their whole configuration taken as committed) is
    ``refused``, with why: a run listed, not a cell."""
    if record.status != "finished":
        return record
    curve = curves.get(record.config_hash)
    problem = record_problem(record, curve.read_bytes() if curve else None, older_ok=True)
    return record if problem is None else dataclasses.replace(record, status="refused", error=problem)


def check_hashes(found: list[tuple[Path, RunRecord]]) -> None:
    """Refuse to collect a finished run that is not a result (:func:`lra.finished.record_problem`: a stored
    ``config_hash`` that is not the hash of the configuration it holds, a test accuracy its curve did not log, losses
    that are not finite): committed, it would stand for a configuration it did not run, or for a number it did not
    measure. Nothing is collected then."""
    for path, record in found:
        if record.status == "finished" and (problem := record_problem(record, curve_bytes(path))):
            raise SystemExit(
                f"error: {path}: {problem}. Committed, it would stand for a configuration it did not run: move it out "
                "of the folders --collect reads, or run its configuration again (rerun=true); nothing was collected"
            )


def collect(found: list[tuple[Path, RunRecord]], runs_dir: Path) -> int:
    """Commit the finished runs of ``found`` (each record with the file it was read from: its curve is beside it) into
    ``runs_dir`` (:func:`lra.finished.plan_commit`, :func:`lra.finished.commit`), saying what was kept or replaced; a
    conflict stops it before anything is written. Returns how many were new."""
    decisions = [plan_commit(record, runs_dir, curve_bytes(path)) for path, record in found if record.status == "finished"]
    if conflicts := [decision for decision in decisions if decision.action == "conflict"]:
        raise SystemExit("error: " + "; ".join(map(str, conflicts)) + "; nothing was collected")
    for decision in decisions:
        commit(decision)
        if decision.action in ("replaces", "kept"):
            print(decision)
    return sum(decision.action == "new" for decision in decisions)
