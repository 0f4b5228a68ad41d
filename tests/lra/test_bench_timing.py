"""``lra.bench.timing``: every benchmark's clock is torch.utils.benchmark's Timer, around a call waited for or not.

The clock here is a stand-in that moves only when the timed call says so, so each figure is known exactly and
nothing depends on the machine's speed."""

import pytest
import torch
from torch.utils.benchmark import Measurement
from torch.utils.benchmark.utils import timer as timer_module
from torch.utils.benchmark.utils.common import TaskSpec

from lra.bench import timing


class Clock:
    """Seconds that pass only inside the timed call: ``tick`` per call."""

    def __init__(self, tick: float) -> None:
        self.now, self.tick, self.events = 0.0, tick, []

    def __call__(self) -> float:
        return self.now

    def call(self) -> None:
        self.events.append("call")
        self.now += self.tick


@pytest.fixture
def clock(monkeypatch):
    clock = Clock(tick=0.02)
    monkeypatch.setattr(timer_module.timeit, "default_timer", clock)  # what Timer's own clock reads
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: clock.events.append("synchronize"))
    return clock


def test_a_timed_call_waits_for_its_device_and_the_figure_is_the_median_per_call(clock):
    measured = timing.timer(clock.call, torch.device("cuda")).blocked_autorange(min_run_time=0.1)
    assert timing.milliseconds(measured) == pytest.approx(20.0)
    assert timing.calls_timed(measured) == 5, "blocks of one 20 ms call until 0.1 s are timed"
    assert clock.events == ["call", "synchronize"] * (1 + 5), "each call waited for, the block-sizing one too"


def test_back_to_back_calls_do_not_wait_for_the_device_between_them(clock):
    measured = timing.back_to_back(clock.call, torch.device("cuda"), calls=4)
    assert (measured.number_per_run, len(measured.raw_times), timing.calls_timed(measured)) == (4, 1, 4)
    assert timing.milliseconds(measured) == pytest.approx(20.0), "per call, not for the four"
    assert clock.events == ["call"] * (2 + 4), "Timer's two warm-up calls, then the four, none waited for"


def test_the_timer_runs_on_torchs_threads_with_the_cpu_allocator_in_a_long_runs_state(clock, monkeypatch):
    """Timer's own default is one thread; the benchmarks' figures are on the threads torch uses (their CSV's threads)."""
    settings = []
    monkeypatch.setattr(timing, "steady_allocator", lambda: settings.append("steady"))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = []
        timing.timer(lambda: seen.append(torch.get_num_threads()) or clock.call(), torch.device("cpu")).timeit(3)
    finally:
        torch.set_num_threads(threads)
    assert seen == [2] * (2 + 3) and settings == ["steady"]


def test_the_relative_spread_is_the_interquartile_range_over_the_median():
    measured = Measurement(number_per_run=1, raw_times=[1.0, 2.0, 3.0, 4.0, 5.0], task_spec=TaskSpec("call()", "pass"))
    assert timing.relative_spread(measured) == pytest.approx((4.0 - 2.0) / 3.0)
