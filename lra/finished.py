"""Finished runs: where a configuration's finished run is, whether a record may stand for one, and how one is
committed to ``results/runs/``.

One finder for every command that asks: a run about to train is skipped for one (:mod:`lra.run`), a sweep's summary
names it (:mod:`lra.sweep`), a campaign plans and reports its cells by it (:mod:`lra.campaign`), and the table reads
the same files (:mod:`lra.table.records`). A record is a result only where it agrees with its run
(:func:`record_problem`): it is finished, its stored ``config_hash`` is the hash recomputed from the configuration it
holds (a stored hash is a claim), its losses are finite, its test accuracy is the one its curve (the run's
``metrics.csv``) logged, where the curve is there, and the one its per-sample results (``test_correct``) count, where
it has them. :func:`commit` is the one way a record becomes a committed run (``lra.table --collect`` and ``lra.campaign
unpack``): never over a newer record of its configuration, and two that disagree are a conflict, not a silent pick.
"""

from __future__ import annotations

import csv
import io
import logging
import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from . import results
from .files import write_atomically
from .results import RESULTS_FILE, RunRecord

log = logging.getLogger(__name__)

CURVES = "curves"  # results/runs/curves/<run file name>.csv: a committed run's metrics.csv
TEST_ACC_TOLERANCE = 1e-6  # a record's test accuracy and its curve's: the same number, written by two writers


