"""A sweep's cells k at a time on one machine, in the background, and its finished runs back in one small archive.

    python -m lra.campaign start [--parallel K|auto [--measure-window S]] [--mps auto|on|off] [--dry-run] [--foreground]
        [--stop-after S] OVERRIDES...
    python -m lra.campaign status [--wait S]
    python -m lra.campaign stop
    python -m lra.campaign pack [--out FILE]
    python -m lra.campaign unpack ARCHIVE
    python -m lra.campaign measure --parallel 1,2,4,8 [--mps off,on] [--steps N] [--out results] OVERRIDES...

``start`` takes the overrides of a sweep (``python -m lra.train -m OVERRIDES``: the experiment's
``hydra.sweeper.params`` crossed with the command line's comma lists, as Hydra's basic sweeper crosses
them) and runs every cell as its own ``python -m lra.train <cell's overrides>``, K at a time, all on the
machine's one GPU (or its CPU). Each cell is an ordinary run: its folder is the one the sweep would
give it, it holds its folder's lock (:mod:`lra.run_lock`), it is skipped where its configuration is
finished (in its folder, elsewhere under the output folder, or committed under ``results/runs/``) and
resumes from its ``last.ckpt`` where it was interrupted. The K processes divide the machine: each gets
``cores // K`` threads (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``) and at most ``cores // K - 1`` data-loader
workers (``num_workers``, never more than the configuration's). Before the first cell, the data of every
cell is generated and prepared once (under its lock), so K cells do not all wait for it.

``--mps``: K cells on one GPU take turns on it (time slices) unless the CUDA MPS control daemon
(``nvidia-cuda-mps-control``, installed with the NVIDIA driver) lets their kernels run at once. ``auto`` (the
default) runs the cells under it where they are on a CUDA GPU, K > 1 and the daemon's command is on PATH, unless
the device's curve measured this K with and without it and without was faster; ``on`` requires it, ``off`` never
uses it. The campaign starts the daemon before its first cell and quits it at its end (:func:`mps_daemon`); the
plan, ``status`` and the log say whether it is used and why.

``start`` returns at once: the campaign runs detached (`setsid`), writing its log into
``<dir>/campaign.log`` (``--foreground`` runs it in place). One campaign runs in a folder at a time: a
``start`` where one runs, or where another ``start`` is launching one, refuses at once, naming its pid.
The campaign's folder (``--dir``, default
``<output folder>/campaign``) holds its plan (``campaign.json``), the log, and each launched cell's
console output (``cells/<n>.log``). ``status`` lists the cells (finished, committed, running with their
step, failed, interrupted, pending) and exits 0; ``--wait S`` waits up to S seconds for the campaign
to end first. ``stop`` interrupts it: the running cells save ``last.ckpt`` and a later ``start``
resumes them. ``pack`` writes the finished cells' records in their committed form
(``results/runs/<name>.json``, as ``lra.table --collect`` writes them) with each one's learning curve
(``results/runs/curves/<name>.csv``, its ``metrics.csv``) into one tar.gz, with the campaign's status
and log; ``unpack`` puts the records and curves into ``results/`` of the current folder (checking every
member), so that the next ``start`` skips them (and ``lra.table --committed`` tabulates them).

``measure`` times K concurrent copies of one cell (the first of the plan; distinct seeds from 1000, a
scratch output folder, ``--steps`` steps with the protocol's evaluation schedule) for each K of
``--parallel`` and writes ``cells_per_hour_<device>.{csv,png}``: cells per hour against K, the number
``start --parallel auto`` chooses K from. ``--mps off,on`` measures each K without and with MPS (K = 1 without
only: one copy has nothing to share), the daemon started around each measurement with it. A ``start --parallel
auto`` campaign measures K on its own cells too, and doubles it within the job while that gains (:class:`Ramp`).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import itertools
import json
import logging
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any

from . import config, run_lock, signals
from .run import checked_and_hashed

log = logging.getLogger("lra.campaign")

PLAN_FILE = "campaign.json"
LOG_FILE = "campaign.log"
START_LOCK_FILE = "start.lock"  # held by a start from its plan's writing until its campaign's process holds the folder
CELLS = "cells"  # <dir>/cells/<n>.log: a launched cell's console output; <n>.exit: its exit status
CURVES = "curves"  # results/runs/curves/<run file name>.csv: a packed cell's metrics.csv
MEASURE_SEED = 1000  # measure's copies of a cell: seeds never swept, so nothing is skipped or overwritten
BEST_SHARE = 0.95  # --parallel auto: the smallest K within this share of the best measured cells per hour
FIRST_K = 2  # --parallel auto on a device with no measured curve yet: K until this job has measured it
MEASURE_WINDOW_S = 120.0  # --parallel auto: the seconds of training over which a job measures each K it runs
RAMP_READ_S = 5.0  # --parallel auto: how often the campaign reads its cells' steps while it measures K
STOP_GRACE_S = 300  # how long a stopped cell may take to save its checkpoint before it is killed
STATE = "state"  # an archive's unfinished cells: state/<cell folder under the output folder>/<file>
PART_SIZE_MIB = 16.0  # pack: an archive larger than this is cut into parts of at most this size
DEADLINE_MARGIN_S = 90.0  # --deadline: the cells stop this long before it, to save their state and be packed
MPS_CONTROL = "nvidia-cuda-mps-control"  # CUDA MPS's control daemon and its client, installed with the NVIDIA driver
MPS_SETTINGS = ("auto", "on", "off")
MPS_DEFAULT_PIPE = Path("/tmp/nvidia-mps")  # where CUDA processes look for MPS when CUDA_MPS_PIPE_DIRECTORY is not set
MPS_START_S = 30.0  # how long a started MPS daemon may take to open its control socket
MPS_QUIT_S = 60.0  # how long its quit may take
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


class CampaignError(Exception):
    """Bad input or a state the command cannot act on: one message, exit status 2 (1 for a campaign's own state)."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


# ---- the plan: a sweep's cells ------------------------------------------------------------------


@dataclass
class Cell:
    index: int
    name: str  # "task / row / seed N"
    overrides: list[str]  # what `python -m lra.train` runs it with
    folder: str  # its run folder, absolute
    config_hash: str  # its run's (lra.run.checked_and_hashed): how a finished or committed run of it is recognised
    task: str
    max_steps: int
    num_workers: int  # the configuration's; a campaign gives a cell at most this many


def default_dir() -> Path:
    return Path(os.environ.get("LRA_OUTPUT_DIR", "outputs")) / "campaign"


def experiments() -> list[str]:
    folder = resources.files(config.CONFIG_MODULE) / "experiment"
    return sorted(entry.name.removesuffix(".yaml") for entry in folder.iterdir() if entry.name.endswith(".yaml"))


def check_overrides(overrides: list[str]) -> None:
    """One message for what Hydra would refuse in its own words: an unknown experiment or attention, a sweep flag."""
    for override in overrides:
        if override in ("-m", "--multirun"):
            raise CampaignError("a campaign is a sweep already: leave out -m")
        key, _, value = override.partition("=")
        if key.lstrip("+") == "experiment":
            unknown = [name for name in value.split(",") if name not in experiments()]
            if unknown:
                raise CampaignError(f"experiment={unknown[0]} is not an experiment; the choices: {', '.join(experiments())}")
            if "," in value:
                raise CampaignError("a campaign runs one experiment; start one campaign per experiment")
    if problem := config.unknown_option(overrides):
        raise CampaignError(problem)


def sweep_cells(overrides: list[str]) -> list[list[str]]:
    """The overrides of each cell of ``python -m lra.train -m OVERRIDES``: the experiment's ``hydra.sweeper.params``
    first, then the command line's overrides (a key given on both: the command line's, in the params' place), crossed
    as Hydra's basic sweeper crosses them; then ordered by seed, the sweep's order within a seed.

    Hydra parses the overrides (its public ``OverridesParser``); the crossing is written here, as the basic sweeper
    does it, because Hydra offers it only in its private ``hydra._internal``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    parser = OverridesParser.create()
    plain = [o.input_line for o in parser.parse_overrides(overrides) if not o.is_sweep_override()]
    master = compose(plain)
    params = master.hydra.sweeper.get("params")
    params = OmegaConf.to_container(params, resolve=True) if params else {}
    arguments = [f"{key}={value}" for key, value in params.items()] + list(overrides)
    choices: dict[str, list[str]] = {}  # each key's settings, in the order its key first appears; a later one replaces
    for override in parser.parse_overrides(arguments):
        key = override.get_key_element()
        if not override.is_sweep_override():
            choices[key] = [f"{key}={override.get_value_element_as_str()}"]
        elif override.is_discrete_sweep():
            choices[key] = [f"{key}={value}" for value in override.sweep_string_iterator()]
        else:
            raise CampaignError(f"{override.input_line}: a campaign sweeps lists and ranges, not intervals; list the values")
    cells = [list(cell) for cell in itertools.product(*choices.values())]
    return sorted(cells, key=seed_of)  # stable: every row of the first seed, then the next seed's


def seed_of(overrides: list[str]) -> tuple[int, str]:
    """A cell's seed, for ordering (a campaign cut short by its time then has whole seeds): 0 for none given."""
    text = next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == "seed"), "0")
    return (int(text), "") if text.lstrip("-").isdigit() else (0, text)


