"""``python -m lra.campaign measure``: cells per hour against K, the cells run at once on one device.

K concurrent copies of one cell (the first of the plan; distinct seeds from :data:`MEASURE_SEED`, a scratch output
folder, ``--steps`` steps with the protocol's evaluation schedule) for each K of ``--parallel``, without and with MPS
as ``--mps`` asks, into ``cells_per_hour_<device>.{csv,png}`` (:mod:`lra.campaign.throughput`).
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .. import config, results
from .machine import Share, cell_command, check_device, cores, device_slug, on_gpu
from .mps import MPS_CONTROL, mps_daemon, mps_problem, mps_running
from .plan import CampaignError, Cell, make_plan
from .scheduler import prepare_data
from .throughput import best_parallel, curve_of, curve_path, write_curve

MEASURE_SEED = 1000  # measure's copies of a cell: seeds never swept, so nothing is skipped or overwritten


def measured_settings(args: argparse.Namespace) -> list[tuple[int, bool]]:
    """The (K, with MPS) pairs ``--parallel`` and ``--mps`` ask for; one message for a bad value."""
    try:
        ks = [int(value) for value in args.parallel.split(",") if value.strip()]
    except ValueError:
        raise CampaignError(f"--parallel takes whole numbers separated by commas, got {args.parallel!r}") from None
    for k in ks or [0]:
        Share.of(k, 1)
    settings = [value.strip() for value in args.mps.split(",") if value.strip()]
    if not settings or set(settings) - {"off", "on"}:
        raise CampaignError(f"--mps takes off, on or both separated by a comma (off,on), got {args.mps!r}")
    if args.steps < 1:
        raise CampaignError(f"--steps must be at least 1, got {args.steps}")
    # One copy has nothing to share: K = 1 is measured without MPS only.
    runs = [(k, mps == "on") for k in ks for mps in dict.fromkeys(settings) if k > 1 or mps == "off"]
    if not runs:
        raise CampaignError("--mps on measures K above 1 only (one copy has nothing to share): add a K above 1, or off")
    return runs


def check_machine(runs: list[tuple[int, bool]], trainer: Any, dry_run: bool) -> None:
    """Refuse, with one message, what this machine cannot measure: MPS where it cannot run, a GPU where none is, or
    cells without MPS while a daemon already running would take them all."""
    if any(mps for _, mps in runs) and (problem := mps_problem(trainer)):
        if not (dry_run and on_gpu(trainer)):
            raise CampaignError(f"--mps on: {problem[0]}; {problem[1]}")
        print(f"note: {problem[0]}; measure --mps on refuses this cell on this machine")
    if dry_run:
        return
    check_device(trainer)
    if any(not mps for _, mps in runs) and (running := mps_running()):
        raise CampaignError(
            f"MPS is already running for this user ({running}): every copy would run under it, so without it cannot be "
            f"measured; quit it (echo quit | {MPS_CONTROL}) or measure --mps on only"
        )


def measure(args: argparse.Namespace) -> int:
    runs = measured_settings(args)
    cells, datasets, trainer = make_plan(args.overrides)
    check_machine(runs, trainer, args.dry_run)
    cell = cells[0]
    scratch = config.output_dir().absolute() / "campaign_measure" / time.strftime("%Y%m%d-%H%M%S")
    measured = ", ".join(f"{k}{' with MPS' if mps else ''}" for k, mps in runs)
    print(
        f"Measuring {cell.name} ({len(cells)} cells in the plan; the first), {args.steps} of its {cell.max_steps} steps, "
        f"K = {measured} ({cores()} cores); runs in {scratch}",
        flush=True,
    )
    if args.dry_run:
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    prepare_data(datasets)
    path = curve_path(args.out, device_slug(trainer))
    rows = []
    for k, mps in runs:
        rows.append(measure_k(cell, k, mps, args.steps, scratch, device_slug(trainer)))
        print(
            f"K={k}{' with MPS' if mps else ''}: {rows[-1]['finished']} finished in {rows[-1]['wall_s']:.1f} s, "
            f"{rows[-1]['cells_per_hour']} cells of {cell.max_steps} steps per hour",
            flush=True,
        )
        write_curve(rows, path)  # after each K: a command stopped by its time limit keeps what it measured
    chosen = [
        f"{best_parallel(curve)} cells at a time{' with MPS' if mps else ''}"
        for mps in (False, True)
        if (curve := curve_of(rows, mps)) and any(float(r["cells_per_hour"]) for r in curve)
    ]
    print(f"wrote {path}" + (f"; start --parallel auto would run {' or '.join(chosen)}" if chosen else ""))
    return 0 if all(row["finished"] == f"{row['parallel']}/{row['parallel']}" for row in rows) else 1


def measure_k(cell: Cell, k: int, mps: bool, steps: int, scratch: Path, device: str) -> dict[str, Any]:
    """K copies of ``cell`` at once, with (``mps``) or without MPS, for ``steps`` steps each: the curve's row."""
    share = Share.of(k, cores())
    folder = scratch / (f"k{k}-mps" if mps else f"k{k}")
    folder.mkdir(parents=True, exist_ok=True)
    with mps_daemon(mps, True, folder / "mps") as mps_env:
        start_time = time.monotonic()
        processes = [start_copy(cell, copy, steps, folder, scratch, share, mps_env) for copy in range(k)]
        for process, output in processes:
            process.wait()
            output.close()
        wall = time.monotonic() - start_time
    records = [results.read(path) for path in sorted(folder.rglob(results.RESULTS_FILE))]
    done = [r for r in records if r and r.status == "finished"]
    steps_per_hour = len(done) * steps * 3600 / wall
    return {
        "device": device,
        "parallel": k,
        "mps": "on" if mps else "off",
        "threads_per_cell": share.threads,
        "workers_per_cell": min(cell.num_workers, share.workers),
        "steps": steps,
        "paper_steps": cell.max_steps,
        "wall_s": round(wall, 1),
        "cell_steps_per_hour": round(steps_per_hour),
        "cells_per_hour": round(steps_per_hour / cell.max_steps, 3),
        "speedup": "",
        "mean_steps_per_second": round(sum(r.steps_per_second or 0 for r in done) / max(1, len(done)), 3),
        "max_peak_memory_mb": max((r.peak_memory_mb or 0 for r in done), default=0),
        "finished": f"{len(done)}/{k}",
        "cell": " ".join(cell.overrides),
        "commit": results.git_commit(),
    }


def start_copy(cell: Cell, copy: int, steps: int, folder: Path, scratch: Path, share: Share, mps_env: dict[str, str] | None):
    """Copy ``copy`` of ``cell``, started: its seed, its steps and its scratch folders; the process and its log file."""
    keyed = {o.split("=", 1)[0]: o for o in cell.overrides}
    changes = {
        "seed": MEASURE_SEED + copy,
        "task.protocol.max_steps": steps,
        "paths.output_dir": folder,
        "paths.runs_dir": scratch / "no_runs",
    }
    keyed.update({key: f"{key}={value}" for key, value in changes.items()})
    copy_cell = Cell(**{**asdict(cell), "overrides": list(keyed.values())})
    command, env = cell_command(copy_cell, share, mps_env)
    output = open(folder / f"copy{copy}.log", "w")  # open while the copy runs
    return subprocess.Popen(command, env={**os.environ, **env}, stdout=output, stderr=subprocess.STDOUT), output
