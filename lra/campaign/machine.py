"""The machine a campaign runs on: its cores divided between K cells, its device, and the campaign's priority on it."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .plan import CampaignError, Cell

AUTOGROUP = Path("/proc/self/autogroup")  # Linux's autogroup of this process (its scheduling group, one per setsid), its nice


def autogroup_nice() -> int | None:
    """The nice value of this process's autogroup, or None where it has none of its own: not Linux, or a process in
    Linux's root autogroup (init's, and that of every process no ``setsid`` has moved, as in many containers and CI
    runners), where the file reads empty."""
    try:
        fields = AUTOGROUP.read_text().split()
    except OSError:
        return None
    return int(fields[-1]) if fields else None


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
    ``mps``, the variables that connect it to the campaign's MPS daemon (:func:`lra.campaign.mps.mps_daemon`)."""
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


def lower_priority(nice: int) -> str:
    """Run this process, and every process it starts, at niceness ``nice`` (at least), and where this process is
    detached (``setsid``: the campaign's own process), give its scheduling group the same nice value; in words.

    Linux puts each detached group of processes in a scheduling group of its own (autogroup, on by default) and divides
    the CPU between groups before it looks at a process's niceness, so a detached campaign at nice 19 still takes half
    of the machine from the user's shell (docs/scale-out.md has the measurement). A group's value can be raised without
    privileges; a campaign in the foreground, in the user's terminal's group, leaves that group alone. Autogroups divide
    the CPU only within the root CPU cgroup: in a container with a cgroup of its own the group's value changes nothing,
    and the processes' niceness is what counts."""
    raised = os.nice(max(0, nice - os.nice(0)))
    said = f"nice {raised}"
    if os.getsid(0) == os.getpid() and autogroup_nice() is not None:
        try:
            AUTOGROUP.write_text(f"{nice}\n")
            said += f", its scheduling group at nice {nice}"
        except OSError as error:
            said += f" (its scheduling group could not be set: {error.strerror})"
    return said
