"""Cells per hour against K, the cells run at once: the curve ``--parallel auto`` chooses K from, and how a job measures
K on its own cells (:class:`Ramp`).

The curve is ``results/cells_per_hour_<device>.{csv,png}``: a row per K (and per MPS setting, ``mps`` on or off)
measured by ``python -m lra.campaign measure`` or by an ``auto`` campaign on its real cells (:func:`record_throughput`,
a row per K it ran, replacing an earlier campaign's of the same K and MPS).
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import results
from ..rows import pyplot, read_rows, save_figure, write_rows
from .machine import Share
from .plan import CampaignError, Cell, Plan
from .state import progress

log = logging.getLogger("lra.campaign")

BEST_SHARE = 0.95  # --parallel auto: the smallest K within this share of the best measured cells per hour
FIRST_K = 2  # --parallel auto on a device with no measured curve yet: K until this job has measured it
RAMP_READ_S = 5.0  # --parallel auto: how often the campaign reads its cells' steps while it measures K
CAMPAIGN_ROW = "campaign of "  # the start of a campaign's own row's `cell`
CURVE_FIELDS = [
    "device",
    "parallel",
    "mps",  # "on": the K cells ran under CUDA MPS; "off" (or empty, a row measured before MPS was): they did not
    "threads_per_cell",
    "workers_per_cell",
    "steps",
    "paper_steps",
    "wall_s",
    "cell_steps_per_hour",
    "cells_per_hour",
    "speedup",
    "mean_steps_per_second",
    "max_peak_memory_mb",
    "finished",
    "cell",
    "commit",
]


def curve_path(results_dir: Path, device: str) -> Path:
    return Path(results_dir) / f"cells_per_hour_{device}.csv"


def curve_of(rows: list[dict[str, Any]], mps: bool) -> list[dict[str, Any]]:
    """The rows of a curve measured with (``mps``) or without MPS, a row from before MPS was measured being without."""
    setting = "on" if mps else "off"
    return [r for r in rows if (r.get("mps") or "off") == setting and str(r.get("cells_per_hour")) not in ("", "nan", "None")]


def rate_at(rows: list[dict[str, Any]], parallel: int, mps: bool) -> float | None:
    """The best cells per hour measured at K = ``parallel`` with (``mps``) or without MPS, None where not measured."""
    rates = [float(r["cells_per_hour"]) for r in curve_of(rows, mps) if int(r["parallel"]) == parallel]
    return max(rates, default=None)


def auto_parallel_with(rows: list[dict[str, Any]], mps: bool, machine_cores: int) -> int | None:
    """``--parallel auto``'s K for cells run with (``mps``) or without MPS: :func:`auto_parallel` of the curve measured
    so; with MPS and nothing measured with it yet, of the curve without it (the campaign's own row is then the first
    with it); None where there is no such curve."""
    for curve in (curve_of(rows, True), curve_of(rows, False)) if mps else (curve_of(rows, False),):
        if curve:
            return auto_parallel(curve, machine_cores)
    return None


def auto_parallel(rows: list[dict[str, Any]], machine_cores: int) -> int:
    """The K a campaign runs: the smallest K within :data:`BEST_SHARE` of the best measured cells per hour, unless
    the best is the largest K measured and still gained on the K before it (or is the only one): then twice it (at
    most a cell per core), so that each job measures a K that may be better until one stops gaining."""
    best = best_parallel(rows)
    rates = {int(r["parallel"]): float(r["cells_per_hour"]) for r in rows if str(r.get("cells_per_hour")) not in ("", "nan")}
    below = [k for k in rates if k < best]
    gained = not below or rates[best] > rates[max(below)] / BEST_SHARE
    return min(2 * best, machine_cores) if best == max(rates) and gained and 2 * best <= machine_cores else best


def best_parallel(rows: list[dict[str, Any]]) -> int:
    measured = [(int(r["parallel"]), float(r["cells_per_hour"])) for r in rows if str(r.get("cells_per_hour")) not in ("", "nan")]
    if not measured:
        raise CampaignError("the measured curve has no row with cells per hour")
    best = max(rate for _, rate in measured)
    return min(k for k, rate in measured if rate >= BEST_SHARE * best)


@dataclass
class Ramp:
    """``--parallel auto`` within a job: K measured on the job's own cells, and doubled while doubling gains.

    Once K cells run and each has logged a step since its launch (their start-up is over), the cells' steps are
    counted for ``window_s`` seconds, and longer until each of those K has logged a step again: the steps of every
    cell running in that time, replacements for ended cells included (their start-up is part of what K cells at a
    time cost). That is K's rate, steps per second of all cells together. Then K doubles, while the cells left can
    fill twice K and it is at most ``ceiling`` (a cell per core), and the new K is measured the same way; once a K
    gains less than 1 / :data:`BEST_SHARE` on the K before it, K settles at the smallest K within :data:`BEST_SHARE`
    of the best rate measured. A K that falls launches no cell until fewer run; none is stopped. Each measured K goes
    into the device's curve, which the next job starts from."""

    k: int
    ceiling: int
    window_s: float
    rates: dict[int, tuple[int, float]] = field(default_factory=dict)  # K -> (steps, seconds) of its window
    settled: bool = False
    started: float | None = None  # the window's start
    counted: dict[int, int] = field(default_factory=dict)  # each cell in the window -> its step when it came in
    first: dict[int, int] = field(default_factory=dict)  # the cells the window started with -> their steps then

    def observe(self, now: float, running: dict[int, int | None], launched_at: dict[int, int], queued: int, step_of) -> None:
        """``running``: each running cell's latest logged step (None before its first), ``launched_at``: each launched
        cell's step at its launch, ``queued``: cells not launched yet, ``step_of(index)``: a cell's latest step."""
        if self.settled:
            return
        if queued == 0 and len(running) < self.k:  # too few cells left to keep K running: nothing more to measure
            self.settled = True
            return
        if self.started is None:
            trained = all(step is not None and step > launched_at[index] for index, step in running.items())
            if len(running) == self.k and trained:
                self.started, self.counted, self.first = now, dict(running), dict(running)
            return
        for index in running:
            self.counted.setdefault(index, launched_at[index])  # launched within the window
        # Longer than window_s where a cell it started with has logged no step since: steps are logged every few
        # dozen, and a window must not end between two logs of every cell.
        if now - self.started < self.window_s or any((step_of(i) or 0) <= step for i, step in self.first.items()):
            return
        steps = sum(max(0, (step_of(index) or 0) - start) for index, start in self.counted.items())
        self.rates[self.k] = (steps, now - self.started)
        self.started, self.counted, self.first = None, {}, {}
        self.k = self.next_k(queued + len(running))

    def rate(self, k: int) -> float:
        steps, seconds = self.rates[k]
        return steps / seconds

    def next_k(self, cells_left: int) -> int:
        below = [k for k in self.rates if k < self.k]
        gained = not below or self.rate(self.k) >= self.rate(max(below)) / BEST_SHARE
        if gained and 2 * self.k <= min(self.ceiling, cells_left):
            return 2 * self.k
        self.settled = True
        best = max(self.rate(k) for k in self.rates)
        return min(k for k in self.rates if self.rate(k) >= BEST_SHARE * best)


