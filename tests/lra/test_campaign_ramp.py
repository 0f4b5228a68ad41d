"""lra.campaign --parallel auto within a job (:class:`lra.campaign.Ramp`): K measured on the job's own cells, doubled
while doubling gains, on a simulated clock and simulated cells."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from tiny_listops import TINY

from lra import campaign
from lra.campaign import BEST_SHARE, Ramp
from lra.rows import read_rows

STARTUP_S, TICK_S = 12.0, 5.0  # a simulated cell logs no step for its first 12 s; the campaign reads steps every 5 s


class Campaign:
    """A campaign loop's view of its cells: K at a time, each cell ``cell_steps`` long, all together training
    ``rates[K]`` steps per second once started, a replacement launched as soon as a cell ends."""

    def __init__(self, ramp: Ramp, cells: int, cell_steps: int, rates: dict[int, float]) -> None:
        self.ramp, self.cell_steps, self.rates = ramp, cell_steps, rates
        self.queue = list(range(cells))
        self.steps: dict[int, float] = {}  # every launched cell's steps so far
        self.launched: dict[int, float] = {}  # its launch time
        self.running: set[int] = set()
        self.now = 0.0
        self.ks: list[int] = []  # K at each tick

    def tick(self) -> None:
        while self.queue and len(self.running) < self.ramp.k:
            index = self.queue.pop(0)
            self.running.add(index)
            self.steps[index], self.launched[index] = 0.0, self.now
        self.now += TICK_S
        training = [i for i in self.running if self.now - self.launched[i] > STARTUP_S]
        for index in training:
            self.steps[index] += self.rates[len(self.running)] * TICK_S / len(self.running)
        for index in list(self.running):
            if self.steps[index] >= self.cell_steps:
                self.running.remove(index)
        logged = {i: (int(self.steps[i]) if self.now - self.launched[i] > STARTUP_S else None) for i in self.running}
        self.ramp.observe(self.now, logged, dict.fromkeys(self.launched, 0), len(self.queue), lambda i: int(self.steps[i]))
        self.ks.append(self.ramp.k)

    def run(self) -> None:
        while self.queue or self.running:
            self.tick()


def test_k_doubles_while_doubling_gains_and_settles_at_the_smallest_k_near_the_best():
    ramp = Ramp(2, 16, 60.0)
    Campaign(ramp, cells=200, cell_steps=5000, rates={1: 5, 2: 10, 3: 14, 4: 18, 5: 18, 6: 18, 7: 18, 8: 18.5}).run()
    assert ramp.settled and ramp.k == 4, "8 gained under 5% on 4"
    assert sorted(ramp.rates) == [2, 4, 8]
    for k, rate in {2: 10, 4: 18, 8: 18.5}.items():
        assert ramp.rate(k) == pytest.approx(rate, rel=0.05), "a K's window counts its cells' steps only"
    assert 18.5 < 18 / BEST_SHARE


def test_a_window_starts_once_every_cell_has_logged_a_step_and_counts_replacements_from_their_launch():
    """Cells of 300 steps at 10 steps per second for 2 cells: each ends after about a minute, so the window of 120 s
    sees cells end and replacements start (their 12 s of start-up count, as K cells at a time pay them)."""
    ramp = Ramp(2, 2, 120.0)
    campaign = Campaign(ramp, cells=12, cell_steps=300, rates={1: 5, 2: 10})
    campaign.run()
    assert ramp.settled and ramp.k == 2 and list(ramp.rates) == [2]
    steps, seconds = ramp.rates[2]
    assert seconds == pytest.approx(120, abs=TICK_S)
    assert 0.7 * 10 < steps / seconds < 10, "under the steady 10 steps per second by the replacements' start-up"


def test_with_too_few_cells_left_to_fill_twice_k_it_settles_after_measuring_k():
    ramp = Ramp(2, 16, 30.0)
    Campaign(ramp, cells=3, cell_steps=2000, rates={1: 5, 2: 10}).run()
    assert ramp.settled and ramp.k == 2 and list(ramp.rates) == [2]


def test_a_k_above_the_ceiling_is_never_tried():
    ramp = Ramp(2, 3, 30.0)
    Campaign(ramp, cells=50, cell_steps=2000, rates={1: 5, 2: 10, 3: 15, 4: 20}).run()
    assert list(ramp.rates) == [2] and ramp.k == 2


def test_a_k_that_loses_sends_the_campaign_back_without_stopping_a_cell():
    ramp = Ramp(2, 16, 60.0)
    campaign = Campaign(ramp, cells=100, cell_steps=3000, rates={1: 5, 2: 10, 3: 8, 4: 8})
    campaign.run()
    assert ramp.k == 2 and sorted(ramp.rates) == [2, 4]
    assert ramp.rate(4) == pytest.approx(8, rel=0.05)
    assert campaign.ks[-1] == 2 and max(campaign.ks) == 4


@pytest.mark.slow
def test_an_auto_campaign_measures_k_on_its_cells_doubles_it_and_records_the_rate(tmp_path):
    """Four cells of 120 steps, --parallel auto with nothing measured (K = 2) on a machine taken for 4 cores, each K
    measured over 4 s: K = 2's rate is measured on the running cells, K becomes 4 within the job, and the rate goes
    into the device's curve as a campaign's row of K = 2."""
    home = tmp_path / "job"
    home.mkdir()
    env = {**os.environ, "LRA_DATA_DIR": str(tmp_path / "data"), "LRA_OUTPUT_DIR": str(home / "outputs")}
    cells = [
        "attention=softmax,none",
        "seed=0,1",
        *[o for o in TINY if not o.startswith(("task.protocol.max_steps", "task.protocol.val_check_interval"))],
        "task.protocol.max_steps=120",
        "task.protocol.val_check_interval=20",  # steps logged every 20
    ]
    four_cores = "import sys; import lra.campaign as c; c.control.cores = lambda: 4; sys.exit(c.main(sys.argv[1:]))"
    argv = ["start", "--foreground", "--parallel", "auto", "--measure-window", "4", *cells]
    done = subprocess.run(
        [sys.executable, "-c", four_cores, *argv], cwd=home, env=env, capture_output=True, text=True, timeout=600
    )
    log = (home / "outputs" / "campaign" / campaign.LOG_FILE).read_text() if done.returncode else done.stderr + done.stdout
    assert done.returncode == 0, log[-3000:]
    measured = re.search(r"Measured K = 2: ([\d.]+) steps per second; trying K = 4", log)
    assert measured and float(measured.group(1)) > 0, log[-3000:]
    after = log[measured.end() :]
    assert re.search(r"launched .*, [34] running\)", after), "more than two cells at once after K = 4"
    curve = read_rows(home / "results" / "cells_per_hour_cpu.csv")
    rows = [(r["parallel"], r["cell"].split(":")[0]) for r in curve]
    assert ("2", "campaign of 4 cells") in rows
    row = next(r for r in curve if r["parallel"] == "2")
    assert float(row["wall_s"]) >= 4 and int(row["steps"]) > 0 and row["threads_per_cell"] == "2"