def compose(overrides: list[str]):
    try:
        return config.compose(overrides, return_hydra_config=True)
    except Exception as error:  # Hydra's composition errors: one line, not a traceback
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CampaignError(f"the overrides {' '.join(overrides)} do not compose: {first}") from None


def plan_cell(index: int, overrides: list[str]) -> tuple[Cell, dict[str, Any]]:
    """The cell and its resolved ``task.data`` (for preparing its data once), composed as ``lra.train`` composes it."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    cfg = compose(overrides)
    HydraConfig.instance().set_config(cfg)  # the run folder's ${hydra:...} interpolations
    folder = Path(str(cfg.hydra.run.dir)).absolute()
    choices = cfg.hydra.runtime.choices
    row = config.row_name(choices["attention"], cfg.hydra.overrides.task)
    try:
        checked, digest = checked_and_hashed(cfg)
    except ValueError as error:
        raise CampaignError(f"cell {' '.join(overrides)}: {error}") from None
    cell = Cell(
        index=index,
        name=f"{cfg.task.name} / {row} / seed {cfg.seed}",
        overrides=list(overrides),
        folder=str(folder),
        config_hash=digest,
        task=str(cfg.task.name),
        max_steps=int(checked.task.protocol.max_steps),
        num_workers=int(cfg.num_workers),
    )
    return cell, {"task": cell.task, "data": OmegaConf.to_container(cfg.task.data, resolve=True)}


def make_plan(overrides: list[str]) -> tuple[list[Cell], list[dict[str, Any]], Any]:
    """Every cell of the sweep, the distinct data they train on, and the first cell's trainer config."""
    check_overrides(overrides)
    cells, datasets = [], []
    for index, cell_overrides in enumerate(sweep_cells(overrides)):
        cell, data = plan_cell(index, cell_overrides)
        cells.append(cell)
        if data not in datasets:
            datasets.append(data)
    folders = [cell.folder for cell in cells]
    if len(set(folders)) < len(folders):
        raise CampaignError(
            "two cells of this sweep would share a run folder; give each setting that differs on the command line"
        )
    trainer = compose(cells[0].overrides).trainer
    return cells, datasets, trainer


# ---- dividing the machine ------------------------------------------------------------------------


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass(frozen=True)
class Share:
    """What each of K concurrent cells gets of a machine's cores."""

    parallel: int
    threads: int  # torch's intra-op threads (OMP_NUM_THREADS)
    workers: int  # data-loader worker processes, at most

    @classmethod
    def of(cls, parallel: int, machine_cores: int) -> Share:
        if parallel < 1:
            raise CampaignError(f"--parallel must be at least 1, got {parallel}")
        per_cell = max(1, machine_cores // parallel)
        return cls(parallel, per_cell, max(0, per_cell - 1))  # a core for the cell's own process


def cell_command(cell: Cell, share: Share, mps: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The command and environment a cell runs with: ``lra.train`` on its overrides, its share of the cores, and
    ``mps``, the variables that connect it to the campaign's MPS daemon (:func:`mps_daemon`)."""
    extra = {"num_workers": min(cell.num_workers, share.workers), "trainer.enable_progress_bar": "false"}
    overrides = [o for o in cell.overrides if o.split("=", 1)[0] not in extra]  # the campaign's value, not twice
    command = [sys.executable, "-m", "lra.train", *overrides, *(f"{key}={value}" for key, value in extra.items())]
    threads = str(share.threads)
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "PYTHONUNBUFFERED": "1", **(mps or {})}
    return command, env


def on_gpu(trainer: Any) -> bool:
    return str(trainer.accelerator) in ("gpu", "cuda")


def device_slug(trainer: Any) -> str:
    """The device a trainer config runs on, for file names: ``cuda_h200``, ``cpu``."""
    if not on_gpu(trainer):
        return "cpu"
    import torch

    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "gpu"
    return "cuda_" + re.sub(r"[^a-z0-9]+", "_", name.lower().replace("nvidia", "")).strip("_")


def check_device(trainer: Any) -> None:
    if on_gpu(trainer):
        import torch

        if not torch.cuda.is_available():
            raise CampaignError(
                "the cells ask for a GPU (trainer.accelerator=gpu) but no CUDA GPU is visible (torch.cuda.is_available() is "
                "False); leave out trainer=gpu to run them on the CPU"
            )


def chosen_parallel(text: str, mps_setting: str, trainer: Any, results_dir: Path, dry_run: bool = False) -> tuple[int, bool, str]:
    """``--parallel`` and ``--mps``: K, whether the cells share the GPU through CUDA MPS, and why (see
    :func:`mps_decision`). K is a whole number, or ``auto``: from the cells per hour measured on this device
    (``cells_per_hour_<device>.csv`` of ``results_dir``, written by ``measure`` and by every auto campaign) with the
    MPS setting the campaign runs with, see :func:`auto_parallel_with`; :data:`FIRST_K` where nothing is measured.
    ``--mps on`` where MPS cannot be used is refused, but for a ``dry_run`` of GPU cells on a machine without it."""
    problem = None if mps_setting == "off" else mps_problem(trainer)
    if mps_setting == "on" and problem and not (dry_run and on_gpu(trainer)):
        raise CampaignError(f"--mps on: {problem[0]}; {problem[1]}")
    path = results_dir / f"cells_per_hour_{device_slug(trainer)}.csv"
    rows = read_rows(path) if path.is_file() else []
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


def auto_parallel_with(rows: list[dict[str, str]], mps: bool, machine_cores: int) -> int | None:
    """``--parallel auto``'s K for cells run with (``mps``) or without MPS: :func:`auto_parallel` of the curve measured
    so; with MPS and nothing measured with it yet, of the curve without it (the campaign's own row is then the first
    with it); None where there is no such curve."""
    for curve in (curve_of(rows, True), curve_of(rows, False)) if mps else (curve_of(rows, False),):
        if curve:
            return auto_parallel(curve, machine_cores)
    return None


def curve_of(rows: list[dict[str, str]], mps: bool) -> list[dict[str, str]]:
    """The rows of a curve measured with (``mps``) or without MPS, a row from before MPS was measured being without."""
    setting = "on" if mps else "off"
    return [r for r in rows if (r.get("mps") or "off") == setting and r.get("cells_per_hour") not in ("", "nan", None)]


def auto_parallel(rows: list[dict[str, str]], machine_cores: int) -> int:
    """The K a campaign runs: the smallest K within :data:`BEST_SHARE` of the best measured cells per hour, unless
    the best is the largest K measured and still gained on the K before it (or is the only one): then twice it (at
    most a cell per core), so that each job measures a K that may be better until one stops gaining."""
    best = best_parallel(rows)
    rates = {int(r["parallel"]): float(r["cells_per_hour"]) for r in rows if r.get("cells_per_hour") not in ("", "nan")}
    below = [k for k in rates if k < best]
    gained = not below or rates[best] > rates[max(below)] / BEST_SHARE
    return min(2 * best, machine_cores) if best == max(rates) and gained and 2 * best <= machine_cores else best


def best_parallel(rows: list[dict[str, str]]) -> int:
    measured = [(int(r["parallel"]), float(r["cells_per_hour"])) for r in rows if r.get("cells_per_hour") not in ("", "nan")]
    if not measured:
        raise CampaignError("the measured curve has no row with cells per hour")
    best = max(rate for _, rate in measured)
    return min(k for k, rate in measured if rate >= BEST_SHARE * best)


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


# ---- CUDA MPS: K cells on one GPU at once --------------------------------------------------------


def mps_problem(trainer: Any) -> tuple[str, str] | None:
    """Why these cells cannot share a GPU through MPS on this machine, and the fix; None where they can."""
    if not on_gpu(trainer):
        return "the cells run on the CPU, and MPS shares a CUDA GPU", "run them on a GPU (trainer=gpu), or leave out on"
    if shutil.which(MPS_CONTROL) is None:
        return (
            f"{MPS_CONTROL} is not on PATH (it is installed with the NVIDIA driver)",
            "put the folder that holds it on PATH, or leave out on",
        )
    return None


def mps_decision(setting: str, problem: tuple[str, str] | None, parallel: int, rows: list[dict[str, str]]) -> tuple[bool, str]:
    """Whether K = ``parallel`` cells run under MPS with ``--mps setting``, and why; ``problem``: :func:`mps_problem`'s
    (``on`` with one is refused before). ``auto`` uses it for more than one cell at a time, unless the device's curve
    (``rows``) has this K measured with and without it and without was faster."""
    if setting == "off":
        return False, "--mps off"
    if problem:
        return False, problem[0]
    if setting == "on":
        return True, "--mps on"
    if parallel == 1:
        return False, "one cell at a time: MPS has nothing to share"
    with_mps, without = rate_at(rows, parallel, True), rate_at(rows, parallel, False)
    if with_mps is None or without is None:
        return True, f"{parallel} cells at once on a CUDA GPU (K = {parallel} not yet measured both with and without MPS)"
    measured = f"measured at K = {parallel}: {with_mps:g} cells per hour with MPS, {without:g} without"
    return with_mps >= without, measured


def rate_at(rows: list[dict[str, str]], parallel: int, mps: bool) -> float | None:
    """The best cells per hour measured at K = ``parallel`` with (``mps``) or without MPS, None where not measured."""
    rates = [float(r["cells_per_hour"]) for r in curve_of(rows, mps) if int(r["parallel"]) == parallel]
    return max(rates, default=None)


def mps_running() -> str | None:
    """The MPS daemon already running that a CUDA process started here connects to (its control socket in
    ``CUDA_MPS_PIPE_DIRECTORY``, or in the default pipe folder where that is not set), in words; None."""
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or MPS_DEFAULT_PIPE)
    return f"its control socket {pipe / 'control'}" if (pipe / "control").exists() else None