def observe_cells(ramp: Ramp, now: float, running: list[Cell], ended: list[Cell], launched_at: dict[int, int], queued: int):
    """Give ``ramp`` the cells' steps, from their metrics.csv, and say in the log what it measured."""
    folders = {cell.index: Path(cell.folder) for cell in [*ended, *running]}

    def step_of(index: int) -> int | None:
        return progress(folders[index])[0]

    k = ramp.k
    ramp.observe(now, {cell.index: step_of(cell.index) for cell in running}, launched_at, queued, step_of)
    if k in ramp.rates:
        settled = f"settled at K = {ramp.k}" if ramp.settled else f"trying K = {ramp.k}"
        log.info("Measured K = %d: %.1f steps per second; %s", k, ramp.rate(k), settled)


def record_throughput(plan: Plan, parallel: int, ended: list[Cell], trained: int, wall: float, mps: bool) -> str:
    """Add what this campaign trained in ``wall`` seconds with ``parallel`` cells at a time, with (``mps``) or without
    MPS, to the device's cells-per-hour curve (``--parallel auto`` reads it, the next job too once packed), replacing
    an earlier campaign's row of the same K and MPS; the row, in words. Measured on the real cells, evaluations and
    the start-up of cells launched in that time included."""
    path = curve_path(Path(plan.runs_dir).parent, plan.device)
    paper_steps = statistics.mean(cell.max_steps for cell in ended) if ended else 1
    steps_per_hour = trained * 3600 / max(wall, 1e-9)
    share = Share.of(parallel, plan.cores)
    row = {
        "device": plan.device,
        "parallel": parallel,
        "mps": "on" if mps else "off",
        "threads_per_cell": share.threads,
        "workers_per_cell": share.workers,
        "steps": trained,
        "paper_steps": round(paper_steps),
        "wall_s": round(wall, 1),
        "cell_steps_per_hour": round(steps_per_hour),
        "cells_per_hour": round(steps_per_hour / paper_steps, 3),
        "speedup": "",
        "mean_steps_per_second": round(steps_per_hour / 3600 / parallel, 3),
        "max_peak_memory_mb": "",
        "finished": f"{len(ended)} cells ran",
        "cell": f"{CAMPAIGN_ROW}{len(plan.cells)} cells: {' '.join(plan.overrides)}",
        "commit": results.git_commit(),
    }
    kept = [
        {**r, "parallel": int(r["parallel"]), "mps": r.get("mps") or "off", "cells_per_hour": float(r["cells_per_hour"] or "nan")}
        for r in read_rows(path)
        if not (r["cell"].startswith(CAMPAIGN_ROW) and int(r["parallel"]) == parallel and (r.get("mps") or "off") == row["mps"])
    ]
    write_curve(sorted([*kept, row], key=lambda r: int(r["parallel"])), path)
    return (
        f"K = {parallel}{' with MPS' if mps else ''}: {trained} steps in {wall:.0f} s, {row['cells_per_hour']} cells "
        f"per hour, in {path}"
    )


def write_curve(rows: list[dict[str, Any]], path: Path) -> None:
    """The curve's CSV and PNG, each row's speedup over K = 1 without MPS where that was measured."""
    rates = [(int(r["parallel"]), r.get("mps") or "off", float(r["cells_per_hour"] or "nan")) for r in rows]
    base = next((rate for k, mps, rate in rates if k == 1 and mps == "off"), None)
    rows = [{**r, "speedup": round(rate / base, 2) if base else ""} for r, (_, _, rate) in zip(rows, rates)]
    write_rows(rows, path, CURVE_FIELDS)
    figure(rows, path.with_suffix(".png"))


def figure(rows: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for mps in ("off", "on"):
        curve = [r for r in rows if (r.get("mps") or "off") == mps]
        if curve:
            ks, rates = [int(r["parallel"]) for r in curve], [float(r["cells_per_hour"]) for r in curve]
            ax.plot(ks, rates, marker="o", label=f"MPS {mps}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("cells at once on one device (K)")
    ax.set_ylabel(f"cells of {rows[0]['paper_steps']} steps per hour")
    ax.set_title(f"{rows[0]['device']}: {rows[0]['cell']}", fontsize=7)
    if any(r.get("mps") == "on" for r in rows):
        ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)
