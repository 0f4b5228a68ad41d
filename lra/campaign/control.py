"""The campaign's commands: ``start`` (plan, then run detached or in the foreground), ``resume`` (``start`` with the
campaign's latest plan), ``status``, ``stop``, ``pack`` and ``unpack``. One campaign runs in a folder at a time: its
process holds the folder's lock (:mod:`lra.run_lock`), and a ``start`` holds the folder's start lock from its plan's
writing until the process it launched holds the folder.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from .. import config, results, run_lock
from ..rows import read_rows
from . import archive, carry, restore
from .machine import Share, cell_command, check_device, cores, device_slug, on_gpu
from .mps import mps_decision, mps_problem
from .plan import CELLS, LOG_FILE, START_LOCK_FILE, CampaignError, Plan, campaign_name, make_plan
from .scheduler import run
from .state import DONE, earlier_plans, left_out, plan_states, run_order, status_text
from .throughput import FIRST_K, auto_parallel_with, curve_of, curve_path


def chosen_parallel(text: str, mps_setting: str, trainer: Any, results_dir: Path, dry_run: bool = False) -> tuple[int, bool, str]:
    """``--parallel`` and ``--mps``: K, whether the cells share the GPU through CUDA MPS, and why (see
    :func:`lra.campaign.mps.mps_decision`). K is a whole number, or ``auto``: from the cells per hour measured on this
    device (``cells_per_hour_<device>.csv`` of ``results_dir``, written by ``measure`` and by every auto campaign) with
    the MPS setting the campaign runs with (:func:`lra.campaign.throughput.auto_parallel_with`); :data:`FIRST_K` where
    nothing is measured. ``--mps on`` where MPS cannot be used is refused, but for a ``dry_run`` of GPU cells on a
    machine without it."""
    problem = None if mps_setting == "off" else mps_problem(trainer)
    if mps_setting == "on" and problem and not (dry_run and on_gpu(trainer)):
        raise CampaignError(f"--mps on: {problem[0]}; {problem[1]}")
    path = curve_path(results_dir, device_slug(trainer))
    rows = read_rows(path)
    if text != "auto":
        try:
            parallel = int(text)
        except ValueError:
            raise CampaignError(f"--parallel must be a whole number of cells at once or auto, got {text!r}") from None
        Share.of(parallel, 1)  # k < 1: one message
        return (parallel, *mps_decision(mps_setting, problem, parallel, rows))
    possible = mps_setting != "off" and problem is None
    parallel = auto_parallel_with(rows, possible, cores())
    if parallel is None:
        without = " without MPS" if curve_of(rows, True) and not possible else ""  # only with MPS measured
        print(
            f"--parallel auto: nothing measured on this device{without} yet ({path}): K = {FIRST_K}, "
            "and this campaign measures it"
        )
        parallel = FIRST_K
    use, why = mps_decision(mps_setting, problem, parallel, rows)
    if possible and not use:  # K came from the curve with MPS, which this campaign runs without
        parallel = auto_parallel_with(rows, False, cores()) or FIRST_K
        why += f"; K = {parallel} from the curve without it"
    return parallel, use, why


def refuse_if_taken(campaign: Path, holding_start_lock: bool = False) -> None:
    """One message, exit status 1, where the campaign's folder is taken: a campaign runs there, or another ``start``
    is launching one (its plan would replace this one's, and only one of them could run). ``holding_start_lock``:
    this process holds the start lock (:func:`starting`), so only a running campaign takes the folder."""
    if holder := run_lock.holder(campaign):
        taken = f"a campaign is already running in {campaign} ({holder})"
    elif not holding_start_lock and (holder := run_lock.holder(campaign, START_LOCK_FILE)):
        taken = f"another python -m lra.campaign start is starting a campaign in {campaign} ({holder})"
    else:
        return
    raise CampaignError(
        f"{taken}: wait for it to end (python -m lra.campaign status --dir {campaign} --wait SECONDS), stop it "
        f"(python -m lra.campaign stop --dir {campaign}), or start this campaign in another folder (--dir)",
        1,
    )


@contextlib.contextmanager
def starting(campaign: Path) -> Iterator[None]:
    """Hold the campaign's start lock for the block (writing the plan, launching the campaign's process until it
    holds the folder): of two ``start`` in one folder at once, one starts and the other refuses at once, where both
    said "Started" while the second's plan replaced the first's and its process found the folder held and ended."""
    start_lock = contextlib.ExitStack()
    try:
        start_lock.enter_context(run_lock.held(campaign, START_LOCK_FILE))
    except run_lock.RunFolderBusy as busy:
        refuse_if_taken(campaign)  # names the other start
        raise CampaignError(str(busy), 1) from None  # it has ended since, or the filesystem has no locks
    with start_lock:
        refuse_if_taken(campaign, holding_start_lock=True)  # a campaign that took the folder while this one planned
        yield


def check_start_arguments(args: argparse.Namespace) -> None:
    if args.nice is not None and not 0 <= args.nice <= 19:
        raise CampaignError(f"--nice must be from 0 (the default priority) to 19 (the lowest), got {args.nice}")
    if args.measure_window <= 0:
        raise CampaignError(f"--measure-window must be a positive number of seconds, got {args.measure_window:g}")


def stop_time(args: argparse.Namespace) -> float | None:
    """``--deadline``: when the job ends, as a Unix time; the cells stop ``--margin`` seconds before it."""
    if args.deadline is None:
        return None
    if args.margin < 0 or args.deadline <= args.margin:
        raise CampaignError(
            f"--deadline {args.deadline:g} s leaves no time to train before its --margin of {args.margin:g} s "
            "(the time the cells take to save their state and the campaign to pack it): give a later deadline"
        )
    return time.time() + args.deadline - args.margin


def new_plan(args: argparse.Namespace) -> tuple[Plan, Any]:
    """The plan of ``start``'s arguments, and the cells' trainer config."""
    cells, datasets, trainer = make_plan(args.overrides)
    parallel, mps, mps_reason = chosen_parallel(args.parallel, args.mps, trainer, args.results, args.dry_run)
    share = Share.of(parallel, cores())
    plan = Plan(
        overrides=args.overrides,
        parallel=share.parallel,
        threads_per_cell=share.threads,
        workers_per_cell=share.workers,
        cores=cores(),
        cwd=str(Path.cwd()),
        output_dir=str(config.output_dir().absolute()),
        runs_dir=str(args.results.absolute() / "runs"),
        planned_at=results.now(),
        host=socket.gethostname(),
        datasets=datasets,
        cells=cells,
        parallel_auto=args.parallel == "auto",
        measure_window_s=args.measure_window,
        mps_setting=args.mps,
        mps=mps,
        mps_reason=mps_reason,
        device=device_slug(trainer),
        nice=args.nice if args.nice is not None else os.nice(0),
        stop_after_s=args.stop_after,
        stop_at=stop_time(args),
        pack=str(args.pack.absolute()) if args.pack else None,
        part_size_mib=args.part_size,
        margin_s=args.margin,
        dir=campaign_name(args.dir),
    )
    return plan, trainer


def left_out_problem(campaign: Path, plan: Plan) -> str | None:
    """What ``plan`` would lose if it replaced the campaign's earlier plans (:func:`lra.campaign.state.left_out`): the
    unfinished cells it leaves out, and the command that starts the plan they belong to again; None where nothing."""
    cells = left_out(campaign, plan)
    if not cells:
        return None
    earlier = cells[0][0]
    command = ["python", "-m", "lra.campaign", "start", "--dir", campaign_name(campaign)]
    command += ["--nice", str(earlier.nice)] if earlier.nice else []
    named = ", ".join(f"{cell.name} (step {step} of {cell.max_steps})" for _, cell, step in cells)
    return (
        f"this plan leaves out unfinished cells of the campaign's earlier plan: {named}. A pack carries only the "
        f"running plan's cells, so their training would stay behind on this machine. Start the plan they belong to "
        f"again (its finished cells are skipped): {shlex.join(command + earlier.overrides)}; or add --replace to "
        "start this plan anyway (their run folders stay as they are)"
    )


def dry_run(campaign: Path, plan: Plan, trainer: Any, problem: str | None) -> int:
    """What ``start`` would run: the plan, each cell's state and command, and what it would refuse (``problem``: the
    earlier plan's unfinished cells it leaves out) or this machine would."""
    print(plan.describe())
    share = Share(plan.parallel, plan.threads_per_cell, plan.workers_per_cell)
    states = plan_states(campaign, plan, started=False)  # as start leaves the folder
    for state in [state for state in states if state.status in DONE] + run_order(states):  # in the order start runs them
        print(f"  {state.status:<11} {state.cell.name}  {' '.join(cell_command(state.cell, share)[0][3:])}")
    if problem:
        print(f"note: start refuses this plan: {problem}")
    if plan.mps_setting == "on" and not plan.mps:
        print(f"note: {plan.mps_reason}; start --mps on refuses these cells on this machine")
    if on_gpu(trainer):
        with contextlib.suppress(CampaignError):
            check_device(trainer)
            return 0
        print("note: no CUDA GPU is visible here; start refuses these cells on this machine")
    return 0