@contextlib.contextmanager
def mps_daemon(wanted: bool, required: bool, log_dir: Path) -> Iterator[dict[str, str] | None]:
    """CUDA MPS for the block where ``wanted``: the variables each cell's environment gets to connect to it (none for a
    daemon already running, which the cells find as this process does), or None where the cells run without it.

    Without MPS the processes of K cells on one GPU take turns on it in time slices, however little of it each one's
    kernels fill (the LRA model is 2 layers of width 64); under it their kernels run at once. The daemon started here
    (``nvidia-cuda-mps-control -d``) lives as long as the block, in a pipe folder of its own made by
    ``tempfile.mkdtemp``: its control is a Unix socket there, whose path must fit in 107 bytes, which a campaign's
    folder may not leave room for, and a folder of its own is no other daemon's. Its log goes to ``log_dir``. It is
    sent ``quit`` and its folder removed however the block ends (a stop, the deadline, an exception): it is the
    block's alone. A daemon already running (:func:`mps_running`) is used as it is and left running; the cells
    connect to it even where not ``wanted``, and it is said. A start that fails is one line in the log and the cells
    run without MPS; where ``required`` (``--mps on``), a :class:`CampaignError`."""
    if running := mps_running():
        log.info("MPS: already running for this user (%s), used as it is%s", running, "" if wanted else ", whatever --mps says")
        yield {}
        return
    if not wanted:
        yield None
        return
    binary = shutil.which(MPS_CONTROL)
    pipe = Path(tempfile.mkdtemp(prefix="lra-mps-"))
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(log_dir)}
    problem = start_mps(binary, env) if binary else f"{MPS_CONTROL} is not on PATH"
    if problem:
        shutil.rmtree(pipe, ignore_errors=True)
        if required:
            raise CampaignError(
                f"MPS did not start: {problem}; start it yourself ({MPS_CONTROL} -d: a running one is used), "
                "or run with --mps auto or off",
                1,
            )
        log.info("MPS: did not start (%s); the cells run without it", problem)
        yield None
        return
    log.info("MPS: started (%s -d, CUDA_MPS_PIPE_DIRECTORY=%s, its log in %s)", MPS_CONTROL, pipe, log_dir)
    try:
        yield env
    finally:
        log.info("MPS: %s", quit_mps(binary, env))
        shutil.rmtree(pipe, ignore_errors=True)


def start_mps(binary: str, env: dict[str, str]) -> str | None:
    """Start the MPS control daemon with ``env`` and wait for its control socket; what went wrong, or None."""
    log_dir = Path(env["CUDA_MPS_LOG_DIRECTORY"])
    log_dir.mkdir(parents=True, exist_ok=True)
    said = log_dir / "start.log"
    try:
        with open(said, "w") as output:  # a file, not a pipe: the daemon it forks could hold a pipe open for its life
            started = subprocess.run(
                [binary, "-d"],
                env={**os.environ, **env},
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                timeout=MPS_START_S,
            )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{MPS_CONTROL} -d: {error}"
    if started.returncode != 0:
        last = said.read_text(errors="replace").strip().splitlines()
        return f"{MPS_CONTROL} -d exited with status {started.returncode}" + (f": {last[-1]}" if last else "")
    control = Path(env["CUDA_MPS_PIPE_DIRECTORY"]) / "control"
    deadline = time.monotonic() + MPS_START_S
    while not control.exists():
        if time.monotonic() > deadline:
            quit_mps(binary, env)  # a daemon that started without opening its socket must not outlive the campaign
            return f"its control socket {control} did not appear within {MPS_START_S:g} s (its log: {log_dir})"
        time.sleep(0.1)
    return None


