"""Building the kernels: concurrent builds share one cache safely; no compiler means the reference."""

import os
import subprocess
import sys

import pytest

USE_OPS = (
    "import torch, attention_zoo; from yoso_cuda import ops; report = ops.kernels(); "
    "attn = attention_zoo.build('yoso', seq_len=64, num_heads=2, head_dim=16, num_hashes=4); "
    "out = attn(*(torch.randn(1, 2, 64, 16) for _ in range(3))); "
    "print('cpu kernels:', report.cpu.loaded, 'finite:', bool(torch.isfinite(out).all()))"
)


def run_python(code, env, **kwargs):
    return subprocess.Popen(
        [sys.executable, "-W", "always", "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs
    )


@pytest.mark.slow
def test_concurrent_processes_build_once_and_both_load(tmp_path):
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions"), "YOSO_KERNELS": "cpu"}
    processes = [run_python(USE_OPS, env) for _ in range(2)]
    outputs = [process.communicate(timeout=600) for process in processes]
    for process, (stdout, stderr) in zip(processes, outputs):
        assert process.returncode == 0, stderr[-2000:]
        assert "cpu kernels: True finite: True" in stdout
    libraries = list((tmp_path / "extensions").rglob("*.so"))
    assert len(libraries) == 1, libraries


@pytest.mark.slow
def test_without_a_compiler_import_works_and_yoso_runs_on_the_reference(tmp_path):
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions"), "YOSO_KERNELS": "cpu", "CXX": "/bin/false"}
    stdout, stderr = run_python(USE_OPS, env).communicate(timeout=300)
    assert "cpu kernels: False finite: True" in stdout, stderr[-2000:]
    assert stderr.count("YOSO's compiled kernels are unavailable") == 1
    assert "python -m yoso_cuda" in stderr
