"""Where a configuration's finished run is: in a run folder under the output folder, or committed under
``results/runs/``.

One finder for every command that asks: a run about to train is skipped for one (:mod:`lra.run`), a sweep's summary
names it (:mod:`lra.sweep`), a campaign plans and reports its cells by it (:mod:`lra.campaign`), and the table reads
the same files (:mod:`lra.table.records`). A record stands for a configuration only where it is finished and its
stored ``config_hash`` is the hash recomputed from the configuration it holds (:func:`finished_record`): a stored
hash is a claim.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from pathlib import Path

from . import results
from .results import RESULTS_FILE, RunRecord

log = logging.getLogger(__name__)


def record_paths(folder: Path) -> list[Path]:
    """The files under ``folder`` that may hold run records: every run folder's ``results.json`` (at any depth), then
    the committed records directly in it (``results/runs/*.json``); none where ``folder`` is missing."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(folder.rglob(RESULTS_FILE)) + sorted(folder.glob("*.json"))


def finished_record(path: Path, config_hash: str) -> RunRecord | None:
    """The record in ``path`` if it is a finished run of the configuration hashed ``config_hash``: its stored hash says
    so and the hash recomputed from the configuration it holds agrees (:func:`lra.results.config_hash_problem`). One
    whose stored hash alone claims this configuration is named and never stands for it."""
    record = results.read(path)
    if record is None or record.status != "finished" or record.config_hash != config_hash:
        return None
    if problem := results.config_hash_problem(record):
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