def quit_mps(binary: str, env: dict[str, str]) -> str:
    """Send the daemon of ``env`` ``quit`` (on its control's stdin, as its documentation does); what came of it."""
    try:
        done = subprocess.run(
            [binary], input="quit\n", env={**os.environ, **env}, capture_output=True, text=True, timeout=MPS_QUIT_S
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"quit failed: {error}"
    said = (done.stdout + done.stderr).strip().splitlines()
    return "quit" if done.returncode == 0 else f"quit exited with status {done.returncode}" + (f": {said[-1]}" if said else "")


# ---- where each cell stands ----------------------------------------------------------------------


def finished_records(cells: list[Cell], output_dir: Path, runs_dir: Path) -> tuple[dict[str, Path], dict[str, Path]]:
    """The finished run of each cell's configuration, by hash: under the output folder (its own folder first, as
    ``lra.train`` looks) and committed under ``runs_dir``."""
    from . import results

    hashes = {cell.config_hash for cell in cells}
    found: dict[str, Path] = {}
    own = [Path(cell.folder) / results.RESULTS_FILE for cell in cells]
    others = sorted(output_dir.rglob(results.RESULTS_FILE)) if output_dir.is_dir() else []
    for path in own + others:
        try:
            if not any(digest in path.read_text() for digest in hashes):
                continue
        except OSError:
            continue
        record = results.read(path)
        if record and record.status == "finished" and record.stage is None and record.config_hash in hashes:
            if not results.config_hash_problem(record):  # a stored hash is a claim (lra.run.finished_record)
                found.setdefault(record.config_hash, path)
    committed: dict[str, Path] = {}
    for path in sorted(runs_dir.glob("*.json")) if runs_dir.is_dir() else []:
        record = results.read(path)
        if record and record.status == "finished" and record.config_hash in hashes:
            if not results.config_hash_problem(record):
                committed.setdefault(record.config_hash, path)
    return found, committed


def progress(folder: Path) -> tuple[int | None, float | None]:
    """The latest logged step of a run and its latest validation accuracy, from its metrics.csv."""
    path = folder / "metrics" / "metrics.csv"
    step, val = None, None
    try:
        with open(path, newline="") as file:
            for row in csv.DictReader(file):
                if row.get("step"):
                    step = int(float(row["step"])) + 1  # Lightning logs step s after s + 1 updates
                if row.get("val/acc"):
                    val = float(row["val/acc"])
    except (OSError, ValueError):
        pass
    return step, val


@dataclass
class CellState:
    cell: Cell
    status: str  # finished | committed | running | failed | interrupted | pending
    detail: str
    record: Path | None = None  # the finished record, for pack


def cell_states(campaign: Path, plan: dict[str, Any]) -> list[CellState]:
    from . import results

    cells = [Cell(**cell) for cell in plan["cells"]]
    found, committed = finished_records(cells, Path(plan["output_dir"]), Path(plan["runs_dir"]))
    alive = run_lock.holder(campaign) is not None
    states = []
    for cell in cells:
        folder = Path(cell.folder)
        exit_file = campaign / CELLS / f"{cell.index}.exit"
        launched = (campaign / CELLS / f"{cell.index}.log").is_file()
        step, val = progress(folder)
        steps = f"step {step or 0}/{cell.max_steps}" + (f", val acc {val:.4f}" if val is not None else "")
        if cell.config_hash in found:
            record = results.read(found[cell.config_hash])
            where = "" if found[cell.config_hash].parent == folder else f" (in {found[cell.config_hash].parent})"
            states.append(CellState(cell, "finished", f"test acc {record.test_acc:.4f}{where}", found[cell.config_hash]))
        elif cell.config_hash in committed:
            states.append(CellState(cell, "committed", f"skipped: {committed[cell.config_hash]}"))
        elif holder := run_lock.holder(folder):
            states.append(CellState(cell, "running", f"{steps} ({holder})"))
        elif (record := results.read(folder / results.RESULTS_FILE)) and record.status == "diverged":
            # Its settings make it diverge: run again, it would again. Not run, and its record goes on from job to job.
            states.append(CellState(cell, "diverged", f"{steps}: {(record.error or '').splitlines()[0][:160]}"))
        elif launched and exit_file.is_file():
            record = results.read(folder / results.RESULTS_FILE)
            status = record.status if record and record.status in ("failed", "interrupted") else "failed"
            error = record.error if record and record.error else f"exit status {exit_file.read_text().strip()}"
            error += "" if record else ", no record"
            error += "; start resumes it from its last.ckpt" if status == "interrupted" else ""
            states.append(CellState(cell, status, f"{steps}: {error.splitlines()[0][:160]}"))
        elif launched and alive:
            states.append(CellState(cell, "running", "starting"))
        elif launched:
            states.append(CellState(cell, "failed", f"{steps}: the campaign stopped while it ran (see {LOG_FILE})"))
        else:
            states.append(CellState(cell, "pending", steps if step else ""))
    return states


# ---- start and run ---------------------------------------------------------------------------------


def read_plan(campaign: Path) -> dict[str, Any]:
    path = campaign / PLAN_FILE
    if not path.is_file():
        raise CampaignError(f"no campaign in {campaign} ({PLAN_FILE} is missing); start one with python -m lra.campaign start", 1)
    return json.loads(path.read_text())


def write_json(path: Path, value: Any) -> None:
    staging = path.with_suffix(path.suffix + ".tmp")
    staging.write_text(json.dumps(value, indent=2) + "\n")
    os.replace(staging, path)


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


def start(args: argparse.Namespace) -> int:
    campaign = args.dir.absolute()
    refuse_if_taken(campaign)  # before planning, which takes a while
    cells, datasets, trainer = make_plan(args.overrides)
    parallel, mps, mps_reason = chosen_parallel(args.parallel, args.mps, trainer, args.results, args.dry_run)
    share = Share.of(parallel, cores())
    if args.nice is not None and not 0 <= args.nice <= 19:
        raise CampaignError(f"--nice must be from 0 (the default priority) to 19 (the lowest), got {args.nice}")
    if args.measure_window <= 0:
        raise CampaignError(f"--measure-window must be a positive number of seconds, got {args.measure_window:g}")
    if not args.dry_run:
        check_device(trainer)
    plan = {
        "overrides": args.overrides,
        "parallel": share.parallel,
        "parallel_auto": args.parallel == "auto",
        "measure_window_s": args.measure_window,
        "mps_setting": args.mps,
        "mps": mps,
        "mps_reason": mps_reason,
        "device": device_slug(trainer),
        "threads_per_cell": share.threads,
        "workers_per_cell": share.workers,
        "cores": cores(),
        "nice": args.nice if args.nice is not None else os.nice(0),
        "cwd": str(Path.cwd()),
        "output_dir": str(Path(os.environ.get("LRA_OUTPUT_DIR", "outputs")).absolute()),
        "runs_dir": str(args.results.absolute() / "runs"),
        "stop_after_s": args.stop_after,
        "stop_at": stop_time(args),
        "pack": str(args.pack.absolute()) if args.pack else None,
        "part_size_mib": args.part_size,
        "margin_s": args.margin,
        "planned_at": now(),
        "host": socket.gethostname(),
        "datasets": datasets,
        "cells": [asdict(cell) for cell in cells],
    }
    if args.dry_run:
        print(describe(plan))
        for state in cell_states(campaign, plan):
            print(f"  {state.status:<11} {state.cell.name}  {' '.join(cell_command(state.cell, share)[0][3:])}")
        if args.mps == "on" and not mps:
            print(f"note: {mps_reason}; start --mps on refuses these cells on this machine")
        if on_gpu(trainer):
            with contextlib.suppress(CampaignError):
                check_device(trainer)
                return 0
            print("note: no CUDA GPU is visible here; start refuses these cells on this machine")
        return 0
    with starting(campaign):
        (campaign / CELLS).mkdir(exist_ok=True)
        for old in (campaign / CELLS).iterdir():  # the previous plan's cells
            old.unlink()
        write_json(campaign / PLAN_FILE, plan)
        if args.foreground:
            return run(campaign)
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
    if daemon.poll() not in (None, 0):
        tail = (campaign / LOG_FILE).read_text(errors="replace").splitlines()[-15:]
        raise CampaignError("the campaign stopped at once:\n" + "\n".join(tail), 1)
    print(describe(plan))
    print(f"Started in the background (pid {daemon.pid}); its log: {campaign / LOG_FILE}")
    print(f"Progress: python -m lra.campaign status --dir {campaign}")
    return 0


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


def describe(plan: dict[str, Any]) -> str:
    mps = f"; MPS {'on' if plan['mps'] else 'off'}: {plan['mps_reason']}" if "mps" in plan else ""  # a plan from before --mps
    nice = f", at nice {plan['nice']}" if plan.get("nice") else ""
    return (
        f"Campaign {' '.join(plan['overrides'])}: {len(plan['cells'])} cells, {plan['parallel']} at a time on "
        f"{plan['cores']} cores ({plural(plan['threads_per_cell'], 'thread')} and at most "
        f"{plural(plan['workers_per_cell'], 'data-loader worker')} each{nice}){mps}"
    )


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


AUTOGROUP = Path("/proc/self/autogroup")  # Linux's scheduling group of this process's session, and its nice value


def lower_priority(nice: int) -> str:
    """Run this process, and every process it starts, at niceness ``nice`` (at least), and where this process leads its
    own session (the campaign's detached process), give that session's scheduling group the same nice value; in words.

    Linux schedules each session as one group (autogroup, on by default) and divides the CPU between groups before it
    looks at a process's own niceness: a campaign in its own session at nice 19 still took half of a 2-core machine
    from a shell's work, which ran 7x slower (1.31 against 9.63 steps/s of a small encoder layer); with its group's
    nice value at 19 too, 5% slower (9.15). A group's value can be raised without privileges."""
    raised = os.nice(max(0, nice - os.nice(0)))
    said = f"nice {raised}"
    if os.getsid(0) == os.getpid() and AUTOGROUP.exists():
        try:
            AUTOGROUP.write_text(f"{nice}\n")
            said += f", its session's scheduling group at nice {nice}"
        except OSError as error:
            said += f" (its session's scheduling group could not be set: {error.strerror})"
    return said


class Stopping:
    """SIGTERM / SIGINT to the campaign: launch nothing more, let the running cells save their checkpoint and end."""

    def __init__(self) -> None:
        self.why: str | None = None
        signals.take(self.handle)  # a data generator's pool forked later keeps the default handlers

    def handle(self, signum: int, frame: Any) -> None:
        self.why = self.why or f"signal {signal.Signals(signum).name}"


def prepare_data(datasets: list[dict[str, Any]]) -> None:
    """Generate and prepare each distinct data set once, before any cell starts (each under its own lock)."""
    from .data.tasks import prepare_task

    for dataset in datasets:
        start_time = time.monotonic()
        resolved = prepare_task(dataset["task"], dataset["data"])
        log.info("Data of %s ready in %.0f s: %s", dataset["task"], time.monotonic() - start_time, resolved.folder)


def run(campaign: Path) -> int:
    """Run the plan in ``campaign`` in this process: the data first, then the cells not yet finished, K at a time."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%Y-%m-%d %H:%M:%S", force=True)
    plan = read_plan(campaign)
    share = Share(plan["parallel"], plan["threads_per_cell"], plan["workers_per_cell"])
    if plan.get("nice"):
        log.info("Priority: %s", lower_priority(plan["nice"]))
    try:
        with run_lock.held(campaign):
            return run_cells(campaign, plan, share)
    except run_lock.RunFolderBusy as busy:
        log.error("error: %s", busy)
        return 1


@dataclass
class Ramp:
    """``--parallel auto`` within a job: K measured on the job's own cells, and doubled while doubling gains.

    Once K cells run and each has logged a step since its launch (their start-up is over), the cells' steps are
    counted for ``window_s`` seconds, and longer until each of those K has logged a step again: the steps of every
    cell running in that time, replacements for ended cells included (their start-up is part of what K cells at a
    time cost). That is K's rate, steps per second of all
    cells together. Then K doubles, while the cells left can fill twice K and it is at most ``ceiling`` (a cell per
    core), and the new K is measured the same way; once a K gains less than 1 / :data:`BEST_SHARE` on the K before
    it, K settles at the smallest K within :data:`BEST_SHARE` of the best rate measured. A K that falls launches no
    cell until fewer run; none is stopped. Each measured K goes into the device's curve, which the next job starts
    from."""

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


def run_cells(campaign: Path, plan: dict[str, Any], share: Share) -> int:
    stopping = Stopping()
    log.info("%s; pid %d on %s", describe(plan), os.getpid(), socket.gethostname())
    states = cell_states(campaign, plan)
    todo = [state.cell for state in states if state.status not in ("finished", "committed", "diverged")]
    log.info("%d cells finished or committed, %d to run", len(states) - len(todo), len(todo))
    if todo:
        # YOSO's kernels build (a minute on a bare GPU machine) while the data is prepared, not after it: every
        # cell loads them. The build is left to a process of its own and waited for, whatever it says (a cell
        # that needs kernels that failed to build says so itself).
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.STDOUT}
        build = subprocess.Popen([sys.executable, "-m", "yoso_cuda"], cwd=plan["cwd"], **quiet)
        try:
            prepare_data(plan["datasets"])
        except Exception as error:  # the cells would all fail the same way: one message
            log.error("error: preparing the data failed: %s: %s", type(error).__name__, error)
            return 1
        finally:
            build.wait()
    deadline = time.monotonic() + plan["stop_after_s"] if plan.get("stop_after_s") else None
    if plan.get("stop_at"):  # --deadline, counted from the job's start, whatever the setup before this took
        deadline = min(deadline or math.inf, time.monotonic() + plan["stop_at"] - time.time())
    # A stopped cell gets until the deadline's margin is half spent to save its state, then it is killed.
    grace = min(STOP_GRACE_S, plan["margin_s"] / 2) if plan.get("stop_at") else STOP_GRACE_S
    running: dict[int, tuple[subprocess.Popen, Cell, float]] = {}
    first_step: dict[int, int] = {}  # each launched cell's step when it was launched (a resumed one's is not 0)
    training_since: float | None = None
    queue = list(todo)
    ended = []
    signalled = False
    refused = False  # --mps on, and MPS did not start
    ramp = (
        Ramp(share.parallel, min(plan["cores"], len(todo)), plan.get("measure_window_s") or MEASURE_WINDOW_S)
        if plan.get("parallel_auto")
        else None
    )
    observed = 0.0  # when the ramp last read the cells' steps
    with contextlib.ExitStack() as daemon:
        try:
            mps = daemon.enter_context(
                mps_daemon(bool(plan.get("mps") and todo), plan.get("mps_setting") == "on", campaign / "mps")
            )
        except CampaignError as error:  # no cell runs; what a job carried in is still packed for the next one
            log.error("error: %s", error)
            queue, mps, refused = [], None, True
        while queue or running:
            if deadline is not None and time.monotonic() > deadline and not stopping.why:
                stopping.why = "the --deadline's margin" if plan.get("stop_at") else f"--stop-after {plan['stop_after_s']} s"
            if stopping.why and not signalled:
                log.info(
                    "Stopping (%s): %d running cells save their checkpoint; %d not started",
                    stopping.why,
                    len(running),
                    len(queue),
                )
                for process, _, _ in running.values():
                    with contextlib.suppress(ProcessLookupError):
                        process.send_signal(signal.SIGTERM)
                queue, signalled, stop_time = [], True, time.monotonic()
            while queue and len(running) < (ramp.k if ramp else share.parallel):
                cell = queue.pop(0)
                command, env = cell_command(cell, Share.of(ramp.k, plan["cores"]) if ramp else share, mps)
                with open(campaign / CELLS / f"{cell.index}.log", "w") as output:
                    output.write(f"$ {' '.join(command)}\n# env: {' '.join(f'{k}={v}' for k, v in env.items())}\n")
                    output.flush()
                    process = subprocess.Popen(
                        command,
                        cwd=plan["cwd"],
                        env={**os.environ, **env},
                        stdin=subprocess.DEVNULL,
                        stdout=output,
                        stderr=subprocess.STDOUT,
                    )
                running[cell.index] = (process, cell, time.monotonic())
                first_step.setdefault(cell.index, progress(Path(cell.folder))[0] or 0)
                training_since = training_since or time.monotonic()
                log.info("launched %s (pid %d, %d running)", cell.name, process.pid, len(running))
            time.sleep(0.5)
            for index, (process, cell, started) in list(running.items()):
                if process.poll() is None:
                    if signalled and time.monotonic() - stop_time > grace:
                        process.kill()
                    continue
                (campaign / CELLS / f"{index}.exit").write_text(f"{process.returncode}\n")
                del running[index]
                ended.append(cell)
                log.info("ended %s: exit status %d after %.0f s", cell.name, process.returncode, time.monotonic() - started)
            if ramp and not ramp.settled and not signalled and time.monotonic() - observed > min(RAMP_READ_S, ramp.window_s / 4):
                observed = time.monotonic()
                observe_cells(ramp, observed, [cell for _, cell, _ in running.values()], ended, first_step, len(queue))
    from .sweep import summary

    # A cell whose configuration finished elsewhere since the plan was made is skipped by its run: it counts there.
    found, committed = finished_records(ended, Path(plan["output_dir"]), Path(plan["runs_dir"]))
    finished_in = {**committed, **found}
    cells = [{"folder": cell.folder, "finished_in": str(finished_in.get(cell.config_hash, ""))} for cell in ended]
    lines, failed = summary(cells) if ended else ([], 0)
    log.info("Campaign %s", "\n".join(["stopped" if stopping.why else "done", *lines]))
    if ramp and ramp.rates:  # the K this job measured on its cells
        for k, (steps, seconds) in sorted(ramp.rates.items()):
            log.info("Measured: %s", record_throughput(plan, k, ended, steps, seconds, mps is not None))
    elif ramp and training_since is not None:  # no window completed: what the whole campaign trained at its one K
        trained = sum((progress(Path(c.folder))[0] or 0) - first_step[c.index] for c in ended if c.index in first_step)
        wall = time.monotonic() - training_since
        log.info("Measured: %s", record_throughput(plan, ramp.k, ended, trained, wall, mps is not None))
    if plan.get("pack"):  # what the next job needs, before this one ends
        log.info("Packed: %s", write_pack(campaign, plan, Path(plan["pack"]), plan["part_size_mib"]))
    return 1 if failed or stopping.why or refused else 0


def record_throughput(plan: dict[str, Any], parallel: int, ended: list[Cell], trained: int, wall: float, mps: bool) -> str:
    """Add what this campaign trained in ``wall`` seconds with ``parallel`` cells at a time, with (``mps``) or without
    MPS, to the device's cells-per-hour curve (``--parallel auto`` reads it, the next job too once packed), replacing
    an earlier campaign's row of the same K and MPS; the row, in words. Measured on the real cells, evaluations and
    the start-up of cells launched in that time included."""
    from . import results

    path = Path(plan["runs_dir"]).parent / f"cells_per_hour_{plan['device']}.csv"
    paper_steps = statistics.mean(cell.max_steps for cell in ended) if ended else 1
    steps_per_hour = trained * 3600 / max(wall, 1e-9)
    label = f"campaign of {len(plan['cells'])} cells: {' '.join(plan['overrides'])}"
    share = Share.of(parallel, plan["cores"])
    row = {
        "device": plan["device"],
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
        "cell": label,
        "commit": results.git_commit(),
    }
    earlier = read_rows(path) if path.is_file() else []
    kept = [
        {**r, "parallel": int(r["parallel"]), "mps": r.get("mps") or "off", "cells_per_hour": float(r["cells_per_hour"] or "nan")}
        for r in earlier
        if not (r["cell"].startswith("campaign of ") and int(r["parallel"]) == parallel and (r.get("mps") or "off") == row["mps"])
    ]
    write_curve(sorted([*kept, row], key=lambda r: r["parallel"]), path)
    return (
        f"K = {parallel}{' with MPS' if mps else ''}: {trained} steps in {wall:.0f} s, {row['cells_per_hour']} cells "
        f"per hour, in {path}"
    )


# ---- status, stop ----------------------------------------------------------------------------------


def status_text(campaign: Path, plan: dict[str, Any]) -> str:
    states = cell_states(campaign, plan)
    holder = run_lock.holder(campaign)
    counts = {
        name: sum(s.status == name for s in states)
        for name in ("finished", "committed", "running", "failed", "diverged", "interrupted", "pending")
    }
    lines = [describe(plan), f"Campaign process: {'running, ' + holder if holder else 'not running'}"]
    lines.append(
        f"{len(states)} cells: " + ", ".join(f"{count} {name}" for name, count in counts.items() if count or name == "finished")
    )
    width = max(len(s.cell.name) for s in states)
    for state in states:
        lines.append(f"  {state.status:<11} {state.cell.name:<{width}}  {state.detail}")
    return "\n".join(lines)


def status(args: argparse.Namespace) -> int:
    campaign = args.dir.absolute()
    plan = read_plan(campaign)
    deadline = time.monotonic() + (args.wait or 0)
    last_line = 0.0
    while args.wait and run_lock.holder(campaign) and time.monotonic() < deadline:
        if time.monotonic() - last_line >= args.every:
            states = cell_states(campaign, plan)
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


# ---- pack and unpack --------------------------------------------------------------------------------


def pack(args: argparse.Namespace) -> int:
    campaign = args.dir.absolute()
    plan = read_plan(campaign)
    out = (args.out or campaign / "campaign_runs.tar.gz").absolute()
    print(write_pack(campaign, plan, out, args.part_size))
    print(f"Into a checkout: python -m lra.campaign unpack {out.name}")
    return 0


def write_pack(campaign: Path, plan: dict[str, Any], out: Path, part_size_mib: float) -> str:
    """Write the campaign's archive to ``out`` (in parts where it is larger than ``part_size_mib``); what it holds."""
    from .results import RunRecord
    from .table import run_file_name

    states = cell_states(campaign, plan)
    members: dict[str, bytes] = {}
    for state in states:
        if state.status != "finished" or state.record is None:
            continue
        record = RunRecord.read(state.record)
        name = run_file_name(record)
        members[f"results/runs/{name}"] = (
            json.dumps(record.to_dict(committed=True), indent=2, sort_keys=True, default=str) + "\n"
        ).encode()
        metrics = state.record.parent / "metrics" / "metrics.csv"
        if metrics.is_file():
            members[f"results/runs/{CURVES}/{name.removesuffix('.json')}.csv"] = metrics.read_bytes()
    unfinished = 0
    for state in states:
        carried = unfinished_state(state, Path(plan["output_dir"]))
        unfinished += bool(carried)
        members.update(carried)
    for state in states:  # what went wrong, to read back home: the end of each failed cell's train.log
        train_log = Path(state.cell.folder) / "train.log"
        if state.status in ("failed", "diverged", "interrupted") and train_log.is_file():
            members[f"campaign/failed/{state.cell.index}.log"] = "\n".join(
                train_log.read_text(errors="replace").splitlines()[-200:]
            ).encode()
    curve = Path(plan["runs_dir"]).parent / f"cells_per_hour_{plan.get('device', '')}.csv"
    if curve.is_file():  # what --parallel auto chooses K from, measured so far
        members[f"results/{curve.name}"] = curve.read_bytes()
    members["campaign/status.txt"] = (status_text(campaign, plan) + "\n").encode()
    members[f"campaign/{PLAN_FILE}"] = (campaign / PLAN_FILE).read_bytes()
    if (campaign / LOG_FILE).is_file():
        members[f"campaign/{LOG_FILE}"] = (campaign / LOG_FILE).read_bytes()[-2_000_000:]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in sorted(members.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
            archive.addfile(info, io.BytesIO(data))
    files = write_parts(buffer.getvalue(), out, int(part_size_mib * 2**20))
    runs = sum(name.endswith(".json") and name.startswith("results/runs/") for name in members)
    size = sum(path.stat().st_size for path in files)
    where = str(out) if files == [out] else f"{len(files)} parts {files[0].name} .. {files[-1].name} in {out.parent}"
    return (
        f"{where}: {runs} finished runs of {len(states)} cells with their curves, and the state of "
        f"{plural(unfinished, 'unfinished cell')} ({size / 2**20:.1f} MiB)"
    )


def unfinished_state(state: CellState, output_dir: Path) -> dict[str, bytes]:
    """What a cell that has not finished needs to go on elsewhere from the step it reached, as archive members
    (``state/<its folder under the output folder>/...``): its last.ckpt, the weights of its best checkpoint (the
    best is only ever tested, so its optimizer state stays behind), its metrics.csv and its record. Nothing for a
    cell without a last.ckpt (it starts afresh anyway) or a running one (its files are being written)."""
    folder = Path(state.cell.folder)
    last = folder / "checkpoints" / "last.ckpt"
    prefix = f"{STATE}/{folder.relative_to(output_dir).as_posix()}"
    if state.status == "diverged":  # its verdict travels, so that no later job trains it again
        names = [name for name in ("results.json", "metrics/metrics.csv") if (folder / name).is_file()]
        return {f"{prefix}/{name}": (folder / name).read_bytes() for name in names}
    if state.status not in ("failed", "interrupted", "pending") or not last.is_file():
        return {}
    members = {f"{prefix}/checkpoints/last.ckpt": last.read_bytes()}
    for best in folder.glob("checkpoints/best-step*.ckpt"):
        members[f"{prefix}/checkpoints/{best.name}"] = weights_only(best)
    for name in ("metrics/metrics.csv", "results.json"):
        if (folder / name).is_file():
            members[f"{prefix}/{name}"] = (folder / name).read_bytes()
    return members


def weights_only(checkpoint: Path) -> bytes:
    """A Lightning checkpoint without its optimizer and scheduler states: what testing it needs, a third of its size."""
    import torch

    content = torch.load(checkpoint, map_location="cpu", weights_only=False)  # the run's own file
    for key in ("optimizer_states", "lr_schedulers"):
        content.pop(key, None)
    buffer = io.BytesIO()
    torch.save(content, buffer)
    return buffer.getvalue()


PART = re.compile(r"\.part(\d{3})$")


def write_parts(data: bytes, out: Path, part_size: int) -> list[Path]:
    """``data`` as ``out`` where it fits in ``part_size`` bytes, else as ``out.part000``, ``out.part001``, ...
    (``cat`` joins them); each written whole and renamed, and the parts of an earlier, larger archive removed."""
    if part_size < 1:
        raise CampaignError(f"--part-size must be positive, got {part_size / 2**20:g} MiB")
    out.parent.mkdir(parents=True, exist_ok=True)
    pieces = [data] if len(data) <= part_size else [data[i : i + part_size] for i in range(0, len(data), part_size)]
    paths = [out] if len(pieces) == 1 else [out.with_name(f"{out.name}.part{i:03d}") for i in range(len(pieces))]
    for stale in [out, *out.parent.glob(f"{out.name}.part[0-9][0-9][0-9]")]:
        if stale not in paths:
            stale.unlink(missing_ok=True)
    for path, piece in zip(paths, pieces, strict=True):
        staging = path.with_name(path.name + ".partial")
        staging.write_bytes(piece)
        os.replace(staging, path)
    return paths


def archive_exists(path: Path) -> bool:
    """Whether the archive ``path`` (written by :func:`write_parts`: itself, or parts of it) is there, whole or not."""
    base = path.with_name(PART.sub("", path.name))
    return base.is_file() or any(base.parent.glob(f"{base.name}.part[0-9][0-9][0-9]"))


def read_parts(path: Path) -> tuple[bytes, list[Path]]:
    """An archive written by :func:`write_parts`: ``path`` itself, or all its parts given the archive's name or any
    part's; with the files read."""
    base = path.with_name(PART.sub("", path.name))
    parts = sorted(base.parent.glob(f"{base.name}.part[0-9][0-9][0-9]"))
    if not parts:
        if not path.is_file():
            raise CampaignError(f"{path} is not a file (nor are there parts {path.name}.part000, ...)")
        return path.read_bytes(), [path]
    numbers = [int(PART.search(part.name).group(1)) for part in parts]
    if numbers != list(range(len(parts))):
        missing = sorted(set(range(max(numbers) + 1)) - set(numbers))
        raise CampaignError(f"{base.name} is missing its part(s) {', '.join(f'part{n:03d}' for n in missing)}; nothing unpacked")
    return b"".join(part.read_bytes() for part in parts), parts


RUN_MEMBER = re.compile(r"results/runs/[\w.,+=@-]+\.json")
CURVE_MEMBER = re.compile(rf"results/runs/{CURVES}/[\w.,+=@-]+\.csv")
CAMPAIGN_MEMBER = re.compile(r"campaign/[\w./-]+")
CURVE_FILE_MEMBER = re.compile(r"results/cells_per_hour_\w+\.csv")
STATE_MEMBER = re.compile(
    rf"{STATE}/(?P<folder>[\w.,+=@/-]+)/(?P<file>checkpoints/last\.ckpt|checkpoints/best-step\d+\.ckpt|"
    r"metrics/metrics\.csv|results\.json)"
)


def unpack(args: argparse.Namespace) -> int:
    from .results import RunRecord

    if args.missing_ok and not archive_exists(args.archive):
        print(f"Nothing to unpack: no {args.archive} (nor its parts); start begins with nothing carried")
        return 0
    data, files = read_parts(args.archive)
    root = Path.cwd()
    output_dir = Path(os.environ.get("LRA_OUTPUT_DIR", "outputs"))
    logs = output_dir / "unpacked" / args.archive.name.split(".")[0]
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            members = archive.getmembers()
            for member in members:
                patterns = (RUN_MEMBER, CURVE_MEMBER, CAMPAIGN_MEMBER, STATE_MEMBER, CURVE_FILE_MEMBER)
                if not member.isfile() or not any(p.fullmatch(member.name) for p in patterns) or ".." in member.name.split("/"):
                    raise CampaignError(
                        f"{args.archive} holds {member.name!r}, which is not part of a campaign archive; nothing unpacked"
                    )
            contents = {member.name: archive.extractfile(member).read() for member in members}
    except (tarfile.TarError, OSError, EOFError) as error:
        raise CampaignError(f"{args.archive} is not a campaign archive ({error}); nothing unpacked") from None
    records = {}
    for name, data in contents.items():
        if RUN_MEMBER.fullmatch(name):
            try:
                record = RunRecord.from_dict(json.loads(data))
            except ValueError as error:
                raise CampaignError(f"{name} in {args.archive} is not a run record ({error}); nothing unpacked") from None
            if record.status != "finished" or not record.config_hash:
                raise CampaignError(f"{name} in {args.archive} is not a finished run's record; nothing unpacked")
            records[name] = record
    cells: dict[str, dict[str, bytes]] = {}
    for name, data in contents.items():
        if found := STATE_MEMBER.fullmatch(name):
            cells.setdefault(found["folder"], {})[found["file"]] = data
    new = 0
    for name, data in sorted(contents.items()):
        if STATE_MEMBER.fullmatch(name):
            continue
        target = root / name if name.startswith("results/") else logs / name.removeprefix("campaign/")
        new += name in records and not target.exists()
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    restored = [restore_cell(output_dir / folder, files_of_cell) for folder, files_of_cell in sorted(cells.items())]
    runs = root / "results" / "runs"
    print(f"{len(records)} finished run records ({new} new) into {runs}, their curves into {runs / CURVES}")
    for line in restored:
        print(line)
    print(f"The campaign's status and log: {logs}")
    if args.remove:  # the folder that carried them to this job is emptied once they are in place
        for path in files:
            path.unlink()
        print(f"Removed {', '.join(path.name for path in files)}")
    return 0


def restore_cell(folder: Path, files: dict[str, bytes]) -> str:
    """Put an unfinished cell's carried files into its run folder, where the next ``start`` resumes it; unless the
    folder already holds a run as far along (its last.ckpt at the same step or later, or finished)."""
    from .results import RESULTS_FILE, RunRecord, read
    from .run import UNREADABLE_CHECKPOINT, checkpoint_step

    if "checkpoints/last.ckpt" not in files:
        carried = json.loads(files.get("results.json", b"{}"))
        if carried.get("status") != "diverged":
            return f"  {folder}: not restored, the archive holds no last.ckpt for it"
        if read(folder / RESULTS_FILE) is None:  # a diverged cell's record alone: start does not train it again
            folder.mkdir(parents=True, exist_ok=True)
            RunRecord.from_dict(carried).write(folder / RESULTS_FILE)
        return f"  {folder}: diverged (its record restored; start leaves it)"
    with tempfile.TemporaryDirectory() as scratch:  # the carried checkpoint's step, read as a resumed run reads it
        carried = Path(scratch) / "last.ckpt"
        carried.write_bytes(files["checkpoints/last.ckpt"])
        try:
            step = checkpoint_step(carried)
        except UNREADABLE_CHECKPOINT:
            return f"  {folder}: not restored, its carried last.ckpt cannot be read"
    here = read(folder / RESULTS_FILE)
    if here is not None and here.status == "finished":
        return f"  {folder}: not restored, it holds a finished run"
    try:
        existing = checkpoint_step(folder / "checkpoints" / "last.ckpt")
    except UNREADABLE_CHECKPOINT:  # none yet, or one cut short: the carried one is further along
        existing = None
    if existing is not None and existing >= step:
        return f"  {folder}: not restored, its own last.ckpt is at step {existing}, the archive's at {step}"
    with run_lock.held(folder):  # no run writes into it meanwhile
        if (folder / "checkpoints").is_dir():
            shutil.rmtree(folder / "checkpoints")  # an older attempt's: its best checkpoint is not this run's
        for name, data in sorted(files.items(), key=lambda item: item[0] == "results.json"):  # the record last
            target = folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            staging = target.with_name(target.name + ".partial")
            staging.write_bytes(data)
            os.replace(staging, target)
    return f"  {folder}: restored at step {step}; start resumes it there"


# ---- measure: cells per hour against K -------------------------------------------------------------


def measure(args: argparse.Namespace) -> int:
    from . import results

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
    cells, datasets, trainer = make_plan(args.overrides)
    if "on" in settings and (problem := mps_problem(trainer)):
        if not (args.dry_run and on_gpu(trainer)):
            raise CampaignError(f"--mps on: {problem[0]}; {problem[1]}")
        print(f"note: {problem[0]}; measure --mps on refuses this cell on this machine")
    if not args.dry_run:
        check_device(trainer)
        if "off" in settings and (running := mps_running()):
            raise CampaignError(
                f"MPS is already running for this user ({running}): every copy would run under it, so without it cannot be "
                f"measured; quit it (echo quit | {MPS_CONTROL}) or measure --mps on only"
            )
    cell = cells[0]
    device = device_slug(trainer)
    scratch = Path(os.environ.get("LRA_OUTPUT_DIR", "outputs")).absolute() / "campaign_measure" / time.strftime("%Y%m%d-%H%M%S")
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
    path = args.out / f"cells_per_hour_{device}.csv"
    rows = []
    for k, mps in runs:
        share = Share.of(k, cores())
        folder = scratch / (f"k{k}-mps" if mps else f"k{k}")
        folder.mkdir(parents=True, exist_ok=True)
        with mps_daemon(mps, True, folder / "mps") as mps_env:
            processes = []
            start_time = time.monotonic()
            for copy in range(k):
                keyed = {o.split("=", 1)[0]: o for o in cell.overrides}
                changes = {
                    "seed": MEASURE_SEED + copy,
                    "task.protocol.max_steps": args.steps,
                    "paths.output_dir": folder,
                    "paths.runs_dir": scratch / "no_runs",
                }
                keyed.update({key: f"{key}={value}" for key, value in changes.items()})
                copy_cell = Cell(**{**asdict(cell), "overrides": list(keyed.values())})
                command, env = cell_command(copy_cell, share, mps_env)
                output = open(folder / f"copy{copy}.log", "w")  # open while the copy runs
                processes.append(
                    (subprocess.Popen(command, env={**os.environ, **env}, stdout=output, stderr=subprocess.STDOUT), output)
                )
            for process, output in processes:
                process.wait()
                output.close()
            wall = time.monotonic() - start_time
        records = [results.read(path) for path in sorted(folder.rglob(results.RESULTS_FILE))]
        done = [r for r in records if r and r.status == "finished"]
        steps_per_hour = len(done) * args.steps * 3600 / wall
        rows.append(
            {
                "device": device,
                "parallel": k,
                "mps": "on" if mps else "off",
                "threads_per_cell": share.threads,
                "workers_per_cell": min(cell.num_workers, share.workers),
                "steps": args.steps,
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
        )
        print(
            f"K={k}{' with MPS' if mps else ''}: {len(done)}/{k} finished in {wall:.1f} s, {rows[-1]['cells_per_hour']} "
            f"cells of {cell.max_steps} steps per hour",
            flush=True,
        )
        write_curve(rows, path)  # after each K: a command stopped by its time limit keeps what it measured
    text_rows = [{key: str(value) for key, value in row.items()} for row in rows]
    chosen = [
        f"{best_parallel(curve)} cells at a time{' with MPS' if mps else ''}"
        for mps in (False, True)
        if (curve := curve_of(text_rows, mps)) and any(float(r["cells_per_hour"]) for r in curve)
    ]
    print(f"wrote {path}" + (f"; start --parallel auto would run {' or '.join(chosen)}" if chosen else ""))
    return 0 if all(row["finished"] == f"{row['parallel']}/{row['parallel']}" for row in rows) else 1


def write_curve(rows: list[dict[str, Any]], path: Path) -> None:
    """The curve's CSV and PNG, each row's speedup over K = 1 without MPS where that was measured."""
    from .bench.output import write_csv

    base = next((r["cells_per_hour"] for r in rows if int(r["parallel"]) == 1 and (r.get("mps") or "off") == "off"), None)
    for row in rows:
        row["speedup"] = round(row["cells_per_hour"] / base, 2) if base else ""
    write_csv(rows, path, CURVE_FIELDS)
    figure(rows, path.with_suffix(".png"))


def figure(rows: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for mps in ("off", "on"):
        curve = [r for r in rows if (r.get("mps") or "off") == mps]
        if curve:
            ax.plot([r["parallel"] for r in curve], [r["cells_per_hour"] for r in curve], marker="o", label=f"MPS {mps}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("cells at once on one device (K)")
    ax.set_ylabel(f"cells of {rows[0]['paper_steps']} steps per hour")
    ax.set_title(f"{rows[0]['device']}: {rows[0]['cell']}", fontsize=7)
    if any(r.get("mps") == "on" for r in rows):
        ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---- the command line ---------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(prog="python -m lra.campaign", description=__doc__.split("\n\n")[0])
    commands = main.add_subparsers(dest="command", required=True)

    def with_dir(sub: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sub.add_argument(
            "--dir", type=Path, default=default_dir(), help="the campaign's folder (default: <output folder>/campaign)"
        )
        return sub

    begin = with_dir(commands.add_parser("start", help="run a sweep's cells K at a time, in the background"))
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
    begin.add_argument("overrides", nargs="*", help="the sweep, as python -m lra.train -m takes it")
    with_dir(commands.add_parser("run", help="what start runs in the background: the planned campaign, in this process"))
    look = with_dir(commands.add_parser("status", help="each cell: finished, committed, running (step), failed, pending"))
    look.add_argument("--wait", type=float, default=None, metavar="S", help="first wait up to S seconds for the campaign to end")
    look.add_argument("--every", type=float, default=60, metavar="S", help="while waiting, a line of counts every S seconds")
    halt = with_dir(commands.add_parser("stop", help="interrupt the campaign: running cells save their checkpoint"))
    halt.add_argument(
        "--wait", type=float, default=None, metavar="S", help="wait up to S seconds for it to end (exit status 1 if it has not)"
    )
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
    curve = commands.add_parser("measure", help="cells per hour against K: cells_per_hour_<device>.{csv,png}")
    curve.add_argument("--parallel", required=True, help="the values of K, separated by commas (1,2,4,8)")
    curve.add_argument(
        "--mps", default="off", help="off, on, or off,on: each K without and with CUDA MPS (K = 1 without only; default off)"
    )
    curve.add_argument("--steps", type=int, default=200, help="steps of each copy (default 200)")
    curve.add_argument("--out", type=Path, default=Path("results"), help="where the curve goes (default: results/)")
    curve.add_argument("--dry-run", action="store_true", help="say what would be measured, and exit")
    curve.add_argument("overrides", nargs="*", help="the cell, as python -m lra.train takes it (a sweep: its first cell)")
    return main


COMMANDS = {"start": start, "status": status, "stop": stop, "pack": pack, "unpack": unpack, "measure": measure}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "run":
            return run(args.dir.absolute())
        return COMMANDS[args.command](args)
    except CampaignError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.status


if __name__ == "__main__":
    sys.exit(main())
