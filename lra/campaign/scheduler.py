"""The campaign's own process: its data prepared once, then its cells K at a time, each an ordinary ``lra.train``
process, until they are done, it is stopped (a signal, ``--stop-after``) or its deadline's margin comes; then what it
measured and, with ``--pack``, its archive.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import run_lock, signals
from .carry import write_pack
from .machine import Share, cell_command, lower_priority
from .mps import mps_daemon
from .plan import CELLS, CampaignError, Cell, Plan
from .state import finished_records, plan_states, progress, run_order
from .throughput import RAMP_READ_S, Ramp, observe_cells, record_throughput

log = logging.getLogger("lra.campaign")

STOP_GRACE_S = 300  # how long a stopped cell may take to save its checkpoint before it is killed


PR_SET_PDEATHSIG = 1 if sys.platform.startswith("linux") else None  # prctl's option: a signal when the parent dies


def ends_with(campaign_pid: int):
    """What a cell's process runs before ``lra.train`` (Linux): it asks to be sent SIGTERM when the campaign's process
    dies, however (SIGKILL, the out-of-memory killer), so that it saves its state and ends with it, where it would train
    on unwatched and hold its folder against the next campaign's cell. A campaign that died before the request took
    effect is seen at once, and the cell ends before it starts."""

    def request() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != campaign_pid:
            os._exit(1)

    return request


class Stopping:
    """SIGTERM / SIGINT to the campaign: launch nothing more, let the running cells save their checkpoint and end."""

    def __init__(self) -> None:
        self.why: str | None = None
        signals.take(self.handle)  # a data generator's pool forked later keeps the default handlers

    def handle(self, signum: int, frame: Any) -> None:
        self.why = self.why or f"signal {signal.Signals(signum).name}"


def run(campaign: Path) -> int:
    """Run the plan in ``campaign`` in this process: the data first, then the cells not yet finished, K at a time."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%Y-%m-%d %H:%M:%S", force=True)
    plan = Plan.read(campaign)
    if plan.nice:
        log.info("Priority: %s", lower_priority(plan.nice))
    try:
        with run_lock.held(campaign):
            return run_cells(campaign, plan)
    except run_lock.RunFolderBusy as busy:
        log.error("error: %s", busy)
        return 1


def prepare_data(datasets: list[dict[str, Any]]) -> None:
    """Generate and prepare each distinct data set once, before any cell starts (each under its own lock)."""
    from ..data.tasks import prepare_task

    for dataset in datasets:
        start_time = time.monotonic()
        resolved = prepare_task(dataset["task"], dataset["data"])
        log.info("Data of %s ready in %.0f s: %s", dataset["task"], time.monotonic() - start_time, resolved.folder)


def prepared(plan: Plan) -> bool:
    """YOSO's kernels built and every data set prepared, before the first cell; whether it went well (a data set that
    cannot be prepared would fail every cell the same way: one message instead).

    The kernels build (a minute on a bare GPU machine) while the data is prepared, not after it: every cell loads them.
    The build is left to a process of its own and waited for, whatever it says (a cell that needs kernels that failed
    to build says so itself)."""
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.STDOUT}
    build = subprocess.Popen([sys.executable, "-m", "yoso_cuda"], cwd=plan.cwd, **quiet)
    try:
        prepare_data(plan.datasets)
    except Exception as error:
        log.error("error: preparing the data failed: %s: %s", type(error).__name__, error)
        return False
    finally:
        build.wait()
    return True


@dataclass
class Pool:
    """The cells of one run of the campaign: those waiting, those running (K at most), those ended, and the stop."""

    campaign: Path
    plan: Plan
    share: Share
    queue: list[Cell]
    deadline: float | None  # monotonic time at which the cells are stopped
    grace: float  # how long a stopped cell may take to save its state before it is killed
    ramp: Ramp | None  # --parallel auto: K measured within the job
    running: dict[int, tuple[subprocess.Popen, Cell, float]] = field(default_factory=dict)
    first_step: dict[int, int] = field(default_factory=dict)  # each launched cell's step at its launch (a resumed one's)
    ended: list[Cell] = field(default_factory=list)
    training_since: float | None = None
    stopped_at: float | None = None  # when the running cells were told to stop
    observed: float = 0.0  # when the ramp last read the cells' steps

    @property
    def k(self) -> int:
        return self.ramp.k if self.ramp else self.share.parallel

    def stop(self, why: str) -> None:
        """Tell the running cells to save their state and end (SIGTERM); launch nothing more."""
        log.info("Stopping (%s): %d running cells save their checkpoint; %d not started", why, len(self.running), len(self.queue))
        for process, _, _ in self.running.values():
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        self.queue, self.stopped_at = [], time.monotonic()

    def launch(self, cell: Cell, mps: dict[str, str] | None) -> None:
        command, env = cell_command(cell, Share.of(self.k, self.plan.cores) if self.ramp else self.share, mps)
        with open(self.campaign / CELLS / f"{cell.index}.log", "w") as output:
            output.write(f"$ {' '.join(command)}\n# env: {' '.join(f'{k}={v}' for k, v in env.items())}\n")
            output.flush()
            process = subprocess.Popen(
                command,
                cwd=self.plan.cwd,
                env={**os.environ, **env},
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                preexec_fn=ends_with(os.getpid()) if PR_SET_PDEATHSIG else None,
            )
        self.running[cell.index] = (process, cell, time.monotonic())
        self.first_step.setdefault(cell.index, progress(Path(cell.folder))[0] or 0)
        self.training_since = self.training_since or time.monotonic()
        log.info("launched %s (pid %d, %d running)", cell.name, process.pid, len(self.running))

    def reap(self) -> None:
        """Note each cell that has ended (its exit status in ``cells/<n>.exit``); kill one that has not saved its
        state within the grace after a stop."""
        for index, (process, cell, started) in list(self.running.items()):
            if process.poll() is None:
                if self.stopped_at is not None and time.monotonic() - self.stopped_at > self.grace:
                    process.kill()
                continue
            (self.campaign / CELLS / f"{index}.exit").write_text(f"{process.returncode}\n")
            del self.running[index]
            self.ended.append(cell)
            log.info("ended %s: exit status %d after %.0f s", cell.name, process.returncode, time.monotonic() - started)

    def run(self, stopping: Stopping, mps: dict[str, str] | None) -> None:
        while self.queue or self.running:
            if self.deadline is not None and time.monotonic() > self.deadline and not stopping.why:
                stopping.why = "the --deadline's margin" if self.plan.stop_at else f"--stop-after {self.plan.stop_after_s} s"
            if stopping.why and self.stopped_at is None:
                self.stop(stopping.why)
            while self.queue and len(self.running) < self.k:
                self.launch(self.queue.pop(0), mps)
            time.sleep(0.5)
            self.reap()
            if self.ramp and not self.ramp.settled and self.stopped_at is None:
                if time.monotonic() - self.observed > min(RAMP_READ_S, self.ramp.window_s / 4):
                    self.observed = time.monotonic()
                    cells = [cell for _, cell, _ in self.running.values()]
                    observe_cells(self.ramp, self.observed, cells, self.ended, self.first_step, len(self.queue))


