"""Timing a call on a device: ``torch.utils.benchmark.Timer``, the one clock of every benchmark.

Timer warms a call up, sizes blocks of calls so that reading the clock costs nothing beside them (a call a block once
a call takes 10,000 times as long as reading the clock: from about 10 ms on the 2-core VM), and gives a
``Measurement``: the time per call of each block (``times``), their median and interquartile range. Its clock
synchronises an accelerator before each reading. ``blocked_autorange(min_run_time=S)`` times blocks for at least S
seconds; ``adaptive_autorange(threshold=t)`` goes on until the blocks' IQR / median is under t (at least four blocks)
or ``max_run_time`` is spent.

What :func:`timer` times is the call and then waiting for its device, so a figure is the host's and the device's
work on one call in sequence, as a step that is waited for takes it; :func:`back_to_back` times calls that do not
wait for one another, as a training loop runs them. Both run on torch's threads (Timer's default is one thread), and
on a CPU with the allocator in a long run's state (:func:`lra.bench.memory.steady_allocator`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.benchmark import Measurement, Timer

from lra.bench.memory import steady_allocator


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (a CPU's is done when its call returns)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timer(run: Callable[[], object], device: torch.device) -> Timer:
    """A Timer of ``run()`` followed by waiting for ``device``."""

    def call() -> None:
        run()
        synchronize(device)

    return _timer(call, device)


def back_to_back(run: Callable[[], object], device: torch.device, calls: int) -> Measurement:
    """``calls`` calls of ``run()`` one after another, the device waited for only after the last (``Timer.timeit``,
    after its warm-up of two calls): the host prepares and launches a call while the device still works on the one
    before, where :func:`timer`'s figure adds the two."""
    return _timer(run, device).timeit(calls)


def _timer(call: Callable[[], object], device: torch.device) -> Timer:
    if device.type == "cpu":
        steady_allocator()
    return Timer("call()", globals={"call": call}, num_threads=torch.get_num_threads())


def milliseconds(measurement: Measurement) -> float:
    """The median time per call, in milliseconds."""
    return measurement.median * 1e3


def calls_timed(measurement: Measurement) -> int:
    """How many calls the measurement's blocks hold (its warm-up left out)."""
    return measurement.number_per_run * len(measurement.raw_times)


def relative_spread(measurement: Measurement) -> float:
    """The blocks' interquartile range over their median, the figure ``adaptive_autorange`` stops on."""
    return measurement.iqr / measurement.median
