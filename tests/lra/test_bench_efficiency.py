"""``python -m lra.bench efficiency``: every attention in the grid, per-instance time and memory, failures recorded."""

import csv

import pytest
import torch

import attention_zoo
from attention_zoo import Attention, register
from lra import config
from lra.bench import efficiency, memory


class PassThrough(Attention):
    def forward(self, q, k, v, mask=None):
        return v


class NeedsTooMuchMemoryFrom64(Attention):
    """Asks for a terabyte from n = 64 on: an out-of-memory error the allocator really raises."""

    def forward(self, q, k, v, mask=None):
        if q.shape[2] >= 64:
            torch.empty(2**40, dtype=torch.uint8)
        return v


class Broken(Attention):
    def forward(self, q, k, v, mask=None):
        raise ValueError("this attention is broken on purpose")


@pytest.fixture
def throwaway_attentions():
    names = {"test_pass_through": PassThrough, "test_oom_from_64": NeedsTooMuchMemoryFrom64, "test_broken": Broken}
    for name, cls in names.items():
        register(name)(cls)
    yield list(names)
    for name in names:
        attention_zoo.unregister(name)


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_the_grid_has_every_preset_and_every_registered_attention_without_one(throwaway_attentions):
    rows = {entry.row: entry for entry in efficiency.entries()}
    presets = set(config.attention_rows())
    assert presets <= set(rows) and {"softmax", "none", "yoso_32", "yoso_e"} <= presets
    assert rows["yoso_32"].name == "yoso" and rows["yoso_32"].hparams["num_hashes"] == 32
    # A newly registered attention appears with its defaults, without a preset or a code change.
    for name in throwaway_attentions:
        assert rows[name].name == name and rows[name].hparams == {}


def test_writes_per_instance_rows_and_records_failures_and_out_of_memory(tmp_path, throwaway_attentions):
    out = tmp_path / "results"
    argv = [
        "--device",
        "cpu",
        "--lengths",
        "32",
        "64",
        "128",
        "--batch",
        "2",
        "--min-run-time",
        "0.05",
        "--quiet",
        "--out",
        str(out),
        "--attentions",
        "softmax",
        "test_oom_from_64",
        "test_broken",
        "test_pass_through",
    ]
    assert efficiency.main(argv) == 0
    rows = read_rows(out / "efficiency_cpu.csv")
    assert (out / "efficiency_cpu.png").stat().st_size > 0
    assert set(rows[0]) == set(efficiency.FIELDS)
    cells = {(row["attention"], int(row["seq_len"])): row for row in rows}
    assert len(cells) == len(rows) == 4 * 3
    for n in (32, 64, 128):
        for name in ("softmax", "test_pass_through"):
            row = cells[(name, n)]
            assert row["status"] == "ok" and row["batch"] == "2" and row["dtype"] == "float32"
            assert float(row["time_ms"]) > 0 and float(row["memory_mb"]) >= 0
            assert int(row["repeats"]) >= 1, "the steps Timer timed"
        broken = cells[("test_broken", n)]
        assert broken["status"] == "failed" and "broken on purpose" in broken["error"] and broken["repeats"] == ""
    assert cells[("test_oom_from_64", 32)]["status"] == "ok"
    oom = cells[("test_oom_from_64", 64)]
    assert oom["status"] == "out_of_memory" and "allocate" in oom["error"]
    skipped = cells[("test_oom_from_64", 128)]
    assert skipped["status"] == "out_of_memory" and skipped["error"] == "skipped: out of memory at n=64"


def test_a_run_of_some_attentions_keeps_the_files_other_rows_and_replaces_its_own(tmp_path, throwaway_attentions):
    """Issue 71: the committed CPU grid lacked softmax_unpadded and yoso_e_flex; a run of those two must add their rows,
    not replace the file with them."""
    out = tmp_path / "results"
    common = ["--device", "cpu", "--batch", "2", "--min-run-time", "0.02", "--quiet", "--out", str(out)]
    assert efficiency.main([*common, "--lengths", "32", "64", "--attentions", "softmax", "test_pass_through"]) == 0
    before = {(row["attention"], row["seq_len"]): row for row in read_rows(out / "efficiency_cpu.csv")}
    assert efficiency.main([*common, "--lengths", "64", "128", "--attentions", "test_pass_through", "none"]) == 0
    after = {(row["attention"], row["seq_len"]): row for row in read_rows(out / "efficiency_cpu.csv")}
    assert sorted(after) == sorted({*before, ("test_pass_through", "128"), ("none", "64"), ("none", "128")})
    assert all(after[key] == before[key] for key in [("softmax", "32"), ("softmax", "64"), ("test_pass_through", "32")])
    assert after[("test_pass_through", "64")] != before[("test_pass_through", "64")], "measured again: replaced"


def test_unknown_attention_is_named(tmp_path):
    with pytest.raises(SystemExit, match="unknown attention.*'sofmax'"):
        efficiency.main(["--device", "cpu", "--attentions", "sofmax", "--out", str(tmp_path)])


def test_cpu_memory_meter_sees_an_allocation_of_known_size():
    meter = memory.MemoryMeter(torch.device("cpu"))
    meter.reset_peak()
    block = torch.ones(200 * 2**20, dtype=torch.uint8)  # 200 MiB, touched
    del block
    assert memory.MemoryMeter(torch.device("cpu")).baseline < meter.baseline + 50  # given back on free
    assert meter.peak_above_baseline() == pytest.approx(200, abs=30)


def test_address_space_limit_turns_an_allocation_beyond_it_into_an_error_and_is_lifted_after():
    with efficiency.address_space_limit(64):
        with pytest.raises(RuntimeError) as caught:
            torch.empty(256 * 2**20, dtype=torch.uint8)
    assert efficiency.is_out_of_memory(caught.value)
    assert torch.ones(256 * 2**20, dtype=torch.uint8).sum() == 256 * 2**20
