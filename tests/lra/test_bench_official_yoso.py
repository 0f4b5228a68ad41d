"""``python -m lra.bench kernels --official-yoso`` on a stand-in of mlpen/YOSO written here: the import, the rows,
the errors, the CPU refusal and ``python -m lra.bench gpu``'s pass-through."""

import csv
import math
import subprocess
import sys
import textwrap
import types

import pytest
import torch

from lra.bench import gpu, gpu_figures, kernels, official_yoso

YOSO_PY = '''
import torch
import torch.nn as nn
import os
import sys
curr_path = os.path.dirname(os.path.realpath(__file__))
sys.path.append(curr_path)

import kernel


class YOSOAttention(nn.Module):
    """The interface of mlpen/YOSO's yoso_v2 YOSOAttention, on a tiny dense stand-in."""

    def __init__(self, config):
        super().__init__()
        self.hashcode_len = config["hashcode_len"]
        self.num_hash_f = config["num_hash_f"]
        self.num_head = config["num_head"]

    def forward(self, Q, K, V, mask):
        batch_size, num_heads, seq_len, head_dim = Q.size()
        assert Q.dtype == torch.float32 and mask.dtype == torch.float32  # their LRA model's casts
        assert self.num_hash_f == 32 and self.num_head == num_heads == 2 and 2 ** self.hashcode_len == seq_len
        assert seq_len <= REFUSE_ABOVE, "a shape the stand-in refuses"
        if self.training:
            Q, K = kernel.normalize(Q), kernel.normalize(K)
        X = kernel.lsh_cumulation_query(mask, Q, mask, K, V, self.hashcode_len)
        return kernel.normalize(X)
'''

KERNEL_PY = """
import os
import sys
import torch.nn.functional as F
curr_path = os.path.dirname(os.path.realpath(__file__))
sys.path.append(curr_path)

try:
    from lsh_cumulation.kernel import generate_Dmat, fast_hash, lsh_cumulation_query, count_sort
    from lsh_cumulation.kernel import weighted_lsh_cumulation_sorted_key
except Exception as e:
    print(e)


def normalize(X):
    return F.normalize(X, p = 2, dim = -1)
"""

LSH_KERNEL_PY = """
import os
from torch.utils.cpp_extension import load

curr_path = os.path.dirname(os.path.realpath(__file__))
src_files = [os.path.join(curr_path, file) for file in ['cuda_kernel.cu', 'torch_extension.cpp']]
lsh_cumulation_kernel = load('lsh_cumulation_kernel', src_files, verbose = True)

import lsh_cumulation_kernel

generate_Dmat = fast_hash = count_sort = weighted_lsh_cumulation_sorted_key = None

def lsh_cumulation_query(query_mask, query_hashcode, key_mask, key_hashcode, value, hashcode_len):
    capacity = 2 ** hashcode_len
    return lsh_cumulation_kernel.lsh_cumulation_query(query_mask, query_hashcode, key_mask, key_hashcode, value, capacity)
"""


def write_checkout(root, refuse_above=10**9):
    yoso = root / official_yoso.YOSO_DIR / "yoso_v2"
    (yoso / "lsh_cumulation").mkdir(parents=True)
    (yoso / "yoso.py").write_text(textwrap.dedent(YOSO_PY).replace("REFUSE_ABOVE", str(refuse_above)))
    (yoso / "kernel.py").write_text(textwrap.dedent(KERNEL_PY))
    (yoso / "lsh_cumulation" / "kernel.py").write_text(textwrap.dedent(LSH_KERNEL_PY))
    return root


def built_extension(name, sources, verbose=False):
    """What their load() returns once built: a module with the extension's function (dense, in PyTorch)."""
    assert name == "lsh_cumulation_kernel" and [s.rsplit("/", 1)[1] for s in sources] == ["cuda_kernel.cu", "torch_extension.cpp"]
    extension = types.ModuleType(name)

    def lsh_cumulation_query(query_mask, query, key_mask, key, value, capacity):
        weights = (query @ key.transpose(-1, -2)).clamp(min=0) * query_mask[:, :, None] * key_mask[:, None, :]
        return weights @ value

    extension.lsh_cumulation_query = lsh_cumulation_query
    return extension


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    monkeypatch.setattr(official_yoso, "cpp_extension_load", built_extension)
    return write_checkout(tmp_path / "mlpen-yoso", refuse_above=64)


def run_kernels(checkout, out, *extra):
    argv = ["--device", "cpu", "--lengths", "64", "128", "--head-dims", "16", "--dtypes", "float32", "bfloat16"]
    argv += ["--min-run-time", "0.01", "--reference-max-length", "0", "--official-yoso", str(checkout), "--out", str(out), *extra]
    return kernels.main(argv)