def new_pool(campaign: Path, plan: Plan, todo: list[Cell]) -> Pool:
    """The pool of ``todo`` with the plan's stop: ``--stop-after`` from now, ``--deadline`` from the job's start
    (whatever the setup before this took), and the grace a stopped cell gets: until the deadline's margin is half
    spent."""
    deadline = time.monotonic() + plan.stop_after_s if plan.stop_after_s else None
    if plan.stop_at:
        deadline = min(deadline or math.inf, time.monotonic() + plan.stop_at - time.time())
    grace = min(STOP_GRACE_S, plan.margin_s / 2) if plan.stop_at else STOP_GRACE_S
    share = Share(plan.parallel, plan.threads_per_cell, plan.workers_per_cell)
    ramp = Ramp(share.parallel, min(plan.cores, len(todo)), plan.measure_window_s) if plan.parallel_auto else None
    return Pool(campaign, plan, share, list(todo), deadline, grace, ramp)


def run_cells(campaign: Path, plan: Plan) -> int:
    stopping = Stopping()
    log.info("%s; pid %d on %s", plan.describe(), os.getpid(), socket.gethostname())
    states = plan_states(campaign, plan)
    todo = [state.cell for state in run_order(states)]
    log.info("%d cells finished or committed, %d to run", len(states) - len(todo), len(todo))
    if todo and not prepared(plan):
        return 1
    pool = new_pool(campaign, plan, todo)
    refused = False  # --mps on, and MPS did not start
    with contextlib.ExitStack() as daemon:
        try:
            mps = daemon.enter_context(mps_daemon(bool(plan.mps and todo), plan.mps_setting == "on", campaign / "mps"))
        except CampaignError as error:  # no cell runs; what a job carried in is still packed for the next one
            log.error("error: %s", error)
            pool.queue, mps, refused = [], None, True
        pool.run(stopping, mps)
    failed = summarise(pool, plan, stopping, mps is not None)
    if plan.pack:  # what the next job needs, before this one ends
        log.info("Packed: %s", write_pack(campaign, plan, Path(plan.pack), plan.part_size_mib))
    return 1 if failed or stopping.why or refused else 0


def summarise(pool: Pool, plan: Plan, stopping: Stopping, mps: bool) -> int:
    """Log the ended cells' summary and what the job measured of K; how many cells did not finish."""
    from ..sweep import summary

    # A cell whose configuration finished elsewhere since the plan was made is skipped by its run: it counts there.
    found, committed = finished_records(pool.ended, Path(plan.output_dir), Path(plan.runs_dir))
    finished_in = {**committed, **found}
    cells = [{"folder": cell.folder, "finished_in": str(finished_in.get(cell.config_hash, ""))} for cell in pool.ended]
    lines, failed = summary(cells) if pool.ended else ([], 0)
    log.info("Campaign %s", "\n".join(["stopped" if stopping.why else "done", *lines]))
    ramp = pool.ramp
    if ramp and ramp.rates:  # the K this job measured on its cells
        for k, (steps, seconds) in sorted(ramp.rates.items()):
            log.info("Measured: %s", record_throughput(plan, k, pool.ended, steps, seconds, mps))
    elif ramp and pool.training_since is not None:  # no window completed: what the whole campaign trained at its one K
        started = pool.first_step
        trained = sum((progress(Path(c.folder))[0] or 0) - started[c.index] for c in pool.ended if c.index in started)
        wall = time.monotonic() - pool.training_since
        log.info("Measured: %s", record_throughput(plan, ramp.k, pool.ended, trained, wall, mps))
    return failed
