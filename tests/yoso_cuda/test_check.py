"""``python -m yoso_cuda --check``: a verdict per op and device, and a failing exit on a mismatch."""

import os
import subprocess
import sys

import pytest
import torch

from yoso_cuda import check, ops, reference

OPS = [
    "hash_codes",
    "lsh_cumulation",
    "lsh_weighted_cumulation",
    "lsh_weighted_cumulation_both",
    "lsh_collided_gradient",
    "lsh_attention (forward)",
    "lsh_attention (backward, lower_bound)",
    "lsh_attention (backward, exact)",
]


def run_check(**variables):
    env = {**os.environ, **variables}
    return subprocess.run([sys.executable, "-m", "yoso_cuda", "--check"], env=env, capture_output=True, text=True, timeout=300)


def require_cpu_kernels():
    report = ops.kernels()
    if not report.cpu.loaded:
        pytest.skip(f"the CPU kernels are not built here: {report.cpu.reason}")


def test_check_passes_every_op_on_the_cpu_kernels():
    require_cpu_kernels()
    process = run_check()
    assert process.returncode == 0, process.stdout + process.stderr[-3000:]
    lines = process.stdout.splitlines()
    for op in OPS:
        (line,) = [line for line in lines if line.startswith(f"cpu   {op} ")]
        assert " PASS  " in line, line
    assert "check passed" in lines[-1]


def test_a_missing_kernel_library_fails_the_check():
    process = run_check(YOSO_KERNELS="0")
    assert process.returncode == 1
    assert "cpu   kernel library" in process.stdout
    assert "FAIL  not built, nothing to check: disabled by YOSO_KERNELS=0" in process.stdout
    assert "check FAILED" in process.stdout


def test_a_kernel_that_disagrees_with_the_reference_is_a_fail(monkeypatch):
    require_cpu_kernels()
    honest_cumulation, honest_hash = reference.lsh_cumulation, reference.hash_codes
    monkeypatch.setattr(reference, "lsh_cumulation", lambda *args: honest_cumulation(*args) * 1.01)
    monkeypatch.setattr(reference, "hash_codes", lambda *args: honest_hash(*args) ^ 1)  # flip bit 0 of every code

    def broken(*args):
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore lines")

    monkeypatch.setattr(reference, "lsh_weighted_cumulation", broken)
    verdicts = {verdict.op: verdict for verdict in check.check_device("cpu")}
    cumulation = verdicts["lsh_cumulation"]
    assert not cumulation.passed and "beyond the torch.float32 tolerance" in cumulation.failure
    assert cumulation.line().startswith("cpu   lsh_cumulation ") and " FAIL  " in cumulation.line()
    hashing = verdicts["hash_codes"]
    assert not hashing.passed and hashing.differing_codes == hashing.total_codes > 0
    raised = verdicts["lsh_weighted_cumulation"]
    assert not raised.passed and raised.failure.endswith(
        "raised RuntimeError: CUDA error: an illegal memory access was encountered"
    )
    assert verdicts["lsh_collided_gradient"].passed, verdicts["lsh_collided_gradient"].line()


def test_the_inputs_cover_padding_and_every_dtype():
    c = check.make_inputs(7, 5, 32, 3, torch.bfloat16, "cpu")
    assert c["values"].dtype == torch.bfloat16 and c["signs"].dtype == torch.float32
    assert c["query_mask"][0].any() and not c["query_mask"][1, 4:].any() and not c["query_mask"][2].any()
    assert c["query_codes"].shape == (3, 7, check.NUM_HASHES) and c["key_codes"].max() < 2**3
    assert any(tau == 1 for *_, tau in check.CASES) and any(nq == 1 for nq, *_ in check.CASES)
    assert any(nq != nk for nq, nk, *_ in check.CASES) and any(nq % 2 for nq, *_ in check.CASES)
