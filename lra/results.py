"""The per-run ``results.json``: what ran, on what, and how well."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import resource
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

RESULTS_FILE = "results.json"
SCHEMA_VERSION = 1
REPO_ROOT = Path(__file__).resolve().parent.parent


# Settings added after runs were recorded, at the value those runs had: a run with these values has
# the config hash it had before them (config_hash), and a record without them has them (lra.table).
ADDED_SETTINGS = {("model", "positions"): "learned", ("pretrain", "objective"): "none"}


def with_added_settings(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (a record's or a defining config) with every added setting it lacks at its old value."""
    config = {key: dict(value) if isinstance(value, dict) else value for key, value in config.items()}
    for (part, key), value in ADDED_SETTINGS.items():
        config.setdefault(part, {}).setdefault(key, value)
    return config


def config_hash(config: dict[str, Any]) -> str:
    """A short, stable hash of the settings that define a run's result.

    Settings of :data:`ADDED_SETTINGS` at their old values are left out (and a part they leave
    empty), so that a run of today's default configuration keeps the hash of its earlier runs.
    """
    config = {key: dict(value) if isinstance(value, dict) else value for key, value in config.items()}
    for (part, key), value in ADDED_SETTINGS.items():
        if isinstance(config.get(part), dict) and config[part].get(key) == value:
            del config[part][key]
            if not config[part]:
                del config[part]
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def git_commit() -> str:
    """The commit of the checkout this code runs from, with ``-dirty`` for uncommitted changes; "unknown"
    for an installed copy (even one installed inside another repository's folder)."""
    try:
        top = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "--show-toplevel"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        if not top or Path(top).resolve() != REPO_ROOT:
            return "unknown"
        commit = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def reset_peak_memory(device: torch.device) -> None:
    """Start this run's peak afresh: a Hydra multirun trains every job in one process, and a peak
    kept from the previous job made every later one report the largest so far (all 11 presets
    after Linformer showed 821.3 MB on the lent H100)."""
    if device.type == "cuda":
        # Before CUDA's first use there is no peak to reset, and the allocator refuses the call
        # ("Invalid device argument": every preset's first GPU run failed so on the lent H100).
        if torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats(device)
        return
    try:  # "5" resets the peak resident set (VmHWM) to the current one (Linux >= 4.0)
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def peak_memory_mb(device: torch.device) -> tuple[float, str]:
    """Peak memory since ``reset_peak_memory`` and what was measured: CUDA allocations on a GPU,
    else the process's peak resident set (VmHWM; the lifetime max RSS where /proc is missing)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20, "cuda_max_allocated"
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024, "cpu_max_rss"
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "cpu_max_rss"


def read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def write(path: Path, record: dict[str, Any]) -> None:
    """Write atomically, so a reader never sees half a file."""
    path = Path(path)
    staging = path.with_suffix(".json.tmp")
    staging.write_text(json.dumps({"schema_version": SCHEMA_VERSION, **record}, indent=2, default=str) + "\n")
    os.replace(staging, path)


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
