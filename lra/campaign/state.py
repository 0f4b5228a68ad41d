"""Where each of a campaign's cells stands: finished, committed, running (its step and pace), diverged, failed,
interrupted or pending, read from the files its run and the campaign leave (records, locks, metrics, train.log, the
cells' exit files)."""

from __future__ import annotations

import csv
import re
import socket
import statistics
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from .. import checkpoints, config, results, run_lock
from ..finished import finished_runs, record_paths
from .plan import CELLS, LOG_FILE, PLAN_FILE, UNPACKED, CampaignError, Cell, Plan, campaign_name, plural

STATES = ("finished", "committed", "running", "failed", "diverged", "interrupted", "pending")
DONE = ("finished", "committed", "diverged")  # a cell in one of these is not run again

# An evaluation's line in a run's train.log: lra.callbacks.EvaluationLog's message in the file format of
# conf/hydra/job_logging/lra.yaml.
EVALUATION_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)\]\[lra\.train\.file\]\[INFO\] - step (\d+): ")
PACE_INTERVALS = 10  # a running cell's pace: the median over this many of its latest intervals between evaluations


def finished_records(cells: list[Cell], output_dir: Path, runs_dir: Path) -> tuple[dict[str, Path], dict[str, Path]]:
    """The finished run of each cell's configuration, by hash: under the output folder (its own folder first, as
    ``lra.train`` looks) and committed under ``runs_dir`` (:func:`lra.finished.finished_runs`)."""
    hashes = {cell.config_hash for cell in cells}
    own = [Path(cell.folder) / results.RESULTS_FILE for cell in cells]
    return finished_runs(hashes, [*own, *record_paths(output_dir)]), finished_runs(hashes, record_paths(runs_dir))


def progress(folder: Path) -> tuple[int | None, float | None]:
    """The latest logged step of a run and its latest validation accuracy, from its metrics.csv (a row's step is the
    steps trained when it was logged)."""
    path = folder / "metrics" / "metrics.csv"
    step, val = None, None
    try:
        with open(path, newline="") as file:
            for row in csv.DictReader(file):
                if row.get("step"):
                    step = int(float(row["step"]))
                if row.get("val/acc"):
                    val = float(row["val/acc"])
    except (OSError, ValueError):
        pass
    return step, val


