"""The device a run trains on, as a record names it, and its peak memory (the process's resident set on a CPU, the
allocator's peak on a GPU): what ``results.json`` records of the machine, and the benchmarks time against."""

from __future__ import annotations

import os
import platform
import resource
from pathlib import Path

import torch


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
    after Linformer showed 821.3 MB on an H100 (2026-11-25))."""
    if device.type == "cuda":
        # Before CUDA's first use there is no peak to reset, and the allocator refuses the call
        # ("Invalid device argument": every preset's first GPU run failed so on an H100 (2026-11-25)).
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