def record_paths(folder: Path) -> list[Path]:
    """The files under ``folder`` that may hold run records: every run folder's ``results.json`` (at any depth), then
    the committed records directly in it (``results/runs/*.json``); none where ``folder`` is missing."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(folder.rglob(RESULTS_FILE)) + sorted(folder.glob("*.json"))


def curve_file(path: Path) -> Path:
    """Where the curve of the record read from ``path`` is: its run folder's metrics.csv, or a committed record's."""
    path = Path(path)
    if path.name == RESULTS_FILE:
        return path.parent / "metrics" / "metrics.csv"
    return path.parent / CURVES / f"{path.stem}.csv"


def run_file_name(record: RunRecord) -> str:
    """A committed record's file name: its task, row, protocol, seed and configuration hash, one file per
    configuration and seed."""
    row = record.row.replace(" ", "_").replace("/", "-").replace("=", "-")
    return f"{record.task}__{row}__{record.protocol['name']}__seed{record.seed}__{record.config_hash[:8]}.json"


RESULT_KEYS = ("test_acc", "test_loss", "best_val_acc")  # a record's numbers that make it a result


def logged(curve: bytes) -> tuple[float | None, list[str]]:
    """What a run's ``metrics.csv`` logged: its test accuracy (the last ``test/acc``; None where none) and the losses
    of its evaluations and its test that are not finite (``val/loss at step 400: nan``)."""
    accuracy, non_finite = None, []
    for row in csv.DictReader(io.StringIO(curve.decode(errors="replace"))):
        if row.get("test/acc"):
            accuracy = float(row["test/acc"])
        for key in ("val/loss", "test/loss"):
            if row.get(key) and not math.isfinite(float(row[key])):
                non_finite.append(f"{key} at step {row.get('step', '?')}: {row[key]}")
    return accuracy, non_finite


def record_problem(record: RunRecord, curve: bytes | None = None, older_ok: bool = False) -> str | None:
    """Why ``record`` is not a result, in words; None where it is one. ``curve``: the bytes of its run's metrics.csv,
    where it is carried with it. ``older_ok``: a record of before records held their whole configuration (its hash
    cannot be recomputed) is taken as it was committed, where the table reads it; nothing new is committed so."""
    if record.status != "finished":
        return f"it is {record.status or 'of no status'}, not finished"
    if (problem := results.config_hash_problem(record)) and not (older_ok and results.recomputed_config_hash(record) is None):
        return problem
    non_finite = {key: value for key, value in (record.non_finite or {}).items() if key in RESULT_KEYS}
    non_finite.update(
        {key: str(value) for key in RESULT_KEYS if isinstance(value := getattr(record, key), float) and not math.isfinite(value)}
    )
    if non_finite:
        return f"its {', '.join(f'{key} ({value})' for key, value in sorted(non_finite.items()))} is not finite: no result"
    if record.test_correct is not None and (problem := per_sample_problem(record)):
        return problem
    if curve is None:
        return None
    accuracy, losses = logged(curve)
    if losses:
        return f"its run logged losses that are not finite ({'; '.join(losses[:3])}): no result"
    if accuracy is None or record.test_acc is None or abs(accuracy - record.test_acc) > TEST_ACC_TOLERANCE:
        return (
            f"its test accuracy {record.test_acc} is not the one its run logged in its metrics.csv ({accuracy}): it was "
            "edited or belongs to another run"
        )
    return None


def per_sample_problem(record: RunRecord) -> str | None:
    """Why ``record``'s ``test_correct`` (which test samples it classified correctly) is not its test's, in words; None
    where it is: one "0" or "1" per test sample, as many "1"s as its test accuracy counts."""
    correct, num_test = record.test_correct, (record.num_samples or {}).get("test")
    if not isinstance(correct, str) or set(correct) - {"0", "1"}:
        return "its test_correct is not a string of 0s and 1s (one per test sample): it was edited"
    if not correct or len(correct) != num_test:
        return f"its test_correct has {len(correct)} samples, its test set {num_test}: it was edited or belongs to another run"
    if record.test_acc is None or abs(correct.count("1") / len(correct) - record.test_acc) > TEST_ACC_TOLERANCE:
        return (
            f"its test_correct counts {correct.count('1')} of {len(correct)} samples correct, its test accuracy is "
            f"{record.test_acc}: it was edited or belongs to another run"
        )
    return None


def curve_bytes(path: Path) -> bytes | None:
    """The curve beside the record read from ``path``, where there is one."""
    try:
        return curve_file(path).read_bytes()
    except OSError:
        return None


def finished_record(path: Path, config_hash: str) -> RunRecord | None:
    """The record in ``path`` if it is a finished run of the configuration hashed ``config_hash`` and a result
    (:func:`record_problem`, with the curve beside it). One whose stored hash alone claims this configuration is named
    and never stands for it."""
    record = results.read(path)
    if record is None or record.status != "finished" or record.config_hash != config_hash:
        return None
    if problem := record_problem(record, curve_bytes(path)):
        log.warning("Not skipping for %s: %s. It is not this configuration's run; move it away or delete it", path, problem)
        return None
    return record


def finished_runs(config_hashes: Collection[str], paths: Iterable[Path]) -> dict[str, Path]:
    """The first of ``paths`` (record files, in order) holding a finished run of each of ``config_hashes``
    (:func:`finished_record`), by hash. A file is parsed only where one of the hashes is in its text, so that a large
    output folder stays cheap; one that cannot be read (removed while the folder is walked) is passed over."""
    wanted, found = set(config_hashes), {}
    for path in paths:
        try:
            text = path.read_text()
        except OSError:
            continue
        for digest in [digest for digest in wanted if digest in text]:
            if finished_record(path, digest) is not None:
                found[digest] = path
                wanted.discard(digest)
        if not wanted:
            break
    return found


@dataclass
class Commit:
    """What committing a record does: ``new`` (no committed record of its configuration yet), ``same`` (that record
    already), ``replaces`` (an older record of it), ``kept`` (a newer one is committed: it stays) or ``conflict`` (one
    finished at the same time with other results: which is right is the user's to say)."""

    action: str
    path: Path
    record: RunRecord
    curve: bytes | None = None

    def __str__(self) -> str:
        return {
            "new": f"{self.path.name}: new",
            "same": f"{self.path.name}: already committed",
            "replaces": f"{self.path.name}: replaces the committed record of an older run of its configuration",
            "kept": f"{self.path.name}: a newer run of its configuration is committed; it stays",
            "conflict": (
                f"{self.path.name}: a conflict: the committed record finished at the same time ({self.record.finished_at}) "
                "with other results; move one of the two away"
            ),
        }[self.action]


def plan_commit(record: RunRecord, runs_dir: Path, curve: bytes | None = None) -> Commit:
    """How committing ``record`` (a result: :func:`record_problem` is the caller's to check first) into ``runs_dir``
    goes, decided before anything is written."""
    path = Path(runs_dir) / run_file_name(record)
    committed = results.read(path)
    if committed is None:
        return Commit("new", path, record, curve)
    ours, theirs = record.to_dict(committed=True), committed.to_dict(committed=True)
    if ours == theirs:
        return Commit("same", path, record, curve)
    if (record.finished_at or "") > (committed.finished_at or ""):
        return Commit("replaces", path, record, curve)
    if (record.finished_at or "") < (committed.finished_at or ""):
        return Commit("kept", path, record, curve)
    return Commit("conflict", path, record, curve)


def commit(decision: Commit) -> None:
    """Write what :func:`plan_commit` decided: the record in its committed form (no machine paths) and its curve."""
    if decision.action not in ("new", "replaces"):
        return
    decision.path.parent.mkdir(parents=True, exist_ok=True)
    if decision.curve is not None:
        curve = curve_file(decision.path)
        curve.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(curve, decision.curve)
    decision.record.write(decision.path, committed=True)
