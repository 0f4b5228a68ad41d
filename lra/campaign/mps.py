"""CUDA MPS: K cells on one GPU at once, their kernels running together instead of in turns.

Without it the processes of K cells on one GPU take turns on it in time slices, however little of it each one's kernels
fill (the LRA model is 2 layers of width 64); under the Multi-Process Service their kernels run at once. Whether a
campaign's cells run under it (:func:`mps_decision`), and the control daemon's life around them (:func:`mps_daemon`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .machine import on_gpu
from .plan import CampaignError
from .throughput import rate_at

log = logging.getLogger("lra.campaign")

MPS_CONTROL = "nvidia-cuda-mps-control"  # CUDA MPS's control daemon and its client, installed with the NVIDIA driver
MPS_SETTINGS = ("auto", "on", "off")
MPS_DEFAULT_PIPE = Path("/tmp/nvidia-mps")  # where CUDA processes look for MPS when CUDA_MPS_PIPE_DIRECTORY is not set
MPS_START_S = 30.0  # how long a started MPS daemon may take to open its control socket
MPS_QUIT_S = 60.0  # how long its quit may take


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