def read_rows(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_official_rows_are_timed_beside_ours_and_refusals_recorded(stand_in, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(official_yoso, "DEVICES", ("cuda", "cpu"))  # the stand-in runs anywhere
    out = tmp_path / "results"
    assert run_kernels(stand_in, out, "--official-yoso-commit", "abc123") == 0
    rows = read_rows(out / "kernels_cpu.csv")
    assert list(rows[0]) == kernels.FIELDS
    theirs = [r for r in rows if r["method"] == "yoso_32/official"]
    assert len(theirs) == 8 and {r["official_commit"] for r in theirs} == {"abc123"}  # 2 dtypes x 2 lengths x 2 passes
    assert all(r["official_commit"] == "" for r in rows if r["method"] != "yoso_32/official")
    for row in theirs:
        if row["seq_len"] == "64":
            assert row["error"] == "" and float(row["time_ms"]) > 0, row  # bfloat16 too: cast to float32 as their model does
        else:
            assert math.isnan(float(row["time_ms"])) and "AssertionError: a shape the stand-in refuses" in row["error"]
    assert len([r for r in rows if r["method"] == "yoso_32" and not r["error"]]) == 8  # the grid went on
    assert str(stand_in) not in sys.path and "kernel" not in sys.modules and "lsh_cumulation_kernel" not in sys.modules
    assert torch.utils.cpp_extension.load is official_yoso.REAL_LOAD
    assert "mlpen/YOSO v2 at abc123" in capsys.readouterr().out

    figures = gpu_figures.official_figures(rows)
    ours = {
        (r["dtype"], r["seq_len"]): float(r["time_ms"])
        for r in rows
        if r["method"] == "yoso_32" and r["pass"] == "forward+backward"
    }
    for row in theirs:
        if row["pass"] == "forward+backward" and row["seq_len"] == "64":
            ratio = float(row["time_ms"]) / ours[(row["dtype"], "64")]
            assert any(f"{row['dtype']} d=16 n=64 forward+backward" in f and f"= {ratio:.1f}x" in f for f in figures), figures
    assert any("n=128 forward+backward: yoso_32/official failed: their v2: AssertionError" in f for f in figures)
    assert figures[-1].startswith("yoso_32/official (mlpen/YOSO abc123) / yoso_32 >= 5x at every shape: ")


def test_a_failed_build_of_theirs_is_every_official_rows_error(tmp_path, monkeypatch):
    def failing_build(name, sources, verbose=False):
        raise RuntimeError(f"Error building extension '{name}'")

    monkeypatch.setattr(official_yoso, "cpp_extension_load", failing_build)
    monkeypatch.setattr(official_yoso, "DEVICES", ("cuda", "cpu"))
    checkout, out = write_checkout(tmp_path / "mlpen-yoso"), tmp_path / "results"
    assert run_kernels(checkout, out, "--official-yoso-commit", "abc123") == 0
    theirs = [r for r in read_rows(out / "kernels_cpu.csv") if r["method"] == "yoso_32/official"]
    assert len(theirs) == 8
    assert {r["error"] for r in theirs} == {
        "building their extension lsh_cumulation_kernel: RuntimeError: Error building extension 'lsh_cumulation_kernel'"
    }
    assert torch.utils.cpp_extension.load is official_yoso.REAL_LOAD and "kernel" not in sys.modules


def test_on_a_cpu_their_kernels_are_one_clear_error(stand_in, tmp_path):
    process = subprocess.run(
        [
            sys.executable,
            "-m",
            "lra.bench",
            "kernels",
            "--device",
            "cpu",
            "--official-yoso",
            str(stand_in),
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert process.returncode == 1, process.stderr
    assert "mlpen/YOSO's kernels are CUDA-only, they cannot run on cpu" in process.stdout
    assert "Traceback" not in process.stdout + process.stderr and not list(tmp_path.glob("*.csv"))


def test_their_commit_comes_from_their_git_checkout_or_the_option(stand_in, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(official_yoso, "DEVICES", ("cuda", "cpu"))
    assert run_kernels(stand_in, tmp_path) == 1  # an archive, no commit given
    printed = capsys.readouterr().out
    assert "not a git checkout of its own" in printed and "--official-yoso-commit" in printed
    assert run_kernels(tmp_path / "elsewhere", tmp_path, "--official-yoso-commit", "abc") == 1
    assert "is not a checkout of mlpen/YOSO" in capsys.readouterr().out
    git = ["git", "-C", str(stand_in), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "stand-in"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert official_yoso.checkout_commit(stand_in, None) == head
    assert official_yoso.checkout_commit(stand_in, "given") == "given"
    with pytest.raises(official_yoso.OfficialYOSOError, match="not a git checkout of its own"):
        official_yoso.checkout_commit(stand_in / official_yoso.YOSO_DIR, None)  # inside a repository is not one


def test_gpu_passes_the_checkout_to_the_kernels_step(stand_in, tmp_path, capsys):
    argv = ["--dry-run", "--steps", "kernels", "--out", str(tmp_path), "--official-yoso", str(stand_in)]
    assert gpu.main([*argv, "--official-yoso-commit", "abc123"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("[kernels]") and line.endswith(f"--official-yoso {stand_in.resolve()} --official-yoso-commit abc123")
    assert gpu.main(["--dry-run", "--steps", "kernels"]) == 0
    assert "--official-yoso" not in capsys.readouterr().out
    with pytest.raises(SystemExit):
        gpu.main([*argv[:-1], str(tmp_path / "missing")])
    assert "no such folder" in capsys.readouterr().err
