"""The end of a multirun sweep: a summary of its cells and a non-zero exit when one failed.

A Hydra callback (``hydra.callbacks.sweep_summary`` in ``conf/config.yaml``). At the start of a
multirun it creates a ledger file and names it in ``LRA_SWEEP_LEDGER``, which the sweep's jobs
inherit whatever the launcher (in process, joblib workers, SLURM jobs with the submitting
environment); each job appends its run folder when it ends. At the end the summary lists every cell
with its status, the first line of its error and its folder, read from the cells' ``results.json``,
and the process exits with status 1 if any cell did not finish, so that
``python -m lra.train -m ... && python -m lra.table`` stops there. Finished cells stay recorded. A
cell skipped because its configuration finished in another folder or is committed (``lra.train``
looks there before it trains) has no record in its own folder: it counts as finished, and the summary
says where its result is.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from . import results, run_lock

LEDGER_ENV = "LRA_SWEEP_LEDGER"


class SweepSummary(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        ledgers = Path(config.hydra.sweep.dir) / ".sweeps"
        ledgers.mkdir(parents=True, exist_ok=True)
        ledger = ledgers / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.jsonl"
        ledger.touch()
        os.environ[LEDGER_ENV] = str(ledger.resolve())

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        ledger = os.environ.get(LEDGER_ENV)
        # Not a sweep's job: a single run, or one started by a job (Lightning's DDP processes inherit the variable).
        if ledger is None or config.hydra.mode != RunMode.MULTIRUN:
            return
        folder = Path(config.hydra.runtime.output_dir)
        cell = {"folder": str(folder), "overrides": list(job_return.overrides or [])}
        # A job that returned a result (not a failure, nor a refusal) without a finished record in its folder was
        # skipped for a finished run of its configuration elsewhere: the record that run wrote is the cell's.
        ended_with_a_result = job_return.status == JobStatus.COMPLETED and job_return.return_value is not None
        if ended_with_a_result and not finished(results.read(folder / results.RESULTS_FILE)):
            elsewhere = finished_elsewhere(config, folder)
            cell["finished_in"] = str(elsewhere.absolute()) if elsewhere else ""
        line = json.dumps(cell)
        with open(ledger, "a") as file:  # one short append per job: safe beside concurrent jobs
            file.write(line + "\n")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        ledger = os.environ.pop(LEDGER_ENV, None)
        if ledger is None:
            return
        cells = list({cell["folder"]: cell for cell in map(json.loads, Path(ledger).read_text().splitlines())}.values())
        lines, failed = summary(cells)
        print("\n".join(lines), flush=True)
        if failed:
            sys.exit(1)


def finished(record: results.RunRecord | None) -> bool:
    return record is not None and record.status == "finished"


def finished_elsewhere(config: DictConfig, folder: Path) -> Path | None:
    """The record of a finished run of the job's configuration in another folder under the output folder, or
    committed: where the run found it when it skipped the job (:mod:`lra.run`, its configuration hashed as the run hashes it)."""
    from . import run

    try:
        checked, digest = run.checked_and_hashed(config)
    except ValueError:  # refused: the job recorded why in its folder
        return None
    return run.finished_elsewhere(checked, digest, folder) or run.committed_run(checked, digest)


def summary(cells: list[dict[str, Any]]) -> tuple[list[str], int]:
    """The summary's lines and how many cells did not finish. A cell is its run folder and, where it was skipped for
    a finished run of its configuration elsewhere, that run's record (``finished_in``)."""
    rows = []
    for cell in cells:
        folder = Path(cell["folder"])
        own = results.read(folder / results.RESULTS_FILE)
        elsewhere = None if finished(own) or not cell.get("finished_in") else Path(cell["finished_in"])
        record = (results.read(elsewhere) if elsewhere else own) or results.RunRecord()
        status = record.status or "no results.json"
        task, row, seed = ("?" if value is None else value for value in (record.task, record.row, record.seed))
        name = f"{task} / {row} / seed {seed}"
        objective = (record.pretrain or {}).get("objective", "none")
        name += f" / pretrain {objective}" if objective != "none" else ""
        if status == "finished":
            detail = f"test acc {record.test_acc:.4f}"
            detail += f", skipped: its configuration finished in {elsewhere}" if elsewhere else ""
        elif status == "running" and (holder := run_lock.holder(folder)):
            detail = f"in use by another run ({holder})"  # this sweep's job stopped at once (lra/run_lock.py)
        elif status == "interrupted":
            at = f" at step {record.steps}" if record.steps is not None else " before its first checkpoint"
            detail = f"interrupted{at}: the same command resumes it from its last.ckpt"
        else:
            detail = (record.error or "the job ended without a record; see its train.log").splitlines()[0][:160]
        rows.append((status, name, detail, str(folder)))
    failed = sum(status != "finished" for status, *_ in rows)
    lines = [f"Sweep: {len(rows)} cells, {len(rows) - failed} finished, {failed} not finished"]
    width = max((len(name) for _, name, _, _ in rows), default=0)
    for status, name, detail, folder in rows:
        lines.append(f"  {status:<9} {name:<{width}}  {detail}\n  {'':<9} {folder}")
    return lines, failed
