"""The command line of ``python -m lra.campaign`` (the package's docstring says what each command does)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .control import pack, resume, start, status, stop, unpack
from .measure import measure
from .mps import MPS_SETTINGS
from .plan import DEADLINE_MARGIN_S, MEASURE_WINDOW_S, PART_SIZE_MIB, CampaignError, default_dir
from .scheduler import run

COMMANDS = {"start": start, "resume": resume, "status": status, "stop": stop, "pack": pack, "unpack": unpack, "measure": measure}


def with_dir(sub: argparse.ArgumentParser) -> argparse.ArgumentParser:
    sub.add_argument("--dir", type=Path, default=default_dir(), help="the campaign's folder (default: <output folder>/campaign)")
    return sub


def plan_arguments(begin: argparse.ArgumentParser) -> None:
    """``start``'s: the plan, which ``resume`` takes from the campaign's latest."""
    begin.add_argument(
        "--parallel", default="1", help="cells at once (K), or auto: from the measured cells_per_hour_<device>.csv"
    )
    begin.add_argument(
        "--measure-window",
        type=float,
        default=MEASURE_WINDOW_S,
        metavar="S",
        help=f"with --parallel auto: the seconds of training over which the job measures each K (default {MEASURE_WINDOW_S:g})",
    )
    begin.add_argument(
        "--mps",
        choices=MPS_SETTINGS,
        default="auto",
        help="run the cells under CUDA MPS: auto (on a CUDA GPU, K > 1, nvidia-cuda-mps-control on PATH, unless measured "
        "slower at this K), on, off",
    )
    begin.add_argument(
        "--nice",
        type=int,
        default=None,
        metavar="N",
        help="run the campaign and its cells at niceness N (19: only on what other work leaves idle); default: the "
        "niceness start runs at (nice -n 19 python -m lra.campaign start ... is the same as --nice 19)",
    )
    begin.add_argument(
        "--replace",
        action="store_true",
        help="start this plan even where it leaves out unfinished cells of the campaign's earlier plan (a pack then "
        "carries this plan's cells only)",
    )
    begin.add_argument("overrides", nargs="*", help="the sweep, as python -m lra.train -m takes it")


def job_arguments(begin: argparse.ArgumentParser) -> None:
    """``start``'s and ``resume``'s: this job's end, its pack, where the committed results are."""
    begin.add_argument("--results", type=Path, default=Path("results"), help="the committed results (runs/ is skipped)")
    begin.add_argument("--foreground", action="store_true", help="run in this process instead of in the background")
    begin.add_argument("--stop-after", type=float, default=None, metavar="S", help="after S seconds, interrupt the running cells")
    begin.add_argument(
        "--deadline",
        type=float,
        default=None,
        metavar="S",
        help="the job ends S seconds from now: the cells are stopped --margin seconds before it and, with --pack, packed",
    )
    begin.add_argument(
        "--margin",
        type=float,
        default=DEADLINE_MARGIN_S,
        metavar="S",
        help=f"with --deadline: time for the cells to save their state and for the pack (default {DEADLINE_MARGIN_S:g} s)",
    )
    begin.add_argument("--pack", type=Path, default=None, metavar="FILE", help="when the campaign ends, pack it into FILE")
    begin.add_argument(
        "--part-size", type=float, default=PART_SIZE_MIB, metavar="MIB", help="with --pack: the largest file it writes"
    )
    begin.add_argument("--dry-run", action="store_true", help="list the cells and what would run, and exit")


def carry_arguments(commands: argparse._SubParsersAction) -> None:
    wrap = with_dir(commands.add_parser("pack", help="the finished cells' committed records and curves, in one tar.gz"))
    wrap.add_argument("--out", type=Path, default=None, help="the archive (default: <dir>/campaign_runs.tar.gz)")
    wrap.add_argument(
        "--part-size",
        type=float,
        default=PART_SIZE_MIB,
        metavar="MIB",
        help=f"an archive larger than this is written as FILE.part000, FILE.part001, ... (default {PART_SIZE_MIB:g})",
    )
    unwrap = commands.add_parser(
        "unpack", help="a packed archive's records and curves into results/, its unfinished cells into their run folders"
    )
    unwrap.add_argument("archive", type=Path, help="the archive, or any of its parts")
    unwrap.add_argument("--remove", action="store_true", help="delete the archive (all its parts) once unpacked")
    unwrap.add_argument(
        "--missing-ok",
        action="store_true",
        help="where there is no archive (a first job: nothing carried yet), say so and exit 0",
    )


def measure_arguments(curve: argparse.ArgumentParser) -> None:
    curve.add_argument("--parallel", required=True, help="the values of K, separated by commas (1,2,4,8)")
    curve.add_argument(
        "--mps", default="off", help="off, on, or off,on: each K without and with CUDA MPS (K = 1 without only; default off)"
    )
    curve.add_argument("--steps", type=int, default=200, help="steps of each copy (default 200)")
    curve.add_argument("--out", type=Path, default=Path("results"), help="where the curve goes (default: results/)")
    curve.add_argument("--dry-run", action="store_true", help="say what would be measured, and exit")
    curve.add_argument("overrides", nargs="*", help="the cell, as python -m lra.train takes it (a sweep: its first cell)")


def parser() -> argparse.ArgumentParser:
    overview = sys.modules[__package__].__doc__  # the package's: what a campaign is, once
    main = argparse.ArgumentParser(prog="python -m lra.campaign", description=overview.split("\n\n")[0])
    commands = main.add_subparsers(dest="command", required=True)
    begin = with_dir(commands.add_parser("start", help="run a sweep's cells K at a time, in the background"))
    plan_arguments(begin)
    job_arguments(begin)
    job_arguments(
        with_dir(commands.add_parser("resume", help="start the campaign's latest plan again (in its folder, or unpacked here)"))
    )
    with_dir(commands.add_parser("run", help="what start runs in the background: the planned campaign, in this process"))
    look = with_dir(
        commands.add_parser("status", help="each cell: finished, committed, running (step, pace, time left), failed, pending")
    )
    look.add_argument("--wait", type=float, default=None, metavar="S", help="first wait up to S seconds for the campaign to end")
    look.add_argument("--every", type=float, default=60, metavar="S", help="while waiting, a line of counts every S seconds")
    halt = with_dir(commands.add_parser("stop", help="interrupt the campaign: running cells save their checkpoint"))
    halt.add_argument(
        "--wait", type=float, default=None, metavar="S", help="wait up to S seconds for it to end (exit status 1 if it has not)"
    )
    carry_arguments(commands)
    measure_arguments(commands.add_parser("measure", help="cells per hour against K: cells_per_hour_<device>.{csv,png}"))
    return main


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "run":
            return run(args.dir.absolute())
        return COMMANDS[args.command](args)
    except CampaignError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.status
    except BrokenPipeError:  # status | head: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
        return 0