def start(args: argparse.Namespace) -> int:
    campaign = args.dir.absolute()
    check_start_arguments(args)
    refuse_if_taken(campaign)  # before planning, which takes a while
    plan, trainer = new_plan(args)
    problem = None if args.replace else left_out_problem(campaign, plan)
    if args.dry_run:
        return dry_run(campaign, plan, trainer, problem)
    if problem:
        raise CampaignError(problem, 1)
    check_device(trainer)
    with starting(campaign):
        (campaign / CELLS).mkdir(exist_ok=True)
        for old in (campaign / CELLS).iterdir():  # the previous plan's cells
            old.unlink()
        plan.write(campaign)
        if args.foreground:
            return run(campaign)
        daemon = detach(campaign)
    if daemon.poll() not in (None, 0):
        tail = (campaign / LOG_FILE).read_text(errors="replace").splitlines()[-15:]
        raise CampaignError("the campaign stopped at once:\n" + "\n".join(tail), 1)
    print(plan.describe())
    print(f"Started in the background (pid {daemon.pid}); its log: {campaign / LOG_FILE}")
    print(f"Progress: python -m lra.campaign status --dir {campaign}")
    return 0


def detach(campaign: Path) -> subprocess.Popen:
    """Launch the campaign's process detached (``setsid``), and wait (up to a minute) until it holds the folder."""
    with open(campaign / LOG_FILE, "a") as logfile:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "lra.campaign", "run", "--dir", str(campaign)],
            stdin=subprocess.DEVNULL,
            stdout=logfile,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives this command, its terminal and its process group
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and daemon.poll() is None and not run_lock.holder(campaign):
        time.sleep(0.2)
    return daemon