def evaluation_times(train_log: Path) -> list[tuple[datetime, int]]:
    """When each evaluation in a run's train.log was logged, and at which step, in the file's order (a resumed run
    appends to it); empty where there is no file."""
    try:
        lines = train_log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    matches = (EVALUATION_LINE.match(line) for line in lines)
    return [(datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f"), int(m[2])) for m in matches if m]


def pace(train_log: Path) -> float | None:
    """A run's training steps per second at the pace of its latest evaluations, evaluations included: the median rate
    over the last ``PACE_INTERVALS`` intervals between consecutive evaluations, so that the hours a carried run spent
    stopped between two machines do not count. None before its second evaluation."""
    times = evaluation_times(train_log)[-(PACE_INTERVALS + 1) :]
    rates = [
        (step - earlier_step) / (time - earlier).total_seconds()
        for (earlier, earlier_step), (time, step) in zip(times, times[1:])
        if step > earlier_step and time > earlier
    ]
    return statistics.median(rates) if rates else None


def duration_text(seconds: float) -> str:
    """``1.6 h`` from an hour up, ``20 min`` below."""
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{max(1, round(seconds / 60))} min"


def pace_text(steps_per_second: float, steps_left: int) -> str:
    """``41 steps/min, about 1.6 h to its last step``."""
    return f"{steps_per_second * 60:.3g} steps/min, about {duration_text(steps_left / steps_per_second)} to its last step"


def saved_step(folder: Path) -> int | None:
    """The step a stopped run's last.ckpt holds (where it resumes, which ``unpack`` says too); None where it has none
    that reads."""
    try:
        return checkpoints.step(folder / "checkpoints" / "last.ckpt")
    except checkpoints.UNREADABLE:
        return None


@dataclass
class CellState:
    cell: Cell
    status: str  # one of STATES
    detail: str
    record: Path | None = None  # the finished or committed record (pack carries the finished ones)
    step: int = 0  # the steps trained (a stopped run's: where it resumes)
    pace: float | None = None  # a running cell's steps per second (:func:`pace`)


def cell_states(campaign: Path, cells: list[Cell], output_dir: Path, runs_dir: Path, started: bool = True) -> list[CellState]:
    """Where each of the ``cells`` of the campaign in ``campaign`` stands, its finished runs looked for under
    ``output_dir`` and among the records committed in ``runs_dir``. ``started``: whether the ``cells`` are the plan
    started in the folder; those of a plan not started yet (what a dry run lists) own none of the folder's ``cells/``
    files, which start deletes (its cell n is another plan's cell n)."""
    found, committed = finished_records(cells, Path(output_dir), Path(runs_dir))
    alive = run_lock.holder(campaign) is not None
    launched = {cell.index for cell in cells if started and (campaign / CELLS / f"{cell.index}.log").is_file()}
    return [cell_state(campaign, cell, found, committed, alive, cell.index in launched) for cell in cells]


def plan_states(campaign: Path, plan: Plan, started: bool = True) -> list[CellState]:
    return cell_states(campaign, plan.cells, Path(plan.output_dir), Path(plan.runs_dir), started)


def cell_state(
    campaign: Path, cell: Cell, found: dict[str, Path], committed: dict[str, Path], alive: bool, launched: bool
) -> CellState:
    """Where ``cell`` stands: its finished run (``found``) or committed one, its folder's lock, its record, whether the
    campaign ``launched`` it (``cells/<n>.log``), how it ended (``cells/<n>.exit``) and whether the campaign is
    ``alive``."""
    folder = Path(cell.folder)
    exit_file = campaign / CELLS / f"{cell.index}.exit"
    step, val = progress(folder)
    holder = run_lock.holder(folder)
    if not holder and (saved := saved_step(folder)) is not None:  # stopped: where it resumes, not its latest row
        step = saved
    steps = f"step {step or 0}/{cell.max_steps}" + (f", val acc {val:.4f}" if val is not None else "")
    record = results.read(folder / results.RESULTS_FILE)
    if cell.config_hash in found:
        finished = results.read(found[cell.config_hash])
        where = "" if found[cell.config_hash].parent == folder else f" (in {found[cell.config_hash].parent})"
        return CellState(cell, "finished", f"test acc {finished.test_acc:.4f}{where}", found[cell.config_hash])
    if cell.config_hash in committed:
        return CellState(cell, "committed", f"skipped: {committed[cell.config_hash]}", committed[cell.config_hash])
    if holder:
        rate = pace(folder / "train.log") if (step or 0) < cell.max_steps else None  # else it is testing
        if rate is not None:
            steps += ", " + pace_text(rate, cell.max_steps - (step or 0))
        return CellState(cell, "running", f"{steps} ({holder})", step=step or 0, pace=rate)
    if record and record.status == "diverged":
        # Its settings make it diverge: run again, it would again. Not run, and its record goes on from job to job.
        return CellState(cell, "diverged", f"{steps}: {(record.error or '').splitlines()[0][:160]}", step=step or 0)
    if launched and exit_file.is_file():
        status = record.status if record and record.status in ("failed", "interrupted") else "failed"
        error = record.error if record and record.error else f"exit status {exit_file.read_text().strip()}"
        error += "" if record else ", no record"
        error += "; start resumes it from its last.ckpt" if status == "interrupted" else ""
        return CellState(cell, status, f"{steps}: {error.splitlines()[0][:160]}", step=step or 0)
    if launched and alive:
        return CellState(cell, "running", "starting", step=step or 0)
    if launched:
        return CellState(cell, "failed", f"{steps}: the campaign stopped while it ran (see {LOG_FILE})", step=step or 0)
    return CellState(cell, "pending", steps if step else "", step=step or 0)


def run_order(states: list[CellState]) -> list[CellState]:
    """The cells still to run, in the order a campaign launches them: those that trained before (stopped in an earlier
    job, their state kept or carried) first, so that each finishes before a new cell starts and a job leaves as few
    unfinished cells to the next as it can; the plan's order (whole seeds first) otherwise."""
    return sorted((state for state in states if state.status not in DONE), key=lambda state: state.step == 0)


def same_but_seed(cell: Cell) -> tuple[str, ...]:
    """A cell's overrides but its seed: what the cells of one row (one configuration, several seeds) share."""
    return tuple(override for override in cell.overrides if not override.startswith("seed="))


def time_left(states: list[CellState], parallel: int) -> str | None:
    """How long the cells still to run need, in words; None where none is left. A running cell at its own pace, every
    other one at the wall time per step of the finished or committed runs of its row (its configuration on other
    seeds: their evaluations and test included, on whichever machine ran them), ``parallel`` at a time."""
    seconds_per_step: dict[tuple[str, ...], list[float]] = {}
    for state in states:
        record = results.read(state.record) if state.status in ("finished", "committed") and state.record else None
        if record and record.wall_time_s and record.steps:
            # At least its steps at its training pace: the records of runs resumed before their pieces' times were
            # summed (lra.run.goes_on) hold their last piece's wall time only.
            wall_time = max(record.wall_time_s, record.steps / record.steps_per_second if record.steps_per_second else 0)
            seconds_per_step.setdefault(same_but_seed(state.cell), []).append(wall_time / record.steps)
    left = [state for state in states if state.status not in DONE]
    if not left:
        return None
    seconds, unknown = 0.0, 0
    for state in left:
        steps = max(0, state.cell.max_steps - state.step)
        if state.pace:
            seconds += steps / state.pace
        elif rates := seconds_per_step.get(same_but_seed(state.cell)):
            seconds += steps * statistics.mean(rates)
        else:
            unknown += 1
    known = len(left) - unknown
    text = "Left: "
    if known:
        text += (
            f"about {duration_text(seconds / parallel)} for {plural(known, 'cell')}, {parallel} at a time (a running cell "
            "at its pace, the others at the wall time per step of their row's finished runs)"
        )
    if unknown:
        text += ("; and " if known else "") + f"{plural(unknown, 'cell')} of rows with no finished run yet, not estimated"
    return text


def status_text(campaign: Path, plan: Plan, packed: bool = False) -> str:
    """The campaign in words: its plan, its process, the count of its cells in each state, and each cell. ``packed``:
    as its archive carries it, where no process goes along."""
    states = plan_states(campaign, plan)
    holder = run_lock.holder(campaign)
    counts = {name: sum(s.status == name for s in states) for name in STATES}
    process = "running, " + holder if holder else "not running"
    if not holder and not packed and not all(state.status in DONE for state in states):
        process += f" (python -m lra.campaign resume --dir {campaign_name(campaign)} goes on with its cells)"
    if packed:
        process = f"packed at {results.now()} on {socket.gethostname()} (it was {process}); the archive carries no process"
    lines = [plan.describe(), f"Campaign process: {process}"]
    lines.append(
        f"{len(states)} cells: " + ", ".join(f"{count} {name}" for name, count in counts.items() if count or name == "finished")
    )
    width = max(len(s.cell.name) for s in states)
    for state in states:
        lines.append(f"  {state.status:<11} {state.cell.name:<{width}}  {state.detail}")
    if (left := time_left(states, plan.parallel)) is not None:
        lines.append(left)
    if all(state.status in DONE for state in states):
        lines.append(
            "Nothing left to run: every cell is finished, committed or diverged. To go on with more seeds, start the "
            "campaign again with them (seed=0,1,2): the cells finished or committed are skipped."
        )
    return "\n".join(lines)


def earlier_plans(campaign: Path) -> list[Plan]:
    """The plans of the campaign in ``campaign`` that a new one replaces: the one in its folder, and each plan that
    ``unpack`` read back from an archive of this campaign (``<output folder>/unpacked/*/campaign.json`` naming this
    folder). A plan that does not read is passed over: this only looks for work to keep."""
    paths = [campaign / PLAN_FILE, *sorted((config.output_dir() / UNPACKED).glob(f"*/{PLAN_FILE}"))]
    plans = []
    for path in paths:
        try:
            earlier = Plan.read(path.parent)
        except (CampaignError, OSError, ValueError, TypeError, KeyError):
            continue
        if path.parent == campaign or earlier.dir == campaign_name(campaign):
            plans.append(earlier)
    return plans


def left_out(campaign: Path, plan: Plan) -> list[tuple[Plan, Cell, int]]:
    """The unfinished cells of the campaign's earlier plans (:func:`earlier_plans`) that ``plan`` leaves out, each
    with its plan and the step its last.ckpt holds on this machine. A pack carries its plan's cells only, so once
    ``plan`` replaces theirs, what they trained would stay behind on this machine. A cell whose folder ``plan`` still
    trains in is not left out, whatever its configuration now (its run says whether its last.ckpt resumes)."""
    output_dir = Path(plan.output_dir)
    planned_hashes, planned_folders = {cell.config_hash for cell in plan.cells}, {cell.folder for cell in plan.cells}
    candidates: dict[str, tuple[Plan, Cell, int]] = {}
    for earlier in earlier_plans(campaign):
        for cell in earlier.cells:
            folder = Path(cell.folder)
            known = cell.config_hash in planned_hashes or cell.config_hash in candidates
            if known or not folder.is_relative_to(earlier.output_dir):
                continue
            here = replace(cell, folder=str(output_dir / folder.relative_to(earlier.output_dir)))
            if here.folder in planned_folders:
                continue
            record = results.read(Path(here.folder) / results.RESULTS_FILE)
            if (step := saved_step(Path(here.folder))) is not None and not (record and record.status == "diverged"):
                candidates[cell.config_hash] = (earlier, here, step)
    found, committed = finished_records([cell for _, cell, _ in candidates.values()], output_dir, Path(plan.runs_dir))
    return [entry for digest, entry in candidates.items() if digest not in found and digest not in committed]
