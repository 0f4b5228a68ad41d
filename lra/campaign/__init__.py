"""A sweep's cells K at a time on one machine, in the background, and what they finished and reached carried to the
next machine in one small archive.

    python -m lra.campaign start [--parallel K|auto [--measure-window S]] [--mps auto|on|off] [--nice N]
        [--dry-run] [--replace] [--foreground] [--stop-after S | --deadline S [--margin S] --pack FILE
        [--part-size MIB]] OVERRIDES...
    python -m lra.campaign resume [--dry-run] [--foreground] [--stop-after S | --deadline S [--margin S] --pack FILE
        [--part-size MIB]]
    python -m lra.campaign status [--wait S [--every S]]
    python -m lra.campaign stop [--wait S]
    python -m lra.campaign pack [--out FILE] [--part-size MIB]
    python -m lra.campaign unpack ARCHIVE [--remove] [--missing-ok]
    python -m lra.campaign measure --parallel 1,2,4,8 [--mps off,on] [--steps N] [--out results] OVERRIDES...

``start`` takes the overrides of a sweep (``python -m lra.train -m OVERRIDES``) and runs every cell as its own
``python -m lra.train <cell's overrides>``, K at a time, on the machine's one GPU (or its CPU), detached (``setsid``)
unless ``--foreground``. Each cell is an ordinary run: its folder is the one the sweep would give it, it holds its
folder's lock, it is skipped where its configuration is finished (in its folder, elsewhere under the output folder, or
committed under ``results/runs/``) and resumes from its ``last.ckpt`` where it was interrupted (such cells first,
then the sweep's order). A plan that leaves out an unfinished cell of the campaign's earlier plan, in its folder or
carried to this machine, is refused unless ``--replace``: a pack carries the running plan's cells only. ``resume``
starts the campaign's latest plan again (its sweep, K, MPS setting and niceness), in its folder or unpacked from its
archive on a new machine. ``status`` lists the cells and estimates the time those left need (a running one at its
pace, the others at their rows' finished runs'), ``stop`` interrupts them (each saves its state; a later ``start`` or
``resume`` resumes it), ``pack`` writes what the next machine needs into one archive and ``unpack`` puts it in place
there. ``measure`` times K concurrent copies of one cell for each K: the curve ``--parallel auto`` takes K from.
docs/scale-out.md has the recipes.

The modules, from the bottom up:

* :mod:`~lra.campaign.plan`: the sweep's cells and the :class:`~lra.campaign.plan.Plan` that ``start`` writes;
* :mod:`~lra.campaign.machine`: the cores divided between K cells, the device, the campaign's priority;
* :mod:`~lra.campaign.state`: where each cell stands, from the files its run leaves;
* :mod:`~lra.campaign.throughput`: cells per hour against K, and K measured within a job;
* :mod:`~lra.campaign.mps`: CUDA MPS, K cells' kernels on one GPU at once;
* :mod:`~lra.campaign.archive`: the archive's format, checked whole before anything is unpacked;
* :mod:`~lra.campaign.carry`: what a campaign packs; :mod:`~lra.campaign.restore`: how it is unpacked;
* :mod:`~lra.campaign.scheduler`: the campaign's own process, its cells K at a time until done, stopped or due;
* :mod:`~lra.campaign.measure`, :mod:`~lra.campaign.control`: the commands; :mod:`~lra.campaign.cli`: their line.
"""

from . import archive
from .carry import STATE, is_member, unfinished_state, write_pack
from .cli import main, parser
from .control import chosen_parallel, refuse_if_taken, start, starting, status, stop
from .machine import AUTOGROUP, Share, autogroup_nice, cell_command, check_device, cores, device_slug, lower_priority, on_gpu
from .measure import MEASURE_SEED, measure
from .mps import MPS_CONTROL, MPS_DEFAULT_PIPE, mps_daemon, mps_decision, mps_problem, mps_running
from .plan import (
    CELLS,
    LOG_FILE,
    PLAN_FILE,
    START_LOCK_FILE,
    CampaignError,
    Cell,
    Plan,
    compose,
    default_dir,
    make_plan,
    sweep_cells,
)
from .restore import CellRestore, checked_cell, restore_cell, settle_cell, unpack
from .scheduler import Stopping, run, run_cells
from .state import CellState, cell_states, finished_records, plan_states, progress, run_order, status_text
from .throughput import (
    BEST_SHARE,
    CURVE_FIELDS,
    FIRST_K,
    Ramp,
    auto_parallel,
    best_parallel,
    curve_of,
    rate_at,
    record_throughput,
    write_curve,
)

__all__ = [
    "AUTOGROUP", "BEST_SHARE", "CELLS", "CURVE_FIELDS", "FIRST_K", "LOG_FILE", "MEASURE_SEED", "MPS_CONTROL",
    "MPS_DEFAULT_PIPE", "PLAN_FILE", "STATE", "START_LOCK_FILE", "CampaignError", "Cell", "CellRestore", "CellState",
    "Plan", "Ramp", "Share", "Stopping", "archive", "auto_parallel", "autogroup_nice", "best_parallel", "cell_command",
    "cell_states", "check_device", "checked_cell", "chosen_parallel", "compose", "cores", "curve_of", "default_dir",
    "device_slug", "finished_records", "is_member", "lower_priority", "main", "make_plan", "measure", "mps_daemon",
    "mps_decision", "mps_problem", "mps_running", "on_gpu", "parser", "plan_states", "progress", "rate_at",
    "record_throughput", "refuse_if_taken", "restore_cell", "run", "run_cells", "run_order", "settle_cell", "start", "starting",
    "status", "status_text", "stop", "sweep_cells", "unfinished_state", "unpack", "write_curve", "write_pack",
]  # fmt: skip
