"""The memory of a block of work on a device: its peak above a baseline, and the CPU allocator's settings that the
peak and the timings each need (no library does either)."""

from __future__ import annotations

import ctypes
import gc
import math
import re
from pathlib import Path

import torch

from lra import devices

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
# glibc's defaults, and the ceiling its dynamic mmap threshold rises to on 64-bit (trimming at twice it).
DEFAULT_TRIM_THRESHOLD, STEADY_MMAP_THRESHOLD = 128 * 2**10, 32 * 2**20


def steady_allocator() -> None:
    """Put glibc's allocator in the state a long run reaches on its own (blocks under 32 MiB recycled, not returned to
    the OS), undoing :class:`MemoryMeter`'s setting, under which every large block is mapped and faulted in afresh: that
    costs time in proportion to an attention's temporaries (a YOSO-32 forward at n = 16384, head dim 64, 2 threads,
    median of 3, one process each: 63 and 69 ms under it; 35-54 ms with glibc's defaults and 45-50 ms in the state set
    here, the machine's noise; the call of ``python -m lra.bench kernels``, on the 2-core AMD EPYC VM, commit c2f8313,
    2026-11-23). Timing on a CPU starts here (:func:`lra.bench.timing.timer`)."""
    _set_allocator(mmap_threshold=STEADY_MMAP_THRESHOLD, trim_threshold=2 * STEADY_MMAP_THRESHOLD)


class MemoryMeter:
    """Peak memory of a block of work above a baseline: CUDA allocations, or the process's resident set.

    On a CPU the resident set only shows what the allocator holds, so glibc is told to serve every
    block of 1 MiB or more by ``mmap`` (returned to the OS on free; by default the threshold rises
    with each such free and large blocks get recycled unseen) and to give back freed memory before
    the baseline is read. That setting slows the work it watches, so a benchmark measures the peak
    in a run of its own, never in the timed ones (:func:`steady_allocator` undoes it).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        if device.type == "cpu":
            _release_freed_cpu_memory()
        self.baseline = self.current()

    def current(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.memory_allocated(self.device) / 2**20
        return proc_status_mb("VmRSS")

    def reset_peak(self) -> None:
        devices.reset_peak_memory(self.device)

    def peak_above_baseline(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20 - self.baseline
        return proc_status_mb("VmHWM") - self.baseline


def _glibc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: the resident set is read as it is
        return None


def _set_allocator(mmap_threshold: int, trim_threshold: int) -> None:
    libc = _glibc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold)
        libc.mallopt(M_TRIM_THRESHOLD, trim_threshold)


def _release_freed_cpu_memory() -> None:
    gc.collect()
    _set_allocator(mmap_threshold=2**20, trim_threshold=DEFAULT_TRIM_THRESHOLD)
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def proc_status_mb(key: str) -> float:
    return proc_value_mb(Path("/proc/self/status"), key)


def proc_value_mb(path: Path, key: str) -> float:
    """A ``<key>: <n> kB`` line of a /proc file, in MB; NaN where there is no /proc (not Linux)."""
    try:
        match = re.search(rf"^{key}:\s+(\d+) kB", path.read_text(), re.MULTILINE)
    except OSError:
        return math.nan
    return int(match.group(1)) / 1024 if match else math.nan
