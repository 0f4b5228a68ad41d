"""``python -m lra.bench``: its help, and the kernels benchmark on a tiny grid."""

import argparse
import importlib
import math
import subprocess
import sys

import pandas as pd
import pytest

from lra.bench import __main__ as bench
from lra.bench import kernels


def test_help_describes_every_benchmark_and_exits_0():
    process = subprocess.run([sys.executable, "-m", "lra.bench", "--help"], capture_output=True, text=True, timeout=120)
    assert process.returncode == 0, process.stderr
    said = " ".join(process.stdout.split())
    for name in bench.BENCHMARKS:
        module = importlib.import_module(f"lra.bench.{name}")
        assert name in said and " ".join(module.__doc__.split("\n\n")[0].split()) in said


def test_every_option_of_every_benchmark_has_help(monkeypatch):
    parsers = {}

    def capture(self, args=None, namespace=None):
        parsers[self.prog] = self
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    for name in bench.BENCHMARKS:
        with pytest.raises(SystemExit):
            importlib.import_module(f"lra.bench.{name}").main([])
    assert sorted(parsers) == sorted(f"python -m lra.bench {name}" for name in bench.BENCHMARKS)
    for prog, parser in parsers.items():
        missing = [action.dest for action in parser._actions if not action.help]
        assert not missing, f"{prog}: no help for {missing}"


def test_an_unknown_benchmark_is_an_error_naming_the_choices():
    process = subprocess.run([sys.executable, "-m", "lra.bench", "kernel"], capture_output=True, text=True, timeout=120)
    assert process.returncode == 2 and "invalid choice: 'kernel'" in process.stderr
    assert all(f"'{name}'" in process.stderr for name in bench.BENCHMARKS)


def test_kernels_records_time_and_peak_memory_on_the_cpu(tmp_path, capsys):
    argv = [
        "kernels",
        "--device",
        "cpu",
        "--lengths",
        "512",
        "--head-dims",
        "16",
        "--dtypes",
        "float32",
        "--min-run-time",
        "0.01",
        "--reference-max-length",
        "512",
        "--out",
        str(tmp_path),
    ]
    assert bench.main(argv) == 0
    assert f"wrote {tmp_path / 'kernels_cpu.csv'} and {tmp_path / 'kernels_cpu.png'}" in capsys.readouterr().out
    rows = pd.read_csv(tmp_path / "kernels_cpu.csv")
    assert set(rows["method"]) == {"softmax/default", "yoso_32", "yoso_32/reference"}
    assert rows["time_ms"].gt(0).all()
    assert rows["peak_memory_mb"].map(math.isfinite).all() and rows["peak_memory_mb"].ge(0).all()
    assert list(rows.columns) == kernels.FIELDS


def test_a_run_keeps_the_rows_of_methods_it_does_not_time_on_its_device(tmp_path):
    argv = ["kernels", "--device", "cpu", "--lengths", "256", "--head-dims", "16", "--dtypes", "float32"]
    argv += ["--min-run-time", "0.01", "--reference-max-length", "256", "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    path = tmp_path / "kernels_cpu.csv"
    ours = pd.read_csv(path)
    device = ours["device"].iloc[0]
    theirs = ours[ours["method"] == "yoso_32"].assign(method="yoso_32/official", official_commit="6000487", time_ms=7.5)
    elsewhere = theirs.assign(device="another CPU", time_ms=9.5)
    pd.concat([ours, theirs, elsewhere]).to_csv(path, index=False)

    assert bench.main(argv) == 0
    rows = pd.read_csv(path, dtype={"official_commit": str})
    kept = rows[rows["method"] == "yoso_32/official"]
    assert len(kept) == 2 and kept["device"].eq(device).all() and kept["time_ms"].eq(7.5).all()
    assert kept["official_commit"].eq("6000487").all()
    assert len(rows[rows["method"] != "yoso_32/official"]) == len(ours)  # ours replaced, not appended
