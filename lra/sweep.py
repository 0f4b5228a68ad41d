"""The end of a multirun sweep: a summary of its cells and a non-zero exit when one failed.

A Hydra callback (``hydra.callbacks.sweep_summary`` in ``conf/config.yaml``). At the start of a
multirun it creates a ledger file and names it in ``LRA_SWEEP_LEDGER``, which the sweep's jobs
inherit whatever the launcher (in process, joblib workers, SLURM jobs with the submitting
environment); each job appends its run folder when it ends. At the end the summary lists every cell
with its status, the first line of its error and its folder, read from the cells' ``results.json``,
and the process exits with status 1 if any cell did not finish, so that
``python -m lra.train -m ... && python -m lra.table`` stops there. Finished cells stay recorded.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn
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
        line = json.dumps({"folder": str(config.hydra.runtime.output_dir), "overrides": list(job_return.overrides or [])})
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


def summary(cells: list[dict[str, Any]]) -> tuple[list[str], int]:
    """The summary's lines and how many cells did not finish."""
    rows = []
    for cell in cells:
        folder = Path(cell["folder"])
        record = results.read(folder / results.RESULTS_FILE) or results.RunRecord()
        status = record.status or "no results.json"
        task, row, seed = ("?" if value is None else value for value in (record.task, record.row, record.seed))
        name = f"{task} / {row} / seed {seed}"
        objective = (record.pretrain or {}).get("objective", "none")
        name += f" / pretrain {objective}" if objective != "none" else ""
        if status == "finished":
            detail = f"test acc {record.test_acc:.4f}"
        elif status == "running" and (holder := run_lock.holder(folder)):
            detail = f"in use by another run ({holder})"  # this sweep's job stopped at once (lra/run_lock.py)
        else:
            detail = (record.error or "the job ended without a record; see its train.log").splitlines()[0][:160]
        rows.append((status, name, detail, str(folder)))
    failed = sum(status != "finished" for status, *_ in rows)
    lines = [f"Sweep: {len(rows)} cells, {len(rows) - failed} finished, {failed} not finished"]
    width = max((len(name) for _, name, _, _ in rows), default=0)
    for status, name, detail, folder in rows:
        lines.append(f"  {status:<9} {name:<{width}}  {detail}\n  {'':<9} {folder}")
    return lines, failed