def resume(args: argparse.Namespace) -> int:
    """``start`` with the campaign's latest plan (:func:`lra.campaign.state.earlier_plans`: the one in its folder, or
    one ``unpack`` read back from its archive on this machine): its sweep, K, MPS setting and niceness, so a campaign
    carried from machine to machine goes on without its command line being typed again. The job's own settings
    (``--deadline``, ``--pack``, ...) are this command's."""
    campaign = args.dir.absolute()
    refuse_if_taken(campaign)  # before saying what it would resume
    plans = earlier_plans(campaign)
    if not plans:
        raise CampaignError(
            f"no campaign to resume in {campaign_name(campaign)}: no plan in the folder, and no archive unpacked here "
            "names it; unpack the campaign's archive first (python -m lra.campaign unpack FILE), or start one with "
            "python -m lra.campaign start OVERRIDES...",
            1,
        )
    latest = max(plans, key=lambda plan: datetime.fromisoformat(plan.planned_at))
    args.overrides = latest.overrides
    args.parallel = "auto" if latest.parallel_auto else str(latest.parallel)
    args.measure_window, args.mps, args.nice, args.replace = latest.measure_window_s, latest.mps_setting, latest.nice, False
    print(f"Resuming the plan of {latest.planned_at} on {latest.host}")
    return start(args)


def status(args: argparse.Namespace) -> int:
    campaign = args.dir.absolute()
    plan = Plan.read(campaign)
    deadline = time.monotonic() + (args.wait or 0)
    last_line = 0.0
    while args.wait and run_lock.holder(campaign) and time.monotonic() < deadline:
        if time.monotonic() - last_line >= args.every:
            states = plan_states(campaign, plan)
            counts = ", ".join(
                f"{sum(s.status == n for s in states)} {n}" for n in ("finished", "committed", "running", "pending")
            )
            print(f"{datetime.now().strftime('%H:%M:%S')} {counts}", flush=True)
            last_line = time.monotonic()
        time.sleep(min(2.0, max(0.1, deadline - time.monotonic())))
    print(status_text(campaign, plan))
    return 0


def stop(args: argparse.Namespace) -> int:
    campaign = args.dir.absolute()
    holder = run_lock.holder(campaign)
    if not holder:
        print(f"No campaign is running in {campaign}")
        return 0
    match = re.match(r"pid (\d+) on (\S+)", holder)
    if not match or match.group(2) != socket.gethostname():
        raise CampaignError(f"the campaign in {campaign} runs on another machine or cannot be named ({holder})", 1)
    os.kill(int(match.group(1)), signal.SIGTERM)
    print(f"Stopping the campaign (pid {match.group(1)}): its running cells save their checkpoint; start resumes them")
    if args.wait is None:
        return 0
    deadline = time.monotonic() + args.wait
    while run_lock.holder(campaign) and time.monotonic() < deadline:
        time.sleep(0.5)
    if run_lock.holder(campaign):
        raise CampaignError(
            f"the campaign has not ended within {args.wait:g} s (its cells may still be saving their state): wait longer "
            f"(python -m lra.campaign status --dir {campaign} --wait SECONDS)",
            1,
        )
    print("The campaign has ended")
    return 0


def pack(args: argparse.Namespace) -> int:
    campaign = args.dir.absolute()
    plan = Plan.read(campaign)
    out = (args.out or campaign / "campaign_runs.tar.gz").absolute()
    print(carry.write_pack(campaign, plan, out, args.part_size))
    print(f"Into a checkout: python -m lra.campaign unpack {out.name}")
    return 0


def unpack(args: argparse.Namespace) -> int:
    if args.missing_ok and not archive.exists(args.archive):
        print(f"Nothing to unpack: no {args.archive} (nor its parts or manifest); start begins with nothing carried")
        return 0
    restore.unpack(args.archive, args.remove)
    return 0
