import os
import subprocess
import sys

import pytest
from tiny_listops import TINY


@pytest.fixture
def tiny_overrides():
    return list(TINY)


@pytest.fixture
def run_train(tmp_path):
    """Run ``python -m lra.train`` on the tiny ListOps with data and outputs under ``tmp_path``."""

    def run(*extra, flags=(), check=True, overrides=TINY, env=None):
        """``overrides``: the tiny settings (replace them to drop some); ``extra``: the test's own."""
        env = {**os.environ, "LRA_DATA_DIR": str(tmp_path / "data"), "LRA_OUTPUT_DIR": str(tmp_path / "outputs"), **(env or {})}
        process = subprocess.run(
            [sys.executable, "-m", "lra.train", *flags, *overrides, *extra],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if check and process.returncode != 0:
            raise AssertionError(f"lra.train failed:\n{process.stdout[-3000:]}\n{process.stderr[-3000:]}")
        return process

    return run
